/* Plain C tests of csrc/, with known answers.  Built natively and, by
 * tools/c-kernel-tests.sh, for s390x (big-endian) and run under qemu-user: every
 * input below is written as the little-endian BYTES a file holds, so a missing
 * byte swap on a big-endian host shows as a wrong value.
 * Prints "N passed, M failed" and exits non-zero on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif
#include "blobwrite.h"
#include "byteswap.h"
#include "cbor_canonical.h"
#include "cbor_scan.h"
#include "copy.h"
#include "crc32c.h"
#include "floatconv.h"
#include "footer.h"
#include "ggml_blocks.h"
#include "manifest_encode.h"
#include "manifest_scan.h"
#include "quant.h"
#include "residency.h"
#include "xxh3.h"
#include "zt_endian.h"
#include "zt_simd.h"
#include "zstd_frames.h"

static int passed, failed;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) { passed++; } else {                                     \
            failed++; printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
            printf(__VA_ARGS__); printf("\n");                             \
        }                                                                  \
    } while (0)

static void test_endian(void) {
    const uint8_t le[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    CHECK(zt_load_le64(le) == 0x0102030405060708ull, "load_le64");
    CHECK(zt_load_le32(le) == 0x05060708u, "load_le32");
    uint8_t out[8];
    zt_store_le64(out, 0x0102030405060708ull);
    CHECK(memcmp(out, le, 8) == 0, "store_le64");
    printf("host is %s-endian\n", zt_host_is_big_endian() ? "big" : "little");
}

static void test_footer(void) {
    /* v1 file: magic, 24-byte manifest at 8, size 24 (LE), magic */
    uint8_t file[48] = "ZTEN1000";
    memset(file + 8, 0xA0, 24);
    const uint8_t tail[16] = {24, 0, 0, 0, 0, 0, 0, 0, 'Z', 'T', 'E', 'N', '1', '0', '0', '0'};
    memcpy(file + 32, tail, 16);
    zt_footer f;
    CHECK(zt_footer_parse(file, 8, file + 32, 16, 48, 1u << 30, &f) == ZT_OK, "footer ok");
    CHECK(f.family == ZT_FAMILY_V1 && f.manifest_offset == 8 && f.manifest_size == 24,
          "footer fields %llu %llu", (unsigned long long)f.manifest_offset,
          (unsigned long long)f.manifest_size);
    file[32] = 25; /* one byte too large */
    CHECK(zt_footer_parse(file, 8, file + 32, 16, 48, 1u << 30, &f) ==
          ZT_E_MANIFEST_OUT_OF_BOUNDS, "footer bounds");
    file[32] = 24;
    CHECK(zt_footer_parse(file, 8, file + 32, 16, 48, 10, &f) == ZT_E_MANIFEST_TOO_LARGE,
          "footer limit");
    file[47] = '1';
    CHECK(zt_footer_parse(file, 8, file + 32, 16, 48, 1u << 30, &f) == ZT_E_BAD_FOOTER_MAGIC,
          "footer magic");
}

static void test_crc32c(void) {
    CHECK(zt_crc32c_update(0, "123456789", 9) == 0xE3069283u, "crc check value");
    uint8_t buf[40000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    uint32_t whole = zt_crc32c_update(0, buf, sizeof buf);
    uint32_t parts = zt_crc32c_update(zt_crc32c_update(0, buf, 1001), buf + 1001, sizeof buf - 1001);
    CHECK(whole == parts && whole == zt_crc32c_update_sw(0, buf, sizeof buf), "crc chaining");
}

static void test_bswap(void) {
    const uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t dst[8];
    zt_bswap(src, dst, 4, 2);
    CHECK(memcmp(dst, (const uint8_t[]){2, 1, 4, 3, 6, 5, 8, 7}, 8) == 0, "bswap16");
    zt_bswap(src, dst, 2, 4);
    CHECK(memcmp(dst, (const uint8_t[]){4, 3, 2, 1, 8, 7, 6, 5}, 8) == 0, "bswap32");
    zt_bswap(src, dst, 1, 8);
    CHECK(memcmp(dst, (const uint8_t[]){8, 7, 6, 5, 4, 3, 2, 1}, 8) == 0, "bswap64");
}

/* Streamed copies at every alignment of source and destination, lengths around the
 * streaming threshold and the 128-byte loop, with the SIMD paths on and off: the
 * bytes must equal memcpy's, and nothing outside the destination range changes. */
static void test_copy(void) {
    const size_t big = ZT_COPY_STREAM_BYTES + 300;
    uint8_t *src = malloc(big + 64), *dst = malloc(big + 64 + 2);
    if (!src || !dst) { CHECK(0, "copy: out of memory"); free(src); free(dst); return; }
    for (size_t i = 0; i < big + 64; i++) src[i] = (uint8_t)(i * 131u + (i >> 8));
    const size_t lengths[] = {0, 1, 31, 127, 128, 129, 4096, ZT_COPY_STREAM_BYTES - 1,
                              ZT_COPY_STREAM_BYTES, ZT_COPY_STREAM_BYTES + 1, big};
    int bad = 0;
    for (int simd = 0; simd < 2; simd++) {
        int old = zt_simd_enable(simd);
        for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
            for (size_t so = 0; so < 33; so += 11) {
                for (size_t dof = 0; dof < 33; dof += 3) {
                    size_t n = lengths[k];
                    memset(dst, 0xA5, big + 66);
                    if (zt_copy(src + so, dst + 1 + dof, n) != ZT_OK) bad++;
                    if (memcmp(dst + 1 + dof, src + so, n) != 0) bad++;
                    if (dst[dof] != 0xA5 || dst[1 + dof + n] != 0xA5) bad++;
                }
            }
        }
        zt_simd_enable(old);
    }
    CHECK(bad == 0, "copy: %d wrong copies", bad);
    CHECK(zt_copy(src, src + 10, 20) == ZT_E_ARG, "copy: overlapping ranges refused");
    CHECK(zt_copy(src + 10, src, 20) == ZT_E_ARG, "copy: overlapping ranges refused");
    CHECK(zt_copy(NULL, dst, 1) == ZT_E_ARG, "copy: NULL source refused");
    CHECK(zt_copy(NULL, NULL, 0) == ZT_OK, "copy: nothing to copy");
    free(src);
    free(dst);
}

/* The frame walker on frames python-zstandard made ("zTensor " x 8 with a content
 * checksum, and the empty frame) and a skippable frame: every cut inside a frame is "cut" at that frame's start, bytes
 * after the frames are a cut frame or no magic, a reserved bit is refused. */
static void test_zstd_frames(void) {
    static const uint8_t frame[27] = {
        0x28, 0xb5, 0x2f, 0xfd, 0x24, 0x40, 0x75, 0x00, 0x00, 0x40, 0x7a, 0x54, 0x65, 0x6e,
        0x73, 0x6f, 0x72, 0x20, 0x01, 0x00, 0xdd, 0x59, 0xb8, 0x96, 0x35, 0xd2, 0x0b};
    static const uint8_t empty[9] = {0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00};
    static const uint8_t skip[11] = {0x5f, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 'a', 'b', 'c'};
    uint8_t buf[64];
    int verdict = -1;
    size_t at = 99, frames = 99;
    CHECK(zt_zstd_frames(frame, sizeof frame, &verdict, &at, &frames) == ZT_OK &&
          verdict == ZT_FRAMES_WHOLE && at == sizeof frame && frames == 1, "one whole frame");
    memcpy(buf, skip, 11);
    memcpy(buf + 11, frame, 27);
    memcpy(buf + 38, empty, 9);
    zt_zstd_frames(buf, 47, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_WHOLE && frames == 3, "skippable, data and empty frames");
    int bad = 0;
    for (size_t cut = 1; cut < 47; cut++) {
        if (cut == 11 || cut == 38) continue;  /* frame boundaries: whole */
        zt_zstd_frames(buf, cut, &verdict, &at, &frames);
        size_t start = cut < 11 ? 0 : cut < 38 ? 11 : 38;
        if (verdict != ZT_FRAMES_CUT || at != start || frames != (start == 0 ? 0u : start == 11 ? 1u : 2u))
            bad++;
    }
    CHECK(bad == 0, "zstd frames: %d cuts not found at their frame", bad);
    memcpy(buf, frame, 27);
    memset(buf + 27, 0, 5);
    zt_zstd_frames(buf, 28, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_CUT && at == 27 && frames == 1, "one byte after the frame");
    zt_zstd_frames(buf, 32, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_NOT_ZSTD && at == 27, "no magic after the frame");
    buf[4] |= 0x08;
    zt_zstd_frames(buf, 27, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_BAD_BLOCK && at == 0, "the reserved header bit");
    memcpy(buf, empty, 9);
    buf[6] = 0x07;  /* the last block's type: reserved */
    zt_zstd_frames(buf, 9, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_BAD_BLOCK, "a reserved block type");
    zt_zstd_frames(NULL, 0, &verdict, &at, &frames);
    CHECK(verdict == ZT_FRAMES_WHOLE && frames == 0, "no bytes: no frames");
    CHECK(zt_zstd_frames(NULL, 1, &verdict, &at, &frames) == ZT_E_ARG, "NULL with bytes");
}

static void test_floatconv(void) {
    const uint8_t codes[6] = {0x00, 0x01, 0x38, 0x7E, 0x7F, 0xB8};
    float f[6];
    zt_fp8_decode(codes, f, 6, ZT_FP8_E4M3FN, ZT_F32);
    CHECK(f[0] == 0.0f && f[1] == ldexpf(1, -9) && f[2] == 1.0f && f[3] == 448.0f &&
          isnan(f[4]) && f[5] == -1.0f, "fp8 decode %g %g %g %g %g", f[0], f[1], f[2], f[3], f[5]);
    const float in[5] = {1.0f, 464.0f, 465.0f, -0.0f, 1e-3f};
    uint8_t enc[5];
    zt_fp8_encode(in, enc, 5, ZT_FP8_E4M3FN, ZT_F32);
    CHECK(enc[0] == 0x38 && enc[1] == 0x7E && enc[2] == 0x7F && enc[3] == 0x80 && enc[4] == 0x01,
          "fp8 encode %x %x %x %x %x", enc[0], enc[1], enc[2], enc[3], enc[4]);
    CHECK(zt_f32_to_f16(1.0f) == 0x3C00 && zt_f32_to_f16(65520.0f) == 0x7C00 &&
          zt_f32_to_f16(ldexpf(1, -24)) == 0x0001, "f32 -> f16");
    CHECK(zt_f16_to_f32(0xC000) == -2.0f && zt_f16_to_f32(0x0001) == ldexpf(1, -24), "f16 -> f32");
    CHECK(zt_f32_to_bf16(1.01171875f) == 0x3F82 && zt_f32_to_bf16(3.4028235e38f) == 0x7F80,
          "f32 -> bf16");
}

static void test_dequant(void) {
    /* docs/quantized_group.md's worked example, as the bytes a file holds */
    const uint8_t qweight[8] = {0x21, 0x43, 0x65, 0x87, 0x0F, 0x0F, 0x0F, 0x0F};
    const uint8_t scales[4] = {0x00, 0x38, 0x00, 0x40};   /* f16 LE: 0.5, 2.0 */
    const uint8_t zeros[4] = {0x00, 0x48, 0x80, 0x47};    /* f16 LE: 8.0, 7.5 */
    float out[16];
    zt_dequant_args a = {qweight, scales, zeros, NULL, 8, 2, 1, 8, 4, ZT_F16, ZT_F16, ZT_F32, out};
    CHECK(zt_dequant_rows(&a, 0, 2) == ZT_OK, "dequant status");
    const float want[16] = {-3.5f, -3, -2.5f, -2, -1.5f, -1, -0.5f, 0,
                            15, -15, 15, -15, 15, -15, 15, -15};
    CHECK(memcmp(out, want, sizeof want) == 0, "dequant values %g %g %g %g", out[0], out[7],
          out[8], out[9]);
    /* GPTQ v1 packed zeros: stored zero-1, LE word; row 0 zero 8 (stored 7), row 1 zero 0
     * (stored 0xF after the wrap); 8 codes per word along N, so pad N to 8 columns */
    uint8_t q8[32], s8[16], z8[4] = {0xF7, 0, 0, 0};
    for (int n = 0; n < 8; n++) {
        memcpy(q8 + 4 * n, n == 1 ? qweight + 4 : qweight, 4);
        s8[2 * n] = 0x00;
        s8[2 * n + 1] = 0x3C;   /* scale 1.0 */
    }
    float o8[64];
    zt_dequant_args b = {q8, s8, z8, NULL, 8, 8, 1, 8, 4, ZT_F16, ZT_ZERO_PACKED_V1, ZT_F32, o8};
    CHECK(zt_dequant_rows(&b, 0, 8) == ZT_OK, "dequant v1 status");
    CHECK(o8[0] == 1 - 8 && o8[7] == 0 && o8[8] == 15 && o8[9] == 0,
          "dequant v1 zeros %g %g %g %g", o8[0], o8[7], o8[8], o8[9]);
    /* g_idx: the same weight, act-order groups; a group number >= G is refused
     * before any load (G = 1 here, so group 1 is out of range) */
    uint8_t g_idx[32] = {0};
    zt_dequant_args c = {qweight, scales, zeros, g_idx, 8, 2, 1, 8, 4, ZT_F16, ZT_F16, ZT_F32,
                         out};
    CHECK(zt_dequant_rows(&c, 0, 2) == ZT_OK && memcmp(out, want, sizeof want) == 0,
          "dequant with g_idx");
    g_idx[4 * 5] = 1;
    CHECK(zt_dequant_rows(&c, 0, 2) == ZT_E_GROUP_INDEX, "g_idx out of range");
    g_idx[4 * 5] = 0;
    g_idx[4 * 5 + 3] = 0x80;  /* -2^31 as int32: a huge unsigned group number */
    CHECK(zt_dequant_rows(&c, 0, 2) == ZT_E_GROUP_INDEX, "negative g_idx");
    /* 3-bit codes, AutoGPTQ's layout: code k = (5k + 3) % 8 at bit 3k of 3 LE words
     * (codes 10 and 21 straddle words); symmetric, so zero 4; scale 1; one column */
    const uint8_t q3[12] = {0x43, 0x75, 0xC6, 0x43, 0x75, 0xC6, 0x43, 0x75,
                            0xC6, 0x43, 0x75, 0xC6};
    const uint8_t s3[2] = {0x00, 0x3C};
    float o3[32];
    for (int t = 0; t < 2; t++) {  /* group 32: the table path; group 1: computed values */
        zt_dequant_args d = {q3, s3, NULL, NULL, 32, 1, 1, 32, 3, ZT_F16, ZT_ZERO_NONE,
                             ZT_F32, o3};
        uint8_t s3g[64];
        if (t == 1) {
            for (int g = 0; g < 32; g++) memcpy(s3g + 2 * g, s3, 2);
            d.scales = s3g;
            d.G = 32;
            d.group_size = 1;
        }
        CHECK(zt_dequant_rows(&d, 0, 1) == ZT_OK, "dequant 3-bit status");
        int ok = 1;
        for (int k = 0; k < 32; k++) ok &= o3[k] == (float)((5 * k + 3) % 8 - 4);
        CHECK(ok, "dequant 3-bit values (path %d): %g %g %g", t, o3[10], o3[21], o3[31]);
    }
    uint8_t c3[32];
    CHECK(zt_unpack_codes(q3, 32, 3, c3) == ZT_OK && c3[10] == 5 && c3[21] == 4 && c3[31] == 6,
          "unpack 3-bit codes");
    zt_dequant_args e = {q3, s3, NULL, NULL, 16, 1, 1, 16, 3, ZT_F16, ZT_ZERO_NONE, ZT_F32, o3};
    CHECK(zt_dequant_rows(&e, 0, 1) == ZT_E_ARG, "3-bit K must fill whole words");
}

static zt_status scan(const char *hex, size_t max_depth, zt_cbor_scan_result *r) {
    uint8_t buf[256];
    size_t n = 0;
    for (; hex[2 * n] && hex[2 * n + 1]; n++) {
        unsigned v;
        sscanf(hex + 2 * n, "%2x", &v);
        buf[n] = (uint8_t)v;
    }
    return zt_cbor_scan(buf, n, max_depth, r);
}

static void test_cbor_scan(void) {
    zt_cbor_scan_result r;
    /* {"a": [1, -1, h'00', 1.5, null, 2(h'0100')]} */
    CHECK(scan("a161618601204100f93e00f6c2420100", 8, &r) == ZT_OK && r.end == 16 &&
          r.depth == 3, "plain map (a tag is a level): end %zu depth %zu", r.end, r.depth);
    CHECK(scan("9f0102ff00", 8, &r) == ZT_OK && r.end == 4, "indefinite array, trailing byte");
    CHECK(scan("7f6261626163ff", 8, &r) == ZT_OK && r.end == 7, "indefinite text chunks");
    CHECK(scan("d81ca0", 8, &r) == ZT_E_CBOR_TAG && r.tag == 28, "shareable refused");
    CHECK(scan("c48221196ab3", 8, &r) == ZT_E_CBOR_TAG && r.tag == 4, "decimal refused");
    CHECK(scan("d9d9f7a0", 8, &r) == ZT_OK, "self-describe tag allowed");
    CHECK(scan("c201", 8, &r) == ZT_E_CBOR_MALFORMED, "bignum of an integer");
    CHECK(scan("a10102", 8, &r) == ZT_E_CBOR_KEY, "integer map key");
    CHECK(scan("818181818100", 4, &r) == ZT_E_CBOR_DEPTH, "too deep");
    CHECK(scan("818181818100", 5, &r) == ZT_OK && r.depth == 5, "just deep enough");
    CHECK(scan("9bffffffffffffffff", 8, &r) == ZT_E_CBOR_MALFORMED, "lying array count");
    CHECK(scan("5affffffff00", 8, &r) == ZT_E_CBOR_MALFORMED, "lying string length");
    CHECK(scan("ff", 8, &r) == ZT_E_CBOR_MALFORMED, "lone break");
    CHECK(scan("1c", 8, &r) == ZT_E_CBOR_MALFORMED, "reserved info");
    CHECK(scan("f801", 8, &r) == ZT_E_CBOR_MALFORMED, "two-byte simple below 32");
    CHECK(scan("bf6161ff", 8, &r) == ZT_E_CBOR_MALFORMED, "key without value");
    CHECK(scan("7f4100ff", 8, &r) == ZT_E_CBOR_MALFORMED, "byte chunk in a text string");
    CHECK(scan("", 8, &r) == ZT_E_CBOR_MALFORMED, "empty input");
}

static void test_blobwriter(void) {
    FILE *tmp = tmpfile();
    if (tmp == NULL) { CHECK(0, "tmpfile"); return; }
    zt_blobwriter bw;
    CHECK(zt_bw_init(&bw, fileno(tmp), 0, 64) == ZT_OK, "bw init");
    zt_bw_write(&bw, "ZTEN1000", 8);
    zt_bw_pad(&bw, 64);
    zt_bw_write(&bw, "\x01\x02", 2);
    zt_bw_pad(&bw, 64);
    CHECK(bw.pos == 128 && zt_bw_flush(&bw) == ZT_OK, "bw pos %llu", (unsigned long long)bw.pos);
    /* a blob larger than the buffer goes straight to write(2) (blocks reserved
     * first on ext4): the file holds exactly the bytes given, nothing after them */
    uint8_t big[1000], back[1000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7 + 1);
    CHECK(zt_bw_write(&bw, big, sizeof big) == ZT_OK && zt_bw_flush(&bw) == ZT_OK, "bw big");
    CHECK(bw.pos == 1128, "bw pos after big %llu", (unsigned long long)bw.pos);
    CHECK(fseek(tmp, 0, SEEK_END) == 0 && ftell(tmp) == 1128, "bw size %ld", ftell(tmp));
    CHECK(fseek(tmp, 128, SEEK_SET) == 0 && fread(back, 1, sizeof back, tmp) == sizeof back
          && memcmp(back, big, sizeof big) == 0, "bw big bytes");
    zt_bw_free(&bw);
    /* a reservation ahead never changes the file's size (nor its bytes), reserved
     * or not (ext4 only), and a zero length reserves nothing */
    CHECK(zt_reserve_ahead(fileno(tmp), 0) == 0, "reserve of nothing");
    (void)zt_reserve_ahead(fileno(tmp), (uint64_t)1 << 20);
    CHECK(fseek(tmp, 0, SEEK_END) == 0 && ftell(tmp) == 1128, "size after reserve %ld",
          ftell(tmp));
    CHECK(fseek(tmp, 128, SEEK_SET) == 0 && fread(back, 1, sizeof back, tmp) == sizeof back
          && memcmp(back, big, sizeof big) == 0, "bytes after reserve");
    fclose(tmp);
}

/* A two-object manifest from the encoder, read back by the scanner: columns, dims,
 * sorted names, vocabulary indices (the same bytes on either byte order). */
static void test_manifest_tables(void) {
    const uint8_t names[] = "zetaalpha";
    const uint64_t name_len[] = {4, 5}, rank[] = {2, 1}, dims[] = {3, 70000, 5};
    const uint64_t dtype[] = {1, 0}, offset[] = {64, 840064}, length[] = {840000, 40};
    const uint8_t plain[] = {1, 1};
    zt_mf_encode_args a;
    memset(&a, 0, sizeof a);
    a.count = 2;
    a.names = names;
    a.name_len = name_len;
    a.plain = plain;
    a.rank = rank;
    a.dims = dims;
    a.dtype = dtype;
    a.offset = offset;
    a.length = length;
    a.dtypes.words = "f64\0f32\0";
    a.dtypes.count = 2;
    uint8_t out[512];
    size_t n = 0;
    CHECK(zt_manifest_encode(&a, out, sizeof out, &n) == ZT_OK && n > 100, "encode");
    CHECK(out[0] == 0xA2 && out[1] == 0x65 && memcmp(out + 2, "alpha", 5) == 0,
          "objects sorted by name bytes");
    CHECK(zt_manifest_encode(&a, out, 40, &n) == ZT_E_ARG, "encode refuses a short buffer");
    /* wrap the objects map in a root map and scan it */
    uint8_t root[600];
    const char head[] = "\xA2\x67version\x65" "1.2.0\x67objects";
    size_t h = sizeof head - 1;
    memcpy(root, head, h);
    size_t m = 0;
    zt_manifest_encode(&a, root + h, sizeof root - h, &m);
    zt_mf_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.formats.words = "dense\0";
    cfg.formats.count = 1;
    cfg.dtypes.words = "f64\0f32\0";
    cfg.dtypes.count = 2;
    cfg.encodings.words = "raw\0zstd\0";
    cfg.encodings.count = 2;
    cfg.roles.words = "data\0";
    cfg.roles.count = 1;
    cfg.max_depth = 72;
    cfg.max_components = 64;
    zt_mf_result r;
    CHECK(zt_manifest_scan(root, h + m, &cfg, NULL, 0, NULL, 0, NULL, 0, &r) == ZT_OK && r.fast &&
          r.nobjects == 2 && r.ncomponents == 2 && r.ndims == 3, "scan counts");
    uint64_t objs[ZT_MF_OBJECT_FIELDS * 2], comps[ZT_MF_COMPONENT_FIELDS * 2], d[3];
    CHECK(zt_manifest_scan(root, h + m, &cfg, objs, 2, comps, 2, d, 3, &r) == ZT_OK && r.fast,
          "scan fills");
    /* column-major: field f of row i at [f * 2 + i]; row 0 is "alpha" (sorted first) */
    CHECK(objs[1 * 2 + 0] == 5 && objs[6 * 2 + 0] == 1 && objs[6 * 2 + 1] == 2, "name, rank");
    CHECK(d[0] == 5 && d[1] == 3 && d[2] == 70000, "dims");
    CHECK(comps[3 * 2 + 0] == 0 && comps[3 * 2 + 1] == 1, "dtype indices");
    CHECK(comps[5 * 2 + 1] == 64 && comps[6 * 2 + 1] == 840000, "offset, length");
    CHECK(objs[9 * 2 + 1] == 210000 && objs[10 * 2 + 1] == 1, "numel, extent");
    CHECK(zt_manifest_scan(root, h + m, &cfg, objs, 2, comps, 2, d, 2, &r) == ZT_OK && !r.fast &&
          r.full, "a table too small says so (the caller counts, then fills)");
    CHECK(zt_manifest_scan(root, h + m, &cfg, objs, 1, comps, 2, d, 3, &r) == ZT_OK && !r.fast &&
          r.full, "too few object rows says so");
    cfg.text_checked = 1;
    CHECK(zt_manifest_scan(root, h + m, &cfg, objs, 2, comps, 2, d, 3, &r) == ZT_OK && r.fast &&
          !r.full && d[2] == 70000, "a fill after a count");
    cfg.text_checked = 0;
    cfg.max_components = 0;  /* nothing fits: the general path's turn, never an error */
    CHECK(zt_manifest_scan(root, h + m, &cfg, NULL, 0, NULL, 0, NULL, 0, &r) == ZT_OK &&
          !r.fast, "declines what it does not take");
}

/* Known answers for two GGUF block types, written as the bytes a file holds. */
static void test_ggml_blocks(void) {
    uint8_t q8[34] = {0x00, 0x38};  /* d = 0.5 (f16 0x3800, little-endian) */
    q8[2] = (uint8_t)-2;
    q8[3] = 4;
    float out[256];
    CHECK(zt_ggml_dequant(8, q8, 1, out) == ZT_OK && out[0] == -1.0f && out[1] == 2.0f &&
          out[2] == 0.0f, "Q8_0");
    uint8_t q4[18] = {0x00, 0x3C, 0x9A};  /* d = 1.0; byte 0: low nibble 10, high 9 */
    CHECK(zt_ggml_dequant(2, q4, 1, out) == ZT_OK && out[0] == 2.0f && out[16] == 1.0f &&
          out[1] == -8.0f, "Q4_0");
    CHECK(zt_ggml_dequant(34, q4, 1, out) == ZT_E_ARG && zt_ggml_block_bytes(12) == 144 &&
          zt_ggml_block_elements(14) == 256, "unknown type refused, geometry");
}

/* XXH3-64 of bytes (i * 31 + 7) & 255, answers from the xxhash package: one length
 * per path (0, 1-3, 4-8, 9-16, 17-128, 129-240, blocks) */
static void test_xxh3(void) {
    static uint8_t buf[4096];
    static const struct { size_t n; uint64_t want; } known[] = {
        {0, 0x2D06800538D394C2ULL}, {1, 0x4C5CCA45D0F4811FULL}, {3, 0x15F7093B173D005CULL},
        {4, 0xDCA012F95811B6B9ULL}, {8, 0xDEC6A9A43575982EULL}, {9, 0xCBE393399F17FFBDULL},
        {16, 0x7E484C18D74895D0ULL}, {17, 0x208BDE5EE2BED407ULL}, {128, 0xF92B70EAA21A6288ULL},
        {129, 0xF8F76713F2BB60FAULL}, {240, 0xCCC7375172C41F03ULL}, {241, 0x0B3B630948CE4A00ULL},
        {1024, 0x23BC880EBF0D29C6ULL}, {1025, 0xC09FDFBC398C7D82ULL}, {4096, 0xA3C19F8174CDE0BBULL}};
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 31 + 7);
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        CHECK(zt_xxh3_64(buf, known[k].n) == known[k].want, "xxh3 of %zu bytes", known[k].n);
}

static zt_status canonical(const char *hex) {
    uint8_t buf[128];
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) sscanf(hex + 2 * i, "%2hhx", &buf[i]);
    zt_cbor_scan_result r;
    return zt_cbor_check_canonical(buf, n, 32, &r);
}

static void test_cbor_canonical(void) {
    CHECK(canonical("a2616101616202") == ZT_OK, "sorted map");                 /* {a:1,b:2} */
    CHECK(canonical("a2616201616102") == ZT_E_CBOR_MALFORMED, "unsorted map");
    CHECK(canonical("a2616101616102") == ZT_E_CBOR_MALFORMED, "duplicate key");
    CHECK(canonical("a2616101626161") == ZT_E_CBOR_MALFORMED, "truncated");
    CHECK(canonical("a26161016261610f") == ZT_OK, "shorter key first");
    CHECK(canonical("1817") == ZT_E_CBOR_MALFORMED && canonical("1818") == ZT_OK, "heads");
    CHECK(canonical("f97e00") == ZT_OK && canonical("f97e01") == ZT_E_CBOR_MALFORMED, "NaN");
    CHECK(canonical("fa3fc00000") == ZT_E_CBOR_MALFORMED, "1.5 as single");
    CHECK(canonical("fa47c35000") == ZT_OK, "100000.0 needs single");
    CHECK(canonical("fb3ff8000000000000") == ZT_E_CBOR_MALFORMED, "1.5 as double");
    CHECK(canonical("fb3fb999999999999a") == ZT_OK, "0.1 needs double");
    CHECK(canonical("9f00ff") == ZT_E_CBOR_MALFORMED, "indefinite");
    CHECK(canonical("c000") == ZT_E_CBOR_TAG, "tag");
    CHECK(canonical("0000") == ZT_E_CBOR_MALFORMED, "trailing byte");
}

static void test_residency(void) {
    size_t n = 1u << 20;
    uint8_t *touched = malloc(n);
    CHECK(touched != NULL, "malloc");
    if (!touched) return;
    memset(touched, 1, n);
    CHECK(zt_range_resident(touched + 3, n - 3) == 1, "a touched buffer is resident");
    CHECK(zt_range_resident(touched, 0) == 1, "an empty range is resident");
    free(touched);
    CHECK(zt_range_resident((const void *)(uintptr_t)4096, SIZE_MAX) == -1, "a range that wraps");
#if defined(__unix__) || defined(__APPLE__)
    /* fresh anonymous pages are not resident until first touched */
    uint8_t *fresh = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0);
    if (fresh != MAP_FAILED) {
        CHECK(zt_range_resident(fresh, n) == 0, "untouched pages");
        fresh[0] = 1;
        CHECK(zt_range_resident(fresh, 1) == 1 && zt_range_resident(fresh, n) == 0,
              "one touched page");
        munmap(fresh, n);
        CHECK(zt_range_resident(fresh, n) == -1, "an unmapped range");
    }
#endif
}

int main(void) {
    zt_crc32c_init();
    zt_floatconv_init();
    test_endian();
    test_footer();
    test_crc32c();
    test_bswap();
    test_copy();
    test_zstd_frames();
    test_floatconv();
    test_dequant();
    test_cbor_scan();
    test_manifest_tables();
    test_ggml_blocks();
    test_blobwriter();
    test_xxh3();
    test_cbor_canonical();
    test_residency();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
