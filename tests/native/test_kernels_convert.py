"""FP8 and bf16 conversions, bit for bit (NaN patterns included): exhaustive against
ml_dtypes (the oracle) for the C kernels and the numpy fallback, and C against the
fallback everywhere, including hosts without ml_dtypes (s390x has no build of it)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from backends import PARAMS
from ztensor import kernels
from ztensor._native import fallback as _fallback

try:
    import ml_dtypes
except ImportError:  # e.g. on s390x; the C-vs-fallback tests still run
    ml_dtypes = None
needs_ml = pytest.mark.skipif(ml_dtypes is None, reason="the ml_dtypes oracle is not installed")

FP8 = {"f8_e4m3fn": "float8_e4m3fn", "f8_e5m2": "float8_e5m2",
       "f8_e4m3fnuz": "float8_e4m3fnuz", "f8_e5m2fnuz": "float8_e5m2fnuz"}
IMPLS = PARAMS


def ml(name):
    return getattr(ml_dtypes, FP8[name])


def decode(impl, codes, name, out_dtype):
    out = np.empty(codes.size, out_dtype)
    impl.fp8_decode(codes, out.view(np.uint8), kernels.FP8_KINDS.index(name),
                    0 if out_dtype == np.float32 else 1)
    return out


def encode(impl, values, name):
    out = np.empty(values.size, np.uint8)
    impl.fp8_encode(np.ascontiguousarray(values).view(np.uint8), out,
                    kernels.FP8_KINDS.index(name), 0 if values.dtype == np.float32 else 1)
    return out


ALL_CODES = np.arange(256, dtype=np.uint8)


@needs_ml
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(FP8))
@pytest.mark.parametrize("out_dtype,bits", [(np.float32, np.uint32), (np.float16, np.uint16)])
def test_fp8_decode_all_256_codes_bit_exact(impl, name, out_dtype, bits):
    oracle = ALL_CODES.view(ml(name)).astype(out_dtype)
    got = decode(impl, ALL_CODES, name, out_dtype)
    np.testing.assert_array_equal(got.view(bits), oracle.view(bits))


def edge_floats():
    """float32 values around every FP8 rounding boundary, max, subnormals, specials."""
    out = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e30, 3.4e38]
    for name in FP8:
        values = np.unique(_fallback.fp8_table(name))  # checked against ml_dtypes above
        values = values[np.isfinite(values)]
        mids = (values[:-1].astype(np.float64) + values[1:]) / 2
        for v in np.concatenate([values, mids.astype(np.float32)]):
            out += [v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))]
    payload_nans = np.array([0x7FC00001, 0x7F800001, 0xFFC00000, 0xFFA00000],
                            np.uint32).view(np.float32)
    return np.concatenate([np.array(out, np.float32), payload_nans, -np.array(out, np.float32)])


@needs_ml
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_encode_float32_edges_bit_exact(impl, name):
    values = edge_floats()
    with np.errstate(invalid="ignore", over="ignore"):
        oracle = values.astype(ml(name)).view(np.uint8)
    np.testing.assert_array_equal(encode(impl, values, name), oracle)


@needs_ml
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_encode_every_float16_bit_exact(impl, name):
    values = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(invalid="ignore", over="ignore"):
        oracle = values.astype(ml(name)).view(np.uint8)
    np.testing.assert_array_equal(encode(impl, values, name), oracle)


@needs_ml
@given(hnp.arrays(np.uint32, st.integers(0, 300)), st.sampled_from(sorted(FP8)))
def test_fp8_encode_random_float32_bit_exact(bits, name):
    values = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        oracle = values.astype(ml(name)).view(np.uint8)
    np.testing.assert_array_equal(encode(kernels, values, name), oracle)
    np.testing.assert_array_equal(encode(_fallback, values, name), oracle)


@needs_ml
@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_decode_every_pattern(impl):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = np.empty(65536, np.float32)
    impl.bf16_decode(bits.view(np.uint8), out.view(np.uint8))
    np.testing.assert_array_equal(out.view(np.uint32),
                                  bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32))


@needs_ml
@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_encode_edges_and_random(impl):
    rng = np.random.default_rng(7)
    values = np.concatenate([edge_floats(), rng.integers(0, 2**32, 100000, dtype=np.uint64)
                             .astype(np.uint32).view(np.float32)])
    # every bf16 rounding boundary: halfway points and their neighbours
    halves = (np.arange(0, 65536, 3, dtype=np.uint32) << 16) | 0x8000
    values = np.concatenate([values, halves.view(np.float32), (halves + 1).view(np.float32),
                             (halves - 1).view(np.float32)])
    out = np.empty(values.size, np.uint16)
    impl.bf16_encode(values.view(np.uint8), out.view(np.uint8))
    with np.errstate(invalid="ignore", over="ignore"):
        oracle = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(out, oracle)


@needs_ml
def test_convert_module_round_trips_shapes():
    from ztensor.io import floats
    values = np.linspace(-500, 500, 24, dtype=np.float32).reshape(2, 3, 4)
    codes = floats.float_to_fp8(values, "f8_e4m3fn")
    assert codes.shape == values.shape and codes.dtype == np.uint8
    back = floats.fp8_to_float(codes, "f8_e4m3fn")
    np.testing.assert_array_equal(back, values.astype(ml_dtypes.float8_e4m3fn).astype(np.float32))
    big_endian = values.astype(">f4")
    np.testing.assert_array_equal(floats.float_to_fp8(big_endian, "f8_e5m2"),
                                  values.astype(ml_dtypes.float8_e5m2).view(np.uint8))
    with pytest.raises(ValueError, match="unknown FP8 type"):
        floats.fp8_to_float(codes, "f8_e3m4")


C_AND_FALLBACK = pytest.mark.skipif(kernels.backend != "c", reason="needs the compiled kernels")


@C_AND_FALLBACK
@pytest.mark.parametrize("name", sorted(FP8))
def test_c_matches_fallback_on_every_code_and_every_float16(name):
    from ztensor._native import _kernels
    for out_dtype, bits in ((np.float32, np.uint32), (np.float16, np.uint16)):
        np.testing.assert_array_equal(decode(_kernels, ALL_CODES, name, out_dtype).view(bits),
                                      decode(_fallback, ALL_CODES, name, out_dtype).view(bits))
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    np.testing.assert_array_equal(encode(_kernels, halves, name), encode(_fallback, halves, name))
    edges = edge_floats()
    np.testing.assert_array_equal(encode(_kernels, edges, name), encode(_fallback, edges, name))


@C_AND_FALLBACK
def test_c_matches_fallback_for_bf16():
    from ztensor._native import _kernels
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    outs = []
    for impl in (_kernels, _fallback):
        out = np.empty(65536, np.float32)
        impl.bf16_decode(bits.view(np.uint8), out.view(np.uint8))
        outs.append(out.view(np.uint32))
    np.testing.assert_array_equal(*outs)
    values = np.concatenate([edge_floats(), np.random.default_rng(3).integers(
        0, 2**32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    encoded = []
    for impl in (_kernels, _fallback):
        out = np.empty(values.size, np.uint16)
        impl.bf16_encode(values.view(np.uint8), out.view(np.uint8))
        encoded.append(out)
    np.testing.assert_array_equal(*encoded)


def test_known_values_without_any_oracle():
    """A few values worked out by hand, so a host without ml_dtypes still checks
    absolute correctness, not only agreement between our two implementations."""
    from ztensor.io import floats
    codes = np.array([0x00, 0x01, 0x38, 0x7E, 0x7F, 0x80, 0xB8, 0xFE], np.uint8)
    got = floats.fp8_to_float(codes, "f8_e4m3fn")
    assert got[:4].tolist() == [0.0, 2.0 ** -9, 1.0, 448.0] and np.isnan(got[4])
    assert got[5] == 0 and np.signbit(got[5]) and got[6:].tolist() == [-1.0, -448.0]
    assert floats.fp8_to_float(np.array([0x7C, 0x80], np.uint8), "f8_e5m2").tolist() == \
        [np.inf, -0.0]
    enc = floats.float_to_fp8(np.array([1.0, 464.0, 465.0, -0.0, 1e-3], np.float32), "f8_e4m3fn")
    assert enc.tolist() == [0x38, 0x7E, 0x7F, 0x80, 0x01]
    assert floats.float_to_fp8(np.array([-0.0, 300.0], np.float32), "f8_e4m3fnuz").tolist() == \
        [0x00, 0x80]
    assert floats.float32_to_bf16(np.array([1.00390625, 1.01171875, 3.4028235e38], np.float32)
                                   ).tolist() == [0x3F80, 0x3F82, 0x7F80]
    assert floats.bf16_to_float32(np.array([0x3F80, 0xC000], np.uint16)).tolist() == [1.0, -2.0]
