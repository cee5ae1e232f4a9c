# cdef extern declarations of the plain-C kernels in csrc/.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef extern from "zt_status.h":
    ctypedef enum zt_status:
        ZT_OK
        ZT_E_ARG
        ZT_E_TRUNCATED
        ZT_E_BAD_MAGIC
        ZT_E_BAD_FOOTER_MAGIC
        ZT_E_MANIFEST_TOO_LARGE
        ZT_E_MANIFEST_OUT_OF_BOUNDS
        ZT_E_IO
        ZT_E_NOMEM

cdef extern from "footer.h":
    ctypedef struct zt_footer:
        int family
        uint64_t manifest_offset
        uint64_t manifest_size
        uint64_t data_end
    zt_status zt_footer_parse(const uint8_t *head, size_t head_len, const uint8_t *tail,
                              size_t tail_len, uint64_t file_size, uint64_t max_manifest,
                              zt_footer *out) nogil

cdef extern from "byteswap.h":
    zt_status zt_bswap(const void *src, void *dst, size_t count, size_t width) nogil

cdef extern from "crc32c.h":
    void zt_crc32c_init()
    uint32_t zt_crc32c_update(uint32_t crc, const void *data, size_t len) nogil
    uint32_t zt_crc32c_update_sw(uint32_t crc, const void *data, size_t len) nogil
    int zt_crc32c_hardware()

cdef extern from "blobwrite.h":
    ctypedef struct zt_blobwriter:
        int fd
        uint64_t pos
        size_t used
        int err
    zt_status zt_bw_init(zt_blobwriter *bw, int fd, uint64_t pos, size_t cap)
    zt_status zt_bw_pad(zt_blobwriter *bw, uint64_t alignment) nogil
    zt_status zt_bw_write(zt_blobwriter *bw, const void *data, size_t len) nogil
    zt_status zt_bw_flush(zt_blobwriter *bw) nogil
    void zt_bw_free(zt_blobwriter *bw)
