/* Shared library loaded with dlopen at run time; built without frame pointers. */
__attribute__((noipa)) unsigned long lib_hot_function(unsigned long n, unsigned long seed)
{
    for (unsigned long i = 0; i < n; i++) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        seed ^= seed >> 29;
    }
    return seed;
}
