/* GGUF block dequantization (see ggml_blocks.h).
 *
 * The layouts are llama.cpp's (ggml-quants.c); the element order and the float32
 * arithmetic follow gguf-py's numpy dequantization step for step (one float
 * variable per rounding: see quant.c on excess precision), which the tests use as
 * the oracle.  Blocks are independent, so the loop over blocks is the only state.
 */
#include "ggml_blocks.h"
#include "floatconv.h"
#include "zt_endian.h"

enum { QK = 32, QK_K = 256 };

static inline float half_at(const uint8_t *p) {
    return zt_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

size_t zt_ggml_block_elements(int type) {
    switch (type) {
    case 2: case 3: case 6: case 7: case 8: return QK;
    case 10: case 11: case 12: case 13: case 14: return QK_K;
    default: return 0;
    }
}

size_t zt_ggml_block_bytes(int type) {
    switch (type) {
    case 2: return 18;
    case 3: return 20;
    case 6: return 22;
    case 7: return 24;
    case 8: return 34;
    case 10: return 84;
    case 11: return 110;
    case 12: return 144;
    case 13: return 176;
    case 14: return 210;
    default: return 0;
    }
}

/* Q4_0 / Q4_1: nibbles, low halves first.  Q5_0 / Q5_1: plus one high bit each. */
static void q4_q5(int type, const uint8_t *b, float *out) {
    const int has_min = type == 3 || type == 7, five = type == 6 || type == 7;
    const float d = half_at(b), m = has_min ? half_at(b + 2) : 0.0f;
    const uint8_t *p = b + (has_min ? 4 : 2);
    uint32_t qh = 0;
    if (five) {
        qh = zt_load_le32(p);
        p += 4;
    }
    for (int j = 0; j < QK; j++) {
        int q = j < 16 ? (p[j] & 0x0F) : (p[j - 16] >> 4);
        if (five) q |= (int)((qh >> j) & 1) << 4;
        if (has_min) {
            const float scaled = d * (float)q;
            out[j] = scaled + m;
        } else {
            out[j] = d * (float)(q - (five ? 16 : 8));
        }
    }
}

static void q8_0(const uint8_t *b, float *out) {
    const float d = half_at(b);
    for (int j = 0; j < QK; j++) out[j] = (float)(int8_t)b[2 + j] * d;
}

static void q2_k(const uint8_t *b, float *out) {
    const uint8_t *scales = b, *qs = b + 16;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int e = 0; e < QK_K; e++) {
        const int half = e / 128, shift = (e % 128) / 32, byte = e % 32;
        const int q = (qs[half * 32 + byte] >> (2 * shift)) & 3;
        const uint8_t sc = scales[e / 16];
        const float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
        const float scaled = dl * (float)q;
        out[e] = scaled - ml;
    }
}

static void q3_k(const uint8_t *b, float *out) {
    const uint8_t *hmask = b, *qs = b + 32, *s = b + 96;
    const float d = half_at(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        const int low = (i < 8 ? s[i] : s[i - 8] >> 4) & 0x0F;
        const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        dl[i] = d * (float)((int8_t)(uint8_t)(low | (high << 4)) - 32);
    }
    for (int e = 0; e < QK_K; e++) {
        const int half = e / 128, shift = (e % 128) / 32, byte = e % 32;
        const int low = (qs[half * 32 + byte] >> (2 * shift)) & 3;
        const int high = ((hmask[e % 32] >> (e / 32)) & 1) ^ 1;
        out[e] = dl[e / 16] * (float)(low - (high << 2));
    }
}

/* The 6-bit scales and mins of Q4_K and Q5_K, 8 of each. */
static void scale_min_k4(const uint8_t *s, int sc[8], int mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        mn[j] = s[4 + j] & 63;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
}

static void q4_q5_k(int five, const uint8_t *b, float *out) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    int sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    for (int e = 0; e < QK_K; e++) {
        const int sub = e / 32, chunk = e / 64, high = (e % 64) / 32, byte = e % 32;
        int q = (qs[chunk * 32 + byte] >> (4 * high)) & 0x0F;
        if (five) q |= ((qh[byte] >> sub) & 1) << 4;
        const float dl = d * (float)sc[sub], ml = dmin * (float)mn[sub];
        const float scaled = dl * (float)q;
        out[e] = scaled - ml;
    }
}

static void q6_k(const uint8_t *b, float *out) {
    const uint8_t *ql = b, *qh = b + 128, *scales = b + 192;
    const float d = half_at(b + 208);
    for (int e = 0; e < QK_K; e++) {
        const int half = e / 128, i = e % 128;
        const int low = (ql[half * 64 + i % 64] >> (4 * (i / 64))) & 0x0F;
        const int high = (qh[half * 32 + i % 32] >> (2 * (i / 32))) & 3;
        const float dl = d * (float)(int8_t)scales[e / 16];
        out[e] = dl * (float)((low | (high << 4)) - 32);
    }
}

zt_status zt_ggml_dequant(int type, const uint8_t *blocks, size_t nblocks, float *out) {
    const size_t elements = zt_ggml_block_elements(type), bytes = zt_ggml_block_bytes(type);
    if (elements == 0 || ((blocks == NULL || out == NULL) && nblocks)) return ZT_E_ARG;
    for (size_t i = 0; i < nblocks; i++) {
        const uint8_t *b = blocks + i * bytes;
        float *o = out + i * elements;
        switch (type) {
        case 2: case 3: case 6: case 7: q4_q5(type, b, o); break;
        case 8: q8_0(b, o); break;
        case 10: q2_k(b, o); break;
        case 11: q3_k(b, o); break;
        case 12: q4_q5_k(0, b, o); break;
        case 13: q4_q5_k(1, b, o); break;
        default: q6_k(b, o); break;
        }
    }
    return ZT_OK;
}
