/* Group-quantized dequantization.
 *
 * Layout (docs/quantized_group.md): codes are packed along K as one LSB-first bit
 * stream over int32 words stored little-endian: code k of a column occupies bits
 * [bits*k, bits*k + bits) of the stream, word i holding bits [32i, 32i + 32).  For 2,
 * 4 and 8 bits that is code(k, n) = (word[k / P][n] >> (bits * (k % P))) & mask with
 * P = 32 / bits; 3-bit codes (AutoGPTQ's layout) cross word boundaries: 32 codes fill
 * 3 words.  Each output row n reads column n of the packed words; a small
 * table per (row, group) holds the 2^bits possible outputs already converted to
 * the output type, so the inner loop is shift, mask, load, store (for 8-bit codes,
 * and for groups smaller than a table, the table would cost more than it saves,
 * so values are computed).
 */
#include <stdlib.h>
#include <string.h>
#include "floatconv.h"
#include "quant.h"
#include "zt_simd.h"
#include "zt_endian.h"

static inline float load_float(const uint8_t *base, size_t i, int type) {
    if (type == ZT_F32) {
        uint32_t u = zt_load_le32(base + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    uint16_t h = (uint16_t)(base[2 * i] | (base[2 * i + 1] << 8));
    if (type == ZT_F16) return zt_f16_to_f32(h);
    uint32_t u = (uint32_t)h << 16;   /* bf16 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Codes per block and int32 words per block: a block is the shortest run of codes
 * that fills whole words (8 codes in 1 word for 4 bits; 32 codes in 3 words for 3). */
static size_t block_codes(int bits) { return bits == 3 ? 32 : 32 / (size_t)bits; }
static size_t block_words(int bits) { return bits == 3 ? 3 : 1; }
static size_t stream_words(size_t codes, int bits) {
    return codes / block_codes(bits) * block_words(bits);
}

/* Code i of an LSB-first stream of host-order words; a code may straddle two words
 * (3 bits only; then the next word exists, as the stream holds whole blocks). */
static inline uint32_t stream_code(const uint32_t *words, size_t i, int bits) {
    const size_t bit = i * (size_t)bits, w = bit >> 5;
    const unsigned shift = (unsigned)(bit & 31);
    uint64_t v = words[w] >> shift;
    if (shift + (unsigned)bits > 32) v |= (uint64_t)words[w + 1] << (32 - shift);
    return (uint32_t)v & ((1u << bits) - 1);
}

/* The same over little-endian words in memory. */
static inline uint32_t stream_code_le(const uint8_t *words, size_t i, int bits) {
    const size_t bit = i * (size_t)bits, w = bit >> 5;
    const unsigned shift = (unsigned)(bit & 31);
    uint64_t v = zt_load_le32(words + 4 * w) >> shift;
    if (shift + (unsigned)bits > 32) v |= (uint64_t)zt_load_le32(words + 4 * (w + 1)) << (32 - shift);
    return (uint32_t)v & ((1u << bits) - 1);
}

static float zero_point(const zt_dequant_args *a, size_t g, size_t n) {
    switch (a->zero_type) {
    case ZT_ZERO_NONE:
        return (float)(1 << (a->bits - 1));
    case ZT_ZERO_PACKED_V1:
    case ZT_ZERO_PACKED_V2: {
        const uint32_t mask = (1u << a->bits) - 1;
        const uint32_t z = stream_code_le(a->zeros + 4 * g * stream_words(a->N, a->bits), n,
                                          a->bits);
        /* v1 stores zero - 1; AutoGPTQ decodes (stored + 1) & mask, so a zero of 0
         * (stored as all ones after the wrap) comes back as 0 */
        return (float)(a->zero_type == ZT_ZERO_PACKED_V1 ? (z + 1) & mask : z);
    }
    default:
        return load_float(a->zeros, g * a->N + n, a->zero_type);
    }
}

static inline void put(void *out, size_t i, float v, int type) {
    if (type == ZT_F32) ((float *)out)[i] = v;
    else if (type == ZT_F16) ((uint16_t *)out)[i] = zt_f32_to_f16(v);
    else ((uint16_t *)out)[i] = zt_f32_to_bf16(v);
}

static inline size_t group_of(const zt_dequant_args *a, size_t k) {
    return a->g_idx ? (size_t)zt_load_le32(a->g_idx + 4 * k) : k / a->group_size;
}

enum { TILE = 16 };  /* output rows done together: one cache line of packed words */

/* The tile's packed words, transposed so each row's words are contiguous: rows
 * then stream their output in one run.  (Walking a column of the [K/P, N] words
 * directly puts every output row of a tile 4*K bytes apart, the same L1 set when K
 * is a power of two: measured 2.2 vs 8+ GB/s.)  The row stride is padded for the
 * same reason. */
static size_t tile_stride(size_t words_per_row) { return words_per_row + 16; }

static void transpose_tile(const zt_dequant_args *a, size_t n0, size_t rows, uint32_t *tw) {
    const size_t nw = stream_words(a->K, a->bits), stride = tile_stride(nw);
    for (size_t kw = 0; kw < nw; kw++) {
        const uint8_t *words = a->qweight + 4 * (kw * a->N + n0);
        for (size_t t = 0; t < rows; t++) tw[t * stride + kw] = zt_load_le32(words + 4 * t);
    }
}

/* Table path (bits <= 4): lut[g * L + code] is the finished output value of `code`
 * in group g of this row.  One function per (output width, bits), so the inner loop
 * has constant shifts and unrolls. */
#define LUT_ROW(T, BITS)                                                                   \
    static void lut_row_##T##_##BITS(const zt_dequant_args *a, const uint32_t *words,     \
                                     const T *lut, T *out) {                              \
        enum { PER = 32 / BITS, L = 1 << BITS };                                          \
        const size_t nw = a->K / PER;                                                     \
        if (a->g_idx == NULL && a->group_size % PER == 0) {                               \
            /* a group spans whole words: walk group by group, no division per word */   \
            const size_t wpg = a->group_size / PER;                                       \
            for (size_t kw = 0, g = 0; kw < nw; g++) {                                    \
                const T *l = lut + g * L;                                                 \
                for (size_t end = kw + wpg < nw ? kw + wpg : nw; kw < end; kw++) {        \
                    const uint32_t w = words[kw];                                         \
                    T *o = out + kw * PER;                                                \
                    for (int j = 0; j < PER; j++) o[j] = l[(w >> (BITS * j)) & (L - 1)];  \
                }                                                                         \
            }                                                                             \
            return;                                                                       \
        }                                                                                 \
        for (size_t kw = 0; kw < nw; kw++) {                                              \
            const uint32_t w = words[kw];                                                 \
            for (int j = 0; j < PER; j++) {                                               \
                size_t k = kw * PER + (size_t)j;                                          \
                out[k] = lut[group_of(a, k) * L + ((w >> (BITS * j)) & (L - 1))];         \
            }                                                                             \
        }                                                                                 \
    }
typedef float f32;
typedef uint16_t u16;
LUT_ROW(f32, 2)
LUT_ROW(f32, 4)
LUT_ROW(u16, 2)
LUT_ROW(u16, 4)

/* 3-bit codes straddle words, so the table row walks the stream code by code. */
#define LUT_ROW_3(T)                                                                      \
    static void lut_row_##T##_3(const zt_dequant_args *a, const uint32_t *words,          \
                                const T *lut, T *out) {                                   \
        size_t g = 0, left = a->group_size;                                               \
        for (size_t k = 0; k < a->K; k++) {                                               \
            const size_t gk = a->g_idx ? group_of(a, k) : g;                              \
            out[k] = lut[gk * 8 + stream_code(words, k, 3)];                              \
            if (--left == 0) {                                                            \
                g++;                                                                      \
                left = a->group_size;                                                     \
            }                                                                             \
        }                                                                                 \
    }
LUT_ROW_3(f32)
LUT_ROW_3(u16)

#ifdef ZT_X86_AVX2
#include <immintrin.h>

/* lut_row_u16_4 for groups of whole words, with AVX2: a 4-bit code is exactly a
 * pshufb index, so a group's 16-entry table of 16-bit outputs becomes two 16-byte
 * shuffle tables (low bytes, high bytes) and 64 codes are looked up per step.  The
 * outputs are the table's values, so the result is bit-identical to the portable
 * loop (a test compares them on the same machine). */
ZT_TARGET_AVX2
static void lut_row_u16_4_avx2(const zt_dequant_args *a, const uint32_t *words,
                               const uint16_t *lut, uint16_t *out) {
    const size_t nw = a->K / 8, wpg = a->group_size / 8;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (size_t kw = 0, g = 0; kw < nw; g++) {
        const uint16_t *l = lut + g * 16;
        const __m128i e0 = _mm_loadu_si128((const __m128i *)l);
        const __m128i e1 = _mm_loadu_si128((const __m128i *)(l + 8));
        const __m128i m = _mm_set1_epi16(0x00FF);
        const __m256i tlo = _mm256_broadcastsi128_si256(
            _mm_packus_epi16(_mm_and_si128(e0, m), _mm_and_si128(e1, m)));
        const __m256i thi = _mm256_broadcastsi128_si256(
            _mm_packus_epi16(_mm_srli_epi16(e0, 8), _mm_srli_epi16(e1, 8)));
        const size_t end = kw + wpg < nw ? kw + wpg : nw;
        for (; kw + 8 <= end; kw += 8) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(words + kw));
            const __m256i lo = _mm256_and_si256(x, nibble);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nibble);
            /* codes in order: per lane, byte b holds codes 2b (low) and 2b+1 (high) */
            const __m256i ia = _mm256_unpacklo_epi8(lo, hi);  /* codes 0-15 | 32-47 */
            const __m256i ib = _mm256_unpackhi_epi8(lo, hi);  /* codes 16-31 | 48-63 */
            const __m256i alo = _mm256_shuffle_epi8(tlo, ia), ahi = _mm256_shuffle_epi8(thi, ia);
            const __m256i blo = _mm256_shuffle_epi8(tlo, ib), bhi = _mm256_shuffle_epi8(thi, ib);
            const __m256i a0 = _mm256_unpacklo_epi8(alo, ahi);  /* 0-7 | 32-39 */
            const __m256i a1 = _mm256_unpackhi_epi8(alo, ahi);  /* 8-15 | 40-47 */
            const __m256i b0 = _mm256_unpacklo_epi8(blo, bhi);  /* 16-23 | 48-55 */
            const __m256i b1 = _mm256_unpackhi_epi8(blo, bhi);  /* 24-31 | 56-63 */
            __m256i *o = (__m256i *)(out + kw * 8);
            _mm256_storeu_si256(o, _mm256_permute2x128_si256(a0, a1, 0x20));
            _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(b0, b1, 0x20));
            _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(a0, a1, 0x31));
            _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(b0, b1, 0x31));
        }
        for (; kw < end; kw++) {  /* the group's last words */
            const uint32_t w = words[kw];
            for (int j = 0; j < 8; j++) out[kw * 8 + j] = l[(w >> (4 * j)) & 15];
        }
    }
}
#endif

/* Every (row, group) table of a tile: values in float32 first (a loop that
 * vectorizes), then converted in one pass. */
ZT_CLONES
static void build_tables(const float *scale, const float *zero, size_t count, size_t L,
                         float *values) {
    for (size_t i = 0; i < count; i++)
        for (size_t c = 0; c < L; c++) {
            /* a float variable per step: C rounds each assignment to float even where
             * the compiler evaluates float expressions in double (GCC on s390x in ISO
             * mode), so the result is the same two roundings as numpy's everywhere */
            const float diff = (float)c - zero[i];
            values[i * L + c] = diff * scale[i];
        }
}

/* Direct path (8-bit codes, and groups smaller than a table): compute each value
 * of one row. */
static void direct_row(const zt_dequant_args *a, size_t n, const uint32_t *words,
                       const float *scale, const float *zero) {
    size_t g = 0, left = a->group_size;  /* k / group_size, kept without dividing */
    for (size_t k = 0; k < a->K; k++) {
        const size_t gk = a->g_idx ? group_of(a, k) : g;
        const float code = (float)stream_code(words, k, a->bits);
        const float diff = code - zero[gk];   /* rounded to float: see build_tables */
        const float value = diff * scale[gk];
        put(a->out, n * a->K + k, value, a->out_type);
        if (--left == 0) {
            g++;
            left = a->group_size;
        }
    }
}

/* Is every g_idx value a group of this weight?  O(K), against the O(rows * K) of
 * the work it guards: checked here, beside the loads it protects, on every call. */
static int group_index_ok(const zt_dequant_args *a) {
    if (a->g_idx == NULL) return 1;
    for (size_t k = 0; k < a->K; k++)
        if ((size_t)zt_load_le32(a->g_idx + 4 * k) >= a->G) return 0;
    return 1;
}

zt_status zt_dequant_rows(const zt_dequant_args *a, size_t row_begin, size_t row_end) {
    if (a == NULL || (a->bits != 2 && a->bits != 3 && a->bits != 4 && a->bits != 8) ||
        row_end > a->N || a->K % block_codes(a->bits))
        return ZT_E_ARG;
    if (a->K == 0 || row_begin >= row_end) return ZT_OK;
    if (a->G == 0 || a->group_size == 0) return ZT_E_ARG;
    if (!group_index_ok(a)) return ZT_E_GROUP_INDEX;
    const size_t L = (size_t)1 << a->bits, G = a->G;
    /* Tables pay only when a group spans at least as many codes as a table has
     * entries; below that (group_size 1, say) they would cost G * L values per row,
     * far more than the row itself, so each value is computed instead.  Scratch is
     * then proportional to the rows asked for and to K, never to G * 2^bits alone. */
    const int use_lut = a->bits <= 4 && a->group_size >= L && G <= a->K;
    const size_t tile = row_end - row_begin < TILE ? row_end - row_begin : TILE;
    const size_t stride = tile_stride(stream_words(a->K, a->bits));
    uint32_t *tw = (uint32_t *)malloc(tile * stride * sizeof(uint32_t));
    float *scale = (float *)malloc(2 * tile * G * sizeof(float));
    float *values = use_lut ? (float *)malloc(tile * G * L * sizeof(float)) : NULL;
    uint16_t *lut16 = use_lut && a->out_type != ZT_F32 ?
        (uint16_t *)malloc(tile * G * L * sizeof(uint16_t)) : NULL;
    if (tw == NULL || scale == NULL || (use_lut && values == NULL) ||
        (use_lut && a->out_type != ZT_F32 && lut16 == NULL)) {
        free(tw);
        free(scale);
        free(values);
        free(lut16);
        return ZT_E_NOMEM;
    }
    float *zero = scale + tile * G;
#ifdef ZT_X86_AVX2
    const int avx2_rows = a->g_idx == NULL && a->group_size % 8 == 0 && zt_use_avx2();
#endif
    for (size_t n0 = row_begin; n0 < row_end; n0 += tile) {
        size_t rows = row_end - n0 < tile ? row_end - n0 : tile;
        for (size_t t = 0; t < rows; t++)
            for (size_t g = 0; g < G; g++) {
                scale[t * G + g] = load_float(a->scales, g * a->N + n0 + t, a->scale_type);
                zero[t * G + g] = zero_point(a, g, n0 + t);
            }
        transpose_tile(a, n0, rows, tw);
        if (!use_lut) {
            for (size_t t = 0; t < rows; t++)
                direct_row(a, n0 + t, tw + t * stride, scale + t * G, zero + t * G);
            continue;
        }
        build_tables(scale, zero, rows * G, L, values);
        if (a->out_type != ZT_F32) {
            if (a->out_type == ZT_F16) zt_f32_to_f16_array(values, lut16, rows * G * L);
            else zt_bf16_encode(values, lut16, rows * G * L);
        }
        for (size_t t = 0; t < rows; t++) {
            const uint32_t *words = tw + t * stride;
            size_t n = n0 + t, lut_at = t * G * L;
            if (a->out_type == ZT_F32) {
                float *out = (float *)a->out + n * a->K;
                if (a->bits == 4) lut_row_f32_4(a, words, values + lut_at, out);
                else if (a->bits == 3) lut_row_f32_3(a, words, values + lut_at, out);
                else lut_row_f32_2(a, words, values + lut_at, out);
            } else {
                uint16_t *out = (uint16_t *)a->out + n * a->K;
#ifdef ZT_X86_AVX2
                if (a->bits == 4 && avx2_rows) {
                    lut_row_u16_4_avx2(a, words, lut16 + lut_at, out);
                    continue;
                }
#endif
                if (a->bits == 4) lut_row_u16_4(a, words, lut16 + lut_at, out);
                else if (a->bits == 3) lut_row_u16_3(a, words, lut16 + lut_at, out);
                else lut_row_u16_2(a, words, lut16 + lut_at, out);
            }
        }
    }
    free(tw);
    free(scale);
    free(values);
    free(lut16);
    return ZT_OK;
}

zt_status zt_unpack_codes(const uint8_t *words, size_t count, int bits, uint8_t *out) {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 8) return ZT_E_ARG;
    for (size_t i = 0; i < count; i++) out[i] = (uint8_t)stream_code_le(words, i, bits);
    return ZT_OK;
}
