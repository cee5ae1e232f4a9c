/* Dequantization of GGUF (llama.cpp) quantized blocks.  See ggml_blocks.c. */
#ifndef ZT_GGML_BLOCKS_H
#define ZT_GGML_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include "zt_status.h"

/* Elements and bytes per block of ggml type `type` (its GGUF type id), 0 when this
 * kernel does not decode it. */
size_t zt_ggml_block_elements(int type);
size_t zt_ggml_block_bytes(int type);

/* `nblocks` blocks of ggml type `type` -> float32 values (block_elements each), in
 * the element order gguf-py's dequantize gives, with the same float32 roundings, so
 * the results are bit-identical.  Types: Q4_0 (2), Q4_1 (3), Q5_0 (6), Q5_1 (7),
 * Q8_0 (8), Q2_K (10), Q3_K (11), Q4_K (12), Q5_K (13), Q6_K (14).  ZT_E_ARG for
 * another type.  Every multi-byte field is read little-endian, on any host. */
zt_status zt_ggml_dequant(int type, const uint8_t *blocks, size_t nblocks, float *out);

#endif
