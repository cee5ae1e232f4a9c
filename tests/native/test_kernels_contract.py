"""ztensor/_native/contract.py: every public kernel refuses a bad call the same way on
both backends, before a pointer is taken (hostile input, round two, class 3).
Each call here segfaulted, read out of bounds or raised a different error type per
backend before."""
import numpy as np
import pytest

import ztensor
from backends import MODULES
from ztensor import kernels
from ztensor._native import status as _status

IMPLS = MODULES

U8 = np.zeros(64, np.uint8)


def outcomes(call):
    """(exception type, message) per backend."""
    seen = []
    for impl in IMPLS:
        try:
            call(impl)
        except Exception as exc:  # the point: which type, on each backend
            seen.append((type(exc), str(exc)))
        else:
            seen.append((None, ""))
    return seen


@pytest.mark.parametrize("call", [
    lambda k: k.bswap(U8[:12], np.zeros(12, np.uint8), 3),
    lambda k: k.bswap(U8[:8], np.zeros(8, np.uint8), -1),
    lambda k: k.bswap(U8[:8], np.zeros(4, np.uint8), 2),
    lambda k: k.fp8_decode(U8[:4], np.zeros(16, np.uint8), 9, 0),
    lambda k: k.fp8_decode(U8[:4], np.zeros(16, np.uint8), 0, 2),
    lambda k: k.fp8_encode(np.zeros(16, np.uint8), U8[:4].copy(), 0, 7),
    lambda k: k.unpack_codes(U8[:8], 16, 5, np.zeros(16, np.uint8)),
    lambda k: k.unpack_codes(U8[:4], 16, 4, np.zeros(16, np.uint8)),
    lambda k: k.bf16_decode(U8[:3], np.zeros(6, np.uint8)),
    lambda k: k.cbor_scan(b"\xa0", 0),
    lambda k: k.copy_spans(U8, np.zeros(8, np.uint8), [60], [0], [8]),
    lambda k: k.copy_spans(U8, np.zeros(8, np.uint8), [0], [4], [8]),
    lambda k: k.copy_spans(U8, np.zeros(8, np.uint8), [(1 << 64) - 1], [0], [2]),
    lambda k: k.copy_spans(U8, np.zeros(8, np.uint8), [0, 1], [0], [1]),
    lambda k: k.copy(U8[:8], np.zeros(4, np.uint8)),
    lambda k: k.copy(U8[:0], np.zeros(4, np.uint8)),
    lambda k: (lambda b: k.copy(b[:40], b[8:48]))(np.zeros(64, np.uint8)),
    lambda k: (lambda b: k.copy(b[8:48], b[:40]))(np.zeros(64, np.uint8)),
    lambda k: k.ggml_dequant(34, U8[:34], np.zeros(128, np.uint8)),
    lambda k: k.ggml_dequant(8, U8[:33], np.zeros(128, np.uint8)),
    lambda k: k.ggml_dequant(8, U8[:34], np.zeros(64, np.uint8)),
], ids=["bswap-width-3", "bswap-negative", "bswap-lengths", "fp8-kind-9", "fp8-to-bf16",
        "fp8-src-type-7", "unpack-bits-5", "unpack-short", "bf16-odd", "cbor-depth-0",
        "copy-past-src", "copy-past-dst", "copy-wraps", "copy-counts", "copy-lengths",
    "copy-empty-src", "copy-overlap-ahead", "copy-overlap-behind", "ggml-type",
        "ggml-partial-block", "ggml-short-out"])
def test_bad_calls_raise_the_same_error_on_both_backends(call):
    seen = outcomes(call)
    assert all(t is ztensor.KernelArgumentError for t, _ in seen), seen
    assert len({m for _, m in seen}) == 1, seen
    assert issubclass(ztensor.KernelArgumentError, ValueError)
    assert issubclass(ztensor.KernelArgumentError, ztensor.ZTensorError)


def test_copy_spans_copies_on_both_backends():
    src = np.arange(64, dtype=np.uint8)
    for impl in IMPLS:
        dst = np.zeros(16, np.uint8)
        impl.copy_spans(src, dst, np.array([10, 0, 63], np.uint64),
                        np.array([0, 8, 15], np.uint64), np.array([5, 3, 1], np.uint64))
        assert dst.tolist() == [10, 11, 12, 13, 14, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 63]


@pytest.mark.parametrize("simd", [True, False])
def test_copy_copies_every_byte_on_both_backends(simd):
    """kernels.copy against numpy at lengths around the streaming threshold (1 MiB,
    csrc/copy.c) and the 128-byte loop, at odd offsets of both buffers: the streamed
    path must match byte for byte, and touch nothing outside the destination."""
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, (1 << 20) + 4096, dtype=np.uint8)
    old = kernels.set_simd(simd)
    try:
        for impl in IMPLS:
            for n in (0, 1, 127, 129, (1 << 20) - 1, 1 << 20, (1 << 20) + 77):
                for so, do in ((0, 0), (3, 17), (31, 1)):
                    dst = np.full(n + 64, 0xA5, np.uint8)
                    impl.copy(src[so : so + n], dst[do : do + n])
                    assert np.array_equal(dst[do : do + n], src[so : so + n]), (impl, n, so, do)
                    assert (dst[:do] == 0xA5).all() and (dst[do + n :] == 0xA5).all()
            same = src.copy()
            impl.copy(same, same)  # one buffer given twice: nothing to move
            assert np.array_equal(same, src)
    finally:
        kernels.set_simd(old)


def dequant_args(**over):
    """A valid 4-bit call: K=8, N=8, G=1; then the override."""
    args = dict(qweight=np.zeros(32, np.uint8), scales=np.zeros(16, np.uint8), zeros=None,
                g_idx=None, K=8, N=8, G=1, group_size=8, bits=4, scale_type=1,
                zero_type=16, out_type=0, out=np.zeros(256, np.uint8), row_begin=0, row_end=8)
    args.update(over)
    return args


HUGE = 1 << 62


@pytest.mark.parametrize("over", [
    # products that wrap in size_t to the real buffer sizes: the segfault
    dict(K=8 + (1 << 61), G=1),
    dict(N=8 + (1 << 62), row_end=8),
    dict(K=HUGE, N=HUGE, G=HUGE),
    dict(G=(1 << 63) + 1),
    dict(K=-8),
    dict(row_begin=4, row_end=2),
    dict(row_end=9),
    dict(bits=5),
    dict(bits=True),
    dict(scale_type=5),
    dict(zero_type=17, zeros=np.zeros(3, np.uint8)),
    dict(g_idx=np.zeros(4, np.uint8)),
    dict(group_size=0),
], ids=lambda d: ",".join(f"{k}={v if not hasattr(v, 'shape') else v.shape}"
                          for k, v in d.items()))
def test_dequant_rows_refuses_sizes_that_do_not_fit(over):
    seen = outcomes(lambda k: k.dequant_rows(**dequant_args(**over)))
    assert all(t is ztensor.KernelArgumentError for t, _ in seen), seen


@pytest.mark.parametrize("value", [1, 7, 2**31 - 1, -1, -(2**31)])
def test_group_index_out_of_range_is_a_format_error(value):
    g_idx = np.zeros(8, "<i4")
    g_idx[5] = value
    seen = outcomes(lambda k: k.dequant_rows(**dequant_args(g_idx=g_idx.view(np.uint8))))
    assert all(t is ztensor.FormatError for t, _ in seen), seen
    assert len({m for _, m in seen}) == 1, seen


def test_valid_group_index_still_dequantizes():
    g_idx = np.zeros(8, "<i4").view(np.uint8)
    seen = outcomes(lambda k: k.dequant_rows(**dequant_args(g_idx=g_idx)))
    assert all(t is None for t, _ in seen), seen


def test_status_numbers_match_the_c_header():
    if kernels.backend != "c":
        pytest.skip("the C header's numbers come from the compiled extension")
    from ztensor._native import _kernels
    assert _kernels.STATUS_CODES == _status.NAMES
