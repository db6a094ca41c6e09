/* The command the Wine smoke test (scripts/wine-smoke.sh) gives `record`: `launched.exe FILE
 * SECS` creates FILE as soon as it runs, then sleeps SECS seconds. A recording that cannot
 * start must end it before it ran: FILE absent, no process left. */
#include <stdio.h>
#include <stdlib.h>
#include <windows.h>

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: launched.exe FILE SECS\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f)
        return 3;
    fclose(f);
    Sleep((DWORD)atoi(argv[2]) * 1000);
    return 0;
}
