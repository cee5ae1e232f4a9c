/* Status codes shared by every kernel in csrc/.
 *
 * Kernels never raise and never allocate on behalf of Python: they return one of
 * these, and ztensor/_kernels.pyx maps each to an exception class in one table.
 * Keep the numbers stable; _kernels.pyx mirrors them.
 */
#ifndef ZT_STATUS_H
#define ZT_STATUS_H

typedef enum {
    ZT_OK = 0,
    ZT_E_ARG = 1,                  /* a caller broke the kernel's contract */
    ZT_E_TRUNCATED = 2,            /* file too short to hold header and footer */
    ZT_E_BAD_MAGIC = 3,            /* header magic is not a known zTensor magic */
    ZT_E_BAD_FOOTER_MAGIC = 4,     /* v1 footer magic missing: truncated or not .zt */
    ZT_E_MANIFEST_TOO_LARGE = 5,   /* manifest_size above the caller's limit */
    ZT_E_MANIFEST_OUT_OF_BOUNDS = 6, /* manifest_size larger than the file allows */
    ZT_E_IO = 7,                   /* write(2) failed; errno is kept by the caller */
    ZT_E_NOMEM = 8                 /* malloc failed */
} zt_status;

#endif
