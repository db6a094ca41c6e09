/* bcryptprimitives.dll for Wine 8, which has none: Rust's std imports ProcessPrng from it
 * (Windows 10 and later) and its programs do not start without it. ProcessPrng fills the
 * buffer from advapi32's SystemFunction036 (RtlGenRandom), which Wine has. Built with
 * `x86_64-w64-mingw32-gcc -shared -o bcryptprimitives.dll bcryptprimitives.c -ladvapi32`
 * and put beside the program; only the Wine smoke test (scripts/wine-smoke.sh) uses it. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    /* SystemFunction036 takes a 32-bit length. */
    while (length > 0) {
        ULONG part = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, part))
            return FALSE;
        data += part;
        length -= part;
    }
    return TRUE;
}
