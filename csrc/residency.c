/* zt_range_resident: mincore(2) over a range, in pieces of 4096 pages (a 4 KiB vector on
 * the stack), stopping at the first page that is not resident. */
#if defined(__linux__)
#define _DEFAULT_SOURCE /* mincore is not in C99's or POSIX's base namespace */
#endif
#include "residency.h"

#include <stdint.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define ZT_HAVE_MINCORE 1
#endif

int zt_range_resident(const void *addr, size_t len) {
#ifdef ZT_HAVE_MINCORE
    unsigned char vec[4096];
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || (page & (page - 1)) != 0)
        return -1;
    uintptr_t start = (uintptr_t)addr & ~((uintptr_t)page - 1);
    uintptr_t end = (uintptr_t)addr + len;
    if (end < (uintptr_t)addr)
        return -1; /* the range wraps: not a mapping */
    while (start < end) {
        size_t pages = (size_t)((end - start + (uintptr_t)page - 1) / (uintptr_t)page);
        if (pages > sizeof vec)
            pages = sizeof vec;
        /* the vector's type is unsigned char * on Linux, char * on macOS and the BSDs */
        if (mincore((void *)start, pages * (size_t)page, (void *)vec) != 0)
            return -1;
        for (size_t i = 0; i < pages; i++)
            if (!(vec[i] & 1))
                return 0;
        start += pages * (uintptr_t)page;
    }
    return 1;
#else
    (void)addr;
    (void)len;
    return -1;
#endif
}
