# cdef extern declarations of the plain-C kernels in csrc/.
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t

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
        ZT_E_CBOR_MALFORMED
        ZT_E_CBOR_TAG
        ZT_E_CBOR_DEPTH
        ZT_E_CBOR_KEY
        ZT_E_GROUP_INDEX

cdef extern from "footer.h":
    enum: ZT_MAGIC_LEN
    enum: ZT_TAIL_LEN
    enum: ZT_FAMILY_V0
    enum: ZT_FAMILY_V1
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

cdef extern from "zstd_frames.h":
    zt_status zt_zstd_frames(const void *p, size_t n, int *verdict, size_t *at,
                             size_t *frames) nogil

cdef extern from "copy.h":
    enum: ZT_COPY_STREAM_BYTES
    zt_status zt_copy(const void *src, void *dst, size_t n) nogil

cdef extern from "residency.h":
    int zt_range_resident(const void *addr, size_t len) nogil

cdef extern from "crc32c.h":
    void zt_crc32c_init()
    uint32_t zt_crc32c_update(uint32_t crc, const void *data, size_t len) nogil
    uint32_t zt_crc32c_update_sw(uint32_t crc, const void *data, size_t len) nogil
    int zt_crc32c_hardware()

cdef extern from "blobwrite.h":
    enum: ZT_BW_EXTENT
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
    int zt_reserve_ahead(int fd, uint64_t len) nogil

cdef extern from "floatconv.h":
    ctypedef enum zt_fp8_kind:
        ZT_FP8_E4M3FN
        ZT_FP8_E5M2
        ZT_FP8_E4M3FNUZ
        ZT_FP8_E5M2FNUZ
    ctypedef enum zt_float_type:
        ZT_F32
        ZT_F16
        ZT_BF16
    void zt_floatconv_init()
    zt_status zt_fp8_decode(const uint8_t *src, void *dst, size_t n, int kind, int dst_type) nogil
    zt_status zt_fp8_encode(const void *src, uint8_t *dst, size_t n, int kind, int src_type) nogil
    void zt_bf16_decode(const uint16_t *src, float *dst, size_t n) nogil
    void zt_bf16_encode(const float *src, uint16_t *dst, size_t n) nogil

cdef extern from "quant.h":
    enum: ZT_ZERO_NONE
    enum: ZT_ZERO_PACKED_V1
    enum: ZT_ZERO_PACKED_V2
    ctypedef struct zt_dequant_args:
        const uint8_t *qweight
        const uint8_t *scales
        const uint8_t *zeros
        const uint8_t *g_idx
        size_t K, N, G, group_size
        int bits, scale_type, zero_type, out_type
        void *out
    zt_status zt_dequant_rows(const zt_dequant_args *a, size_t row_begin, size_t row_end) nogil
    zt_status zt_unpack_codes(const uint8_t *words, size_t count, int bits, uint8_t *out) nogil

cdef extern from "cbor_scan.h":
    ctypedef struct zt_cbor_scan_result:
        size_t end
        size_t items
        size_t depth
        uint64_t tag
        const char *why
    zt_status zt_cbor_scan(const uint8_t *buf, size_t len, size_t max_depth,
                           zt_cbor_scan_result *out) nogil

cdef extern from "cbor_canonical.h":
    zt_status zt_cbor_check_canonical(const uint8_t *buf, size_t len, size_t max_depth,
                                      zt_cbor_scan_result *out) nogil

cdef extern from "xxh3.h":
    uint64_t zt_xxh3_64(const uint8_t *data, size_t len) nogil

cdef extern from "manifest_scan.h":
    ctypedef struct zt_vocab:
        const char *words
        size_t count
    ctypedef struct zt_mf_config:
        zt_vocab formats, dtypes, types, encodings, roles
        size_t max_depth
        size_t max_components
        int text_checked
    ctypedef struct zt_mf_result:
        int fast
        int full
        const char *why
        size_t pos
        uint64_t version_off, version_len
        uint64_t attrs_off, attrs_len
        size_t nobjects, ncomponents, ndims
    int ZT_MF_OBJECT_FIELDS
    int ZT_MF_COMPONENT_FIELDS
    uint64_t ZT_MF_NONE
    # one table row as the scanner fills it: field f is column f of the tables
    ctypedef struct zt_mf_object:
        uint64_t name_off, name_len, format, attrs_off, attrs_len, dims_start, rank
        uint64_t comps_start, ncomps, numel, extent_ok
    ctypedef struct zt_mf_component:
        uint64_t role_off, role_len, role, dtype
        uint64_t type_ "type"
        uint64_t offset, length, encoding, ulen, digest_off, digest_len
        uint64_t object_ "object"
    zt_status zt_manifest_scan(const uint8_t *buf, size_t len, const zt_mf_config *config,
                               uint64_t *objects, size_t cap_objects,
                               uint64_t *components, size_t cap_components,
                               uint64_t *dims, size_t cap_dims, zt_mf_result *out) nogil

cdef extern from "zt_simd.h":
    int zt_use_avx2()
    int zt_simd_enable(int on)

cdef extern from "manifest_encode.h":
    ctypedef struct zt_mf_encode_args:
        size_t count
        const uint8_t *names
        const uint64_t *name_len
        const uint8_t *plain
        const uint64_t *rank
        const uint64_t *dims
        const uint64_t *dtype
        const uint64_t *offset
        const uint64_t *length
        const uint8_t *pre
        const uint64_t *pre_len
        zt_vocab dtypes
    zt_status zt_manifest_encode(const zt_mf_encode_args *a, uint8_t *out, size_t cap,
                                 size_t *written) nogil

cdef extern from "ggml_blocks.h":
    size_t zt_ggml_block_elements(int type)
    size_t zt_ggml_block_bytes(int type)
    zt_status zt_ggml_dequant(int type, const uint8_t *blocks, size_t nblocks, float *out) nogil
