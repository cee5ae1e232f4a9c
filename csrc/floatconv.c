/* FP8 / bf16 / f16 conversions.  See floatconv.h for the semantics.
 *
 * FP8 -> f32 is branch-free arithmetic on the bits (place exponent and mantissa,
 * rebias; subnormals through one float subtraction; NaN/inf by select), so GCC
 * and Clang vectorize it at -O3; an AVX2 clone is picked at run time on x86-64.
 * No arithmetic on subnormal floats happens on that path (x86 takes microcode
 * assists on those).
 */
#include <math.h>
#include <string.h>
#include "floatconv.h"
#include "zt_simd.h"


static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ------------------------------------------------------------------ f16 */
float zt_f16_to_f32(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fff) << 13;
    uint32_t exp = o & (0x7c00u << 13);
    o += (127 - 15) << 23;
    if (exp == (0x7c00u << 13)) {
        o += (128 - 16) << 23;                    /* inf / NaN */
    } else if (exp == 0) {
        o += 1 << 23;                             /* zero / subnormal */
        o = f2u(u2f(o) - u2f(113u << 23));
    }
    return u2f(o | ((uint32_t)(h & 0x8000) << 16));
}

/* all ones when cond holds, else zero: selects as masks keep the loops branch-free */
static inline uint32_t mask_if(int cond) { return 0u - (uint32_t)(cond != 0); }
static inline uint32_t pick(uint32_t m, uint32_t yes, uint32_t no) { return (yes & m) | (no & ~m); }

/* Round to nearest even.  All three cases are computed and one is picked, so loops
 * calling this vectorize; none of them does arithmetic on subnormal floats unless
 * the input itself is one. */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x = f2u(f);
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    const uint32_t magic = ((127u - 15) + (23 - 10) + 1) << 23;
    uint32_t special = x > 0x7f800000u ? 0x7e00u : 0x7c00u;        /* NaN / overflow, inf */
    uint32_t sub = f2u(u2f(x) + u2f(magic)) - magic;               /* the addition rounds */
    uint32_t normal = (x + ((uint32_t)(15 - 127) << 23) + 0xfff + ((x >> 13) & 1)) >> 13;
    uint32_t o = pick(mask_if(x < (113u << 23)), sub, normal);
    o = pick(mask_if(x >= ((127u + 16) << 23)), special, o);
    return (uint16_t)(o | (sign >> 16));
}

uint16_t zt_f32_to_f16(float f) { return f32_to_f16(f); }

/* The inline body, not the exported function: each clone (zt_simd.h) must be able
 * to inline and vectorize it (measured: the out-of-line call was 11% of int4 ->
 * f16 dequantization). */
ZT_CLONES
void zt_f32_to_f16_array(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

/* ------------------------------------------------------------------ bf16 */
uint16_t zt_f32_to_bf16(float f) {
    uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) & 0x8000) | 0x7fc0;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

ZT_CLONES
void zt_bf16_decode(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = u2f((uint32_t)src[i] << 16);
}

ZT_CLONES
void zt_bf16_encode(const float *src, uint16_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = zt_f32_to_bf16(src[i]);
}

/* ------------------------------------------------------------------ FP8 formats */
typedef struct {
    int mbits, bias;
    int has_inf;        /* e5m2 */
    int uz;             /* fnuz: 0x80 is the only NaN, no -0 */
    uint8_t max_code;   /* largest finite magnitude code */
    uint8_t nan_code;   /* magnitude of the NaN written for this sign (fnuz: 0x80 total) */
} fp8_format;

static const fp8_format FORMATS[4] = {
    {3, 7, 0, 0, 0x7e, 0x7f},   /* e4m3fn */
    {2, 15, 1, 0, 0x7b, 0x7e},  /* e5m2 */
    {3, 8, 0, 1, 0x7f, 0x80},   /* e4m3fnuz */
    {2, 16, 0, 1, 0x7f, 0x80},  /* e5m2fnuz */
};

/* One FP8 code -> f32 bits, with no branches, so the loops below vectorize. */
static inline uint32_t fp8_bits(uint32_t b, int mbits, int bias, int kind) {
    uint32_t mag = b & 0x7f;
    uint32_t sign = (b & 0x80) << 24;
    uint32_t placed = mag << (23 - mbits);
    uint32_t rebias = (uint32_t)(127 - bias) << 23;
    uint32_t normal = placed + rebias;
    /* exponent field 0: m * 2^(1-bias-mbits) = (1.m at 2^(1-bias)) - 2^(1-bias), exactly */
    uint32_t sub = f2u(u2f(placed + rebias + (1u << 23)) - u2f((uint32_t)(128 - bias) << 23));
    uint32_t bits = pick(mask_if((mag >> mbits) == 0), sub, normal);
    if (kind == ZT_FP8_E4M3FN) bits = pick(mask_if(mag == 0x7f), 0x7fc00000u, bits);
    if (kind == ZT_FP8_E5M2) {
        bits = pick(mask_if(mag == 0x7c), 0x7f800000u, bits);
        bits = pick(mask_if(mag > 0x7c), 0x7fc00000u, bits);
    }
    if (kind == ZT_FP8_E4M3FNUZ || kind == ZT_FP8_E5M2FNUZ)
        bits = pick(mask_if(b == 0x80), 0x7fc00000u, bits);
    return bits | sign;
}

#define FP8_DECODER(name, kind, mbits, bias)                                   \
    ZT_CLONES static void name(const uint8_t *src, float *dst, size_t n) {    \
        for (size_t i = 0; i < n; i++) dst[i] = u2f(fp8_bits(src[i], mbits, bias, kind)); \
    }
FP8_DECODER(decode_e4m3fn, ZT_FP8_E4M3FN, 3, 7)
FP8_DECODER(decode_e5m2, ZT_FP8_E5M2, 2, 15)
FP8_DECODER(decode_e4m3fnuz, ZT_FP8_E4M3FNUZ, 3, 8)
FP8_DECODER(decode_e5m2fnuz, ZT_FP8_E5M2FNUZ, 2, 16)

static uint16_t f16_table[4][256];

void zt_floatconv_init(void) {
    uint8_t codes[256];
    float values[256];
    for (int i = 0; i < 256; i++) codes[i] = (uint8_t)i;
    void (*decoders[4])(const uint8_t *, float *, size_t) = {
        decode_e4m3fn, decode_e5m2, decode_e4m3fnuz, decode_e5m2fnuz};
    for (int k = 0; k < 4; k++) {
        decoders[k](codes, values, 256);
        for (int i = 0; i < 256; i++) f16_table[k][i] = zt_f32_to_f16(values[i]); /* exact */
    }
}

/* f32 -> FP8 code, round to nearest even, ml_dtypes' overflow/NaN rules. */
static uint8_t fp8_from_f32(float f, const fp8_format *fmt) {
    uint32_t x = f2u(f);
    uint32_t sign = (x >> 24) & 0x80;
    uint32_t a = x & 0x7fffffffu;
    uint32_t nan = fmt->uz ? 0x80 : (sign | fmt->nan_code);
    if (a > 0x7f800000u) return (uint8_t)nan;
    uint32_t overflow = fmt->has_inf ? (sign | 0x7c) : nan;
    if (a == 0x7f800000u) return (uint8_t)overflow;
    uint32_t code;
    if ((int)(a >> 23) >= 128 - fmt->bias) {            /* normal in FP8 before rounding */
        uint32_t drop = (uint32_t)(23 - fmt->mbits);
        uint32_t r = a - ((uint32_t)(127 - fmt->bias) << 23);
        code = (r + ((1u << (drop - 1)) - 1) + ((r >> drop) & 1)) >> drop;
    } else {                                             /* FP8 subnormal or zero */
        float scaled = u2f(a) * ldexpf(1.0f, fmt->bias - 1 + fmt->mbits);  /* exact */
        code = (uint32_t)rintf(scaled);                  /* default mode: nearest even */
    }
    if (code > fmt->max_code) return (uint8_t)overflow;
    if (code == 0 && fmt->uz) return 0;                  /* fnuz has no negative zero */
    return (uint8_t)(code | sign);
}

zt_status zt_fp8_decode(const uint8_t *src, void *dst, size_t n, int kind, int dst_type) {
    if (kind < 0 || kind > 3 || (n && (src == NULL || dst == NULL))) return ZT_E_ARG;
    if (dst_type == ZT_F16) {
        const uint16_t *t = f16_table[kind];
        uint16_t *d = (uint16_t *)dst;
        for (size_t i = 0; i < n; i++) d[i] = t[src[i]];
        return ZT_OK;
    }
    if (dst_type != ZT_F32) return ZT_E_ARG;
    float *d = (float *)dst;
    switch (kind) {
    case ZT_FP8_E4M3FN: decode_e4m3fn(src, d, n); break;
    case ZT_FP8_E5M2: decode_e5m2(src, d, n); break;
    case ZT_FP8_E4M3FNUZ: decode_e4m3fnuz(src, d, n); break;
    default: decode_e5m2fnuz(src, d, n); break;
    }
    return ZT_OK;
}

zt_status zt_fp8_encode(const void *src, uint8_t *dst, size_t n, int kind, int src_type) {
    if (kind < 0 || kind > 3 || (n && (src == NULL || dst == NULL))) return ZT_E_ARG;
    const fp8_format *fmt = &FORMATS[kind];
    if (src_type == ZT_F32) {
        const float *s = (const float *)src;
        for (size_t i = 0; i < n; i++) dst[i] = fp8_from_f32(s[i], fmt);
    } else if (src_type == ZT_F16) {
        const uint16_t *s = (const uint16_t *)src;   /* f16 -> f32 is exact */
        for (size_t i = 0; i < n; i++) dst[i] = fp8_from_f32(zt_f16_to_f32(s[i]), fmt);
    } else {
        return ZT_E_ARG;
    }
    return ZT_OK;
}
