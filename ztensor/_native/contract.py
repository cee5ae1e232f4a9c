"""The argument contract of every kernel, checked before a pointer is taken.

Both backends call these (``_kernels.pyx`` before it takes pointers,
``_fallback.py`` before it builds numpy views), so the same bad call raises the same
:class:`~ztensor.errors.KernelArgumentError` with the same words on either.  The
arithmetic is Python's: sizes multiply without wrapping, so no product of huge
arguments can pass a check by overflowing to a small number, as ``size_t`` would.
"""

from ztensor import dtypes
from ztensor.errors import KernelArgumentError

# ---- the numbers csrc/'s headers define, as Python uses them: their one Python home.
# Both backends take them from here (kernels.py re-exports them); the compiled
# extension exports the headers' own values and tests/native/test_c_constants.py asserts
# each equal, so the numpy fallback cannot drift from C.
F32, F16, BF16 = 0, 1, 2  # zt_float_type (floatconv.h)
FLOAT_WIDTHS = (4, 2, 2)  # bytes of each zt_float_type, by code
FP8_KINDS = dtypes.FP8_TYPES  # zt_fp8_kind (floatconv.h): a kind's code is its index
FP8_KIND_COUNT = len(FP8_KINDS)
ZERO_NONE, ZERO_PACKED_V1, ZERO_PACKED_V2 = 16, 17, 18  # quant.h: zero_type beyond floats
FAMILY_V0, FAMILY_V1 = 0, 1  # footer.h: zt_footer.family
BLOB_EXTENT = 2 << 20  # blobwrite.h ZT_BW_EXTENT: the blob writer's write unit
# copy.h ZT_COPY_STREAM_BYTES: from here up zt_copy may stream (non-temporal stores:
# its own loop, or glibc's memcpy's); below it is a plain memcpy, no faster than the
# caller's own copy
COPY_STREAM_BYTES = 1 << 20
BITS = (2, 3, 4, 8)


def block_codes(bits: int) -> int:
    """Codes in the shortest run that fills whole int32 words (32 for 3-bit codes)."""
    return 32 if bits == 3 else 32 // bits


def stream_words(codes: int, bits: int) -> int:
    """int32 words holding ``codes`` codes (a whole number of blocks)."""
    return codes // block_codes(bits) * (3 if bits == 3 else 1)


SWAP_WIDTHS = (1, 2, 4, 8)


def fail(kernel: str, message: str):
    raise KernelArgumentError(f"{kernel}: {message}")


def integers(kernel: str, **values) -> None:
    """Every scalar argument is an int (not a bool) in [0, 2**63)."""
    for name, value in values.items():
        if type(value) is not int and not hasattr(value, "__index__") or isinstance(value, bool):
            fail(kernel, f"{name} must be an integer, got {type(value).__name__}")
        if not 0 <= int(value) < 1 << 63:
            fail(kernel, f"{name} must lie in [0, 2**63), got {int(value)}")


def reserve_ahead(fd: int, nbytes: int) -> None:
    integers("reserve_ahead", nbytes=nbytes)
    if type(fd) is not int or not 0 <= fd < 1 << 31:
        fail("reserve_ahead", f"fd must be an open file descriptor, got {fd!r}")


def bswap(n_src: int, n_dst: int, width: int) -> None:
    integers("bswap", width=width)
    if width not in SWAP_WIDTHS:
        fail("bswap", f"width must be 1, 2, 4 or 8, got {width}")
    if n_dst != n_src or n_src % width:
        fail("bswap", "buffers must have equal length, a multiple of width")


def copy(n_src: int, n_dst: int, src_at: int, dst_at: int) -> None:
    """One length; the ranges [src_at, +n) and [dst_at, +n) are one or disjoint."""
    if n_dst != n_src:
        fail("copy", "buffers must have equal length")
    if src_at != dst_at and src_at < dst_at + n_dst and dst_at < src_at + n_src:
        fail("copy", "the buffers overlap")


def copy_spans(src_size: int, dst_size: int, src_offsets, dst_offsets, lengths):
    """The three span columns as contiguous uint64 arrays, checked."""
    import numpy as np

    try:
        src_offsets, dst_offsets, lengths = (
            np.ascontiguousarray(a, np.uint64) for a in (src_offsets, dst_offsets, lengths)
        )
    except (TypeError, ValueError, OverflowError):
        fail("copy_spans", "offsets and lengths must be unsigned 64-bit integers")
    if not src_offsets.shape == dst_offsets.shape == lengths.shape or lengths.ndim != 1:
        fail("copy_spans", "offsets and lengths must be 1-D and of one length")
    for offsets, size in ((src_offsets, src_size), (dst_offsets, dst_size)):
        size = np.uint64(size)
        if (offsets > size).any() or (lengths > size - np.minimum(offsets, size)).any():
            fail("copy_spans", "a span runs past its buffer")
    return src_offsets, dst_offsets, lengths


def manifest_encode(
    names_size, name_len, plain, rank, dims, dtype, offset, length, pre_size, pre_len, dtype_count
):
    """The encoder's columns as contiguous arrays, checked against each other, and an
    upper bound on the output's size."""
    import numpy as np

    try:
        u64 = [
            np.ascontiguousarray(a, np.uint64).reshape(-1)
            for a in (name_len, rank, dims, dtype, offset, length, pre_len)
        ]
        plain = np.ascontiguousarray(plain, np.uint8).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        fail("manifest_encode", "columns must hold unsigned 64-bit integers")
    name_len, rank, dims, dtype, offset, length, pre_len = u64
    plains = int(np.count_nonzero(plain))
    if (
        len(plain) != len(name_len)
        or int(name_len.sum()) != names_size
        or not len(rank) == len(dtype) == len(offset) == len(length) == plains
        or int(rank.sum()) != len(dims)
        or len(pre_len) != len(plain) - plains
        or int(pre_len.sum()) != pre_size
        or (dtype >= dtype_count).any()
        or (plain > 1).any()
    ):
        fail("manifest_encode", "columns that do not fit each other")
    # every head is at most 9 bytes; a plain entry's constant keys are under 80
    cap = 9 + names_size + pre_size + 9 * len(name_len) + plains * 160 + 9 * len(dims)
    return name_len, plain, rank, dims, dtype, offset, length, pre_len, cap


# the ggml types csrc/ggml_blocks.c decodes, and their (elements, bytes) per block from
# the one ggml type table (dtypes.GGML_TYPES); the C side's sizes are checked equal
GGML_DECODED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
GGML_BLOCKS = {
    gtype: (per, nbytes)
    for gtype, (name, per, nbytes, _) in dtypes.GGML_TYPES.items()
    if name in GGML_DECODED
}


def ggml_dequant(ggml_type: int, n_blocks_bytes: int, n_out_bytes: int) -> int:
    """The number of blocks, after checking the type and both buffers' sizes."""
    integers("ggml_dequant", ggml_type=ggml_type)
    if ggml_type not in GGML_BLOCKS:
        fail("ggml_dequant", f"ggml type {ggml_type} is not one this kernel decodes")
    elements, nbytes = GGML_BLOCKS[ggml_type]
    if n_blocks_bytes % nbytes or n_out_bytes != n_blocks_bytes // nbytes * elements * 4:
        fail("ggml_dequant", "blocks must be whole and out must hold 4 bytes per element")
    return n_blocks_bytes // nbytes


def float_type(kernel: str, code: int, allow_bf16: bool = True) -> int:
    if code not in (F32, F16, BF16) or (code == BF16 and not allow_bf16):
        fail(kernel, f"unknown float type code {code}")
    return FLOAT_WIDTHS[code]


def fp8(kernel: str, n_codes: int, n_float_bytes: int, kind: int, ftype: int) -> None:
    integers(kernel, kind=kind, float_type=ftype)
    if kind not in range(FP8_KIND_COUNT):
        fail(kernel, f"unknown FP8 kind {kind}")
    width = float_type(kernel, ftype, allow_bf16=False)
    if n_float_bytes != n_codes * width:
        fail(kernel, "the float buffer must hold one float32 or float16 per code")


def bf16(kernel: str, n_bf16_bytes: int, n_f32_bytes: int) -> None:
    if n_bf16_bytes % 2 or n_f32_bytes != 2 * n_bf16_bytes:
        fail(kernel, "buffers must hold one float32 per bf16")


def cbor_canonical(max_depth: int) -> None:
    integers("cbor_check_canonical", max_depth=max_depth)
    if not 0 <= max_depth <= 100000:
        fail("cbor_check_canonical", f"max_depth must be in [0, 100000], got {max_depth}")


def unpack_codes(n_word_bytes: int, count: int, bits: int, n_out: int) -> None:
    integers("unpack_codes", count=count, bits=bits)
    if bits not in BITS:
        fail("unpack_codes", f"bits must be 2, 3, 4 or 8, got {bits}")
    if n_out != count or n_word_bytes % 4 or n_word_bytes * 8 < count * bits:
        fail("unpack_codes", "sizes do not match")


def dequant(
    n_qweight: int,
    n_scales: int,
    zeros_len,
    g_idx_len,
    K: int,
    N: int,
    G: int,
    group_size: int,
    bits: int,
    scale_type: int,
    zero_type: int,
    out_type: int,
    n_out: int,
    row_begin: int,
    row_end: int,
) -> None:
    """Every length against K, N, G; ``zeros_len``/``g_idx_len`` are None when absent."""
    kernel = "dequant_rows"
    integers(
        kernel,
        K=K,
        N=N,
        G=G,
        group_size=group_size,
        bits=bits,
        scale_type=scale_type,
        zero_type=zero_type,
        out_type=out_type,
        row_begin=row_begin,
        row_end=row_end,
    )
    if bits not in BITS:
        fail(kernel, f"bits must be 2, 3, 4 or 8, got {bits}")
    if not 0 <= row_begin <= row_end <= N:
        fail(kernel, f"row range [{row_begin}, {row_end}) is not inside [0, {N}]")
    scale_width = float_type(kernel, scale_type)
    out_width = float_type(kernel, out_type)
    per = block_codes(bits)
    if K % per:
        fail(kernel, f"K={K} is not a multiple of {per}")
    if K and (G == 0 or group_size == 0):
        fail(kernel, "G and group_size must be positive")
    if n_qweight != stream_words(K, bits) * N * 4:
        fail(kernel, "qweight does not hold K*bits/32 x N int32 words")
    if n_scales != G * N * scale_width:
        fail(kernel, "scales do not hold G x N values")
    if n_out != N * K * out_width:
        fail(kernel, "out does not hold N x K values")
    if zero_type == ZERO_NONE:
        pass
    elif zero_type in (ZERO_PACKED_V1, ZERO_PACKED_V2):
        if zeros_len is None or N % per or zeros_len != G * stream_words(N, bits) * 4:
            fail(kernel, "packed zeros do not hold G x N*bits/32 int32 words")
    else:
        width = float_type(kernel, zero_type)
        if zeros_len is None or zeros_len != G * N * width:
            fail(kernel, "zeros do not hold G x N values")
    if g_idx_len is not None and g_idx_len != K * 4:
        fail(kernel, "g_idx must hold K int32 values")
