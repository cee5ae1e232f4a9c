/* Status codes shared by every kernel in csrc/.
 *
 * Kernels never raise and never allocate on behalf of Python: they return one of
 * these; ztensor/_native/_kernels.pyx exports the numbers (STATUS_CODES) and
 * ztensor/_native/status.py maps each to an exception class in one table, which a test
 * checks against this header's values.  Keep the numbers stable.
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
    ZT_E_NOMEM = 8,                /* malloc failed */
    ZT_E_CBOR_MALFORMED = 9,       /* manifest bytes are not well-formed CBOR */
    ZT_E_CBOR_TAG = 10,            /* a CBOR tag manifests may not use */
    ZT_E_CBOR_DEPTH = 11,          /* CBOR nesting deeper than the caller's limit */
    ZT_E_CBOR_KEY = 12,            /* a CBOR map key that is not a text string */
    ZT_E_GROUP_INDEX = 13          /* a g_idx value outside [0, G) */
} zt_status;

#endif
