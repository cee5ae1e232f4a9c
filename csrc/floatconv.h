/* Float format conversions: FP8 (four variants), bf16 and f16 <-> f32.
 *
 * Semantics match ml_dtypes' astype bit for bit: round to nearest even; on
 * overflow e5m2 gives infinity and the fn/fnuz types give NaN; NaN inputs give the
 * format's canonical NaN with the input's sign (fnuz: 0x80); fnuz has no -0.
 * Decoding NaN codes gives the quiet NaN 0x7fc00000 with the code's sign (fnuz
 * 0x80 decodes to -NaN, as ml_dtypes does).
 */
#ifndef ZT_FLOATCONV_H
#define ZT_FLOATCONV_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

typedef enum { ZT_FP8_E4M3FN = 0, ZT_FP8_E5M2 = 1, ZT_FP8_E4M3FNUZ = 2, ZT_FP8_E5M2FNUZ = 3 } zt_fp8_kind;
typedef enum { ZT_F32 = 0, ZT_F16 = 1, ZT_BF16 = 2 } zt_float_type;

/* Build the FP8 -> f16 tables.  Call once before the functions below. */
void zt_floatconv_init(void);

/* FP8 codes -> float32 (dst_type ZT_F32) or float16 bits (ZT_F16). */
zt_status zt_fp8_decode(const uint8_t *src, void *dst, size_t n, int kind, int dst_type);
/* float32 (src_type ZT_F32) or float16 bits (ZT_F16) -> FP8 codes. */
zt_status zt_fp8_encode(const void *src, uint8_t *dst, size_t n, int kind, int src_type);

/* bf16 bits -> float32, and float32 -> bf16 bits (round to nearest even). */
void zt_bf16_decode(const uint16_t *src, float *dst, size_t n);
void zt_bf16_encode(const float *src, uint16_t *dst, size_t n);

/* float32 -> float16 bits for n values (round to nearest even). */
void zt_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);

/* Scalar helpers shared with quant.c. */
float zt_f16_to_f32(uint16_t h);
uint16_t zt_f32_to_f16(float f);
uint16_t zt_f32_to_bf16(float f);

#endif
