"""The hand-written AVX2 paths (csrc/quant.c int4 -> f16 lookups, csrc/byteswap.c
streaming swap) give the same bits as the portable loops they shortcut, on the same
machine: every case runs twice, with ztensor.kernels.set_simd(False) and True.  On
CPUs without AVX2 (and on s390x) both runs take the portable loops."""
import contextlib

import numpy as np
import pytest

import ztensor
from conftest import random_gptq
from ztensor import kernels

pytestmark = pytest.mark.skipif(kernels.backend != "c", reason="compiled kernels only: "
                                "the numpy fallback has no SIMD paths to compare")


@contextlib.contextmanager
def simd(on):
    old = kernels.set_simd(on)
    try:
        yield
    finally:
        kernels.set_simd(old)


def both_ways(fn):
    with simd(False):
        portable = fn()
    with simd(True):
        fast = fn()
    return portable, fast


def gptq(rng, N, K, group_size, act_order):
    qweight, qzeros, scales, g_idx = random_gptq(rng, N, K, 4, group_size, act_order)
    q = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    if act_order:
        q["g_idx"] = g_idx
    return q


@pytest.mark.parametrize("K,group_size", [(256, 128), (512, 64), (192, 8), (128, 128),
                                          (320, 40), (1024, 1024)])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_int4_to_f16_is_bit_identical(K, group_size, fmt):
    rng = np.random.default_rng(K + group_size)
    q = gptq(rng, 24, K, group_size, act_order=False)
    for out_dtype in (np.float16, "bfloat16", np.float32):
        portable, fast = both_ways(lambda: ztensor.dequantize(
            q, bits=4, group_size=group_size, checkpoint_format=fmt, dtype=out_dtype,
            threads=1))
        assert portable.tobytes() == fast.tobytes()


def test_int4_with_act_order_is_bit_identical():
    rng = np.random.default_rng(3)
    q = gptq(rng, 16, 256, 64, act_order=True)
    portable, fast = both_ways(lambda: ztensor.dequantize(
        q, bits=4, group_size=64, checkpoint_format="gptq", dtype=np.float16))
    assert portable.tobytes() == fast.tobytes()


@pytest.mark.parametrize("width", [2, 4, 8])
@pytest.mark.parametrize("src_shift,dst_shift", [(0, 0), (3, 0), (0, 8), (5, 24)])
def test_streaming_byte_swap_is_exact(width, src_shift, dst_shift):
    n = (5 << 20) + 3 * width  # above the streaming threshold, with a tail
    rng = np.random.default_rng(width)
    base = rng.integers(0, 256, n + 64, dtype=np.uint8)
    src = base[src_shift:src_shift + n]
    expected = src.view(f"<u{width}").byteswap().view(np.uint8) if src_shift % width == 0 \
        else np.frombuffer(src.tobytes(), f"<u{width}").byteswap().view(np.uint8)
    for on in (False, True):
        buf = np.zeros(n + 64, np.uint8)
        dst = buf[dst_shift:dst_shift + n]
        with simd(on):
            kernels.bswap(src, dst, width)
        assert np.array_equal(dst, expected), on


def test_streaming_byte_swap_in_place():
    data = np.random.default_rng(1).integers(0, 256, 6 << 20, dtype=np.uint8)
    expected = data.view("<u8").byteswap().view(np.uint8)
    with simd(True):
        kernels.bswap(data, data, 8)
    assert np.array_equal(data, expected)
