/* Group-quantized (GPTQ-style) unpacking and dequantization.  See quant.c. */
#ifndef ZT_QUANT_H
#define ZT_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

/* zero points: none (symmetric, 2^(bits-1)), unpacked floats [G, N] of a
 * zt_float_type, or GPTQ's packed int32 qzeros [G, N*bits/32], LSB-first along N */
enum { ZT_ZERO_NONE = 16, ZT_ZERO_PACKED_V1 = 17, ZT_ZERO_PACKED_V2 = 18 };

typedef struct {
    const uint8_t *qweight;  /* [K*bits/32, N] int32 words, little-endian: per column, one
                              * LSB-first bit stream of codes along K (quant.c) */
    const uint8_t *scales;   /* [G, N] of scale_type, little-endian */
    const uint8_t *zeros;    /* see zero_type; NULL for ZT_ZERO_NONE */
    const uint8_t *g_idx;    /* [K] int32 little-endian, each in [0, G); NULL: k / group_size */
    size_t K, N, G, group_size;
    int bits;                /* 2, 3, 4 or 8; K (and N for packed zeros) a multiple of
                              * 32 / bits, or of 32 for 3 bits */
    int scale_type;          /* ZT_F32, ZT_F16 or ZT_BF16 */
    int zero_type;           /* ZT_ZERO_NONE, ZT_F32/F16/BF16, ZT_ZERO_PACKED_V1/V2 */
    int out_type;            /* ZT_F32, ZT_F16 or ZT_BF16 */
    void *out;               /* [N, K], row-major */
} zt_dequant_args;

/* Dequantize output rows [row_begin, row_end): W[n, k] = s[g, n] * (code(k, n) - z[g, n]).
 * The caller has checked every size against every other and every g_idx value;
 * disjoint row ranges may run in parallel. */
zt_status zt_dequant_rows(const zt_dequant_args *a, size_t row_begin, size_t row_end);

/* Unpack count codes of `bits` bits (2, 3, 4, 8) from an LSB-first stream of
 * little-endian 32-bit words holding at least count * bits bits. */
zt_status zt_unpack_codes(const uint8_t *words, size_t count, int bits, uint8_t *out);

#endif
