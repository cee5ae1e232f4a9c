"""quantized_group / GPTQ: the kernels against an independent oracle (AutoGPTQ's
dequantization formula, transcribed below in numpy), C against the fallback,
file round trips, and lying sizes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from backends import MODULES
from conftest import random_gptq
from ztensor import kernels
from ztensor._native import contract as _contract
from ztensor._native import fallback as _fallback
from ztensor.formats.quantized import to_gptq

try:
    import ml_dtypes
except ImportError:  # e.g. on s390x: bf16 expectations come from the fallback instead
    ml_dtypes = None


def bf16_bits(values):
    """bf16 rounding of float32 values: ml_dtypes when present, else our fallback
    (which test_kernels_convert checks against ml_dtypes where it exists)."""
    if ml_dtypes is not None:
        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    return _fallback.f32_to_bf16(values)


# ------------------------------------------------------------------ an independent oracle
def autogptq_dequant(qweight, qzeros, scales, g_idx, bits, v1=True):
    """AutoGPTQ's torch fallback (qlinear_cuda_old / dequantize), step by step:
    shift each packed word by [0, bits, 2*bits, ...], mask, add 1 to v1 zeros then
    mask, weight = scales[g_idx] * (weight - zeros[g_idx]), returned as [N, K]."""
    wf = np.arange(0, 32, bits, dtype=np.int64)
    qz = qzeros.astype(np.int64) & 0xFFFFFFFF
    zeros = (qz[:, :, None] >> wf[None, None, :])
    if v1:
        zeros = zeros + 1
    zeros = (zeros & (2 ** bits - 1)).reshape(scales.shape)
    qw = qweight.astype(np.int64) & 0xFFFFFFFF
    weight = (qw[:, None, :] >> wf[None, :, None]) & (2 ** bits - 1)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    w = scales[g_idx].astype(np.float32) * (weight - zeros[g_idx]).astype(np.float32)
    return w.T


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_dequantize_matches_autogptq_formula(bits, act_order, fmt):
    rng = np.random.default_rng(bits * 10 + act_order)
    N, K, gs = 64, 256, 64
    qweight, qzeros, scales, g_idx = random_gptq(rng, N, K, bits, gs, act_order)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    if act_order:
        tensors["g_idx"] = g_idx
    oracle = autogptq_dequant(qweight, qzeros, scales, g_idx, bits, v1=fmt == "gptq")
    got = ztensor.dequantize(tensors, bits=bits, group_size=gs, checkpoint_format=fmt,
                             dtype=np.float32)
    np.testing.assert_array_equal(got, oracle)
    got16 = ztensor.dequantize(tensors, bits=bits, group_size=gs, checkpoint_format=fmt)
    np.testing.assert_array_equal(got16, oracle.astype(np.float16))
    gotbf = ztensor.dequantize(tensors, bits=bits, group_size=gs, checkpoint_format=fmt,
                               dtype="bfloat16")
    np.testing.assert_array_equal(gotbf.view(np.uint16), bf16_bits(oracle))


# ------------------------------------------------------------------ 3-bit: AutoGPTQ's layout
# AutoGPTQ packs 3-bit codes 32 to 3 words (QuantLinear.pack in qlinear_cuda_old) and
# unpacks them with a shift table and two fix-ups for the codes that straddle words.
# Both transcribed here in numpy, independently of ztensor's bit-stream code.
WF3 = np.array([[0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0],
                [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
                [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0]], np.int64)


def autogptq_pack3(intweight):
    """QuantLinear.pack's 3-bit branch: codes [K, N] -> uint32 words [K*3/32, N]."""
    K, N = intweight.shape
    q = np.zeros((K // 32 * 3, N), np.uint64)
    iw = intweight.astype(np.uint64)
    i = row = 0
    while row < q.shape[0]:
        for j in range(i, i + 10):
            q[row] |= iw[j] << np.uint64(3 * (j - i))
        i += 10
        q[row] |= iw[i] << np.uint64(30)
        row += 1
        q[row] |= (iw[i] >> np.uint64(2)) & np.uint64(1)
        i += 1
        for j in range(i, i + 10):
            q[row] |= iw[j] << np.uint64(3 * (j - i) + 1)
        i += 10
        q[row] |= iw[i] << np.uint64(31)
        row += 1
        q[row] |= (iw[i] >> np.uint64(1)) & np.uint64(3)
        i += 1
        for j in range(i, i + 10):
            q[row] |= iw[j] << np.uint64(3 * (j - i) + 2)
        i += 10
        row += 1
    return (q & np.uint64(0xFFFFFFFF)).astype(np.uint32)


def autogptq_unpack3(words):
    """The 3-bit branch of AutoGPTQ's dequantization, down axis 0: [R, C] -> [R*32/3, C]."""
    w = words.astype(np.int64) & 0xFFFFFFFF
    w = w.reshape(w.shape[0] // 3, 3, 1, -1)
    x = w >> WF3[None, :, :, None]
    x[:, 0, 10] = (x[:, 0, 10] & 0x3) | ((x[:, 1, 0] << 2) & 0x4)
    x[:, 1, 11] = (x[:, 1, 11] & 0x1) | ((x[:, 2, 0] << 1) & 0x6)
    x &= 0x7
    codes = np.concatenate([x[:, 0, :11], x[:, 1, 1:12], x[:, 2, 1:11]], axis=1)
    return codes.reshape(-1, words.shape[1])


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_3bit_matches_autogptq(act_order, fmt):
    rng = np.random.default_rng(31 + act_order)
    N, K, gs = 64, 256, 64
    G = K // gs
    codes = rng.integers(0, 8, (K, N))
    qweight = autogptq_pack3(codes).view(np.int32)
    np.testing.assert_array_equal(autogptq_unpack3(qweight), codes)  # the oracle agrees
    zero_codes = rng.integers(0, 8, (G, N))
    stored = (zero_codes - 1) & 7 if fmt == "gptq" else zero_codes
    qzeros = autogptq_pack3(stored.T).T.copy().view(np.int32)  # packed along N
    scales = (rng.random((G, N)) * 0.02 + 1e-3).astype(np.float16)
    g_idx = (rng.permutation(K) // gs if act_order else np.arange(K) // gs).astype(np.int32)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    if act_order:
        tensors["g_idx"] = g_idx
    unpacked_zeros = autogptq_unpack3(qzeros.T).T
    z = (unpacked_zeros + 1) & 7 if fmt == "gptq" else unpacked_zeros
    np.testing.assert_array_equal(z, zero_codes)
    oracle = (scales[g_idx].astype(np.float32)
              * (codes - z[g_idx]).astype(np.float32)).T
    for dtype, want in ((np.float32, oracle), (np.float16, oracle.astype(np.float16))):
        got = ztensor.dequantize(tensors, bits=3, group_size=gs, checkpoint_format=fmt,
                                 dtype=dtype)
        np.testing.assert_array_equal(got, want)
    obj = ztensor.from_gptq(qweight, qzeros, scales, g_idx if act_order else None, bits=3,
                            group_size=gs, checkpoint_format=fmt)
    assert obj.attributes["packing"] == "32_per_3_i32"
    np.testing.assert_array_equal(ztensor.dequantize(obj, dtype=np.float32), oracle)
    back = to_gptq(obj)  # always AutoGPTQ's v1 qzeros
    np.testing.assert_array_equal(back["qweight"], qweight)
    np.testing.assert_array_equal(autogptq_unpack3(back["qzeros"].T).T,
                                  (zero_codes - 1) & 7)


def test_3bit_packing_is_autogptqs():
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 8, (96, 5))
    from ztensor.formats.quantized import pack_codes
    np.testing.assert_array_equal(pack_codes(codes, 3).view(np.uint32), autogptq_pack3(codes))
    words = autogptq_pack3(codes)
    for impl in IMPLS:
        out = np.empty(codes.shape[0], np.uint8)
        impl.unpack_codes(words[:, 2].astype("<u4").view(np.uint8), out.size, 3, out)
        np.testing.assert_array_equal(out, codes[:, 2])


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_quantize_every_width_through_a_file(tmp_path, bits):
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((64, 192)).astype(np.float32)
    q = ztensor.quantize(w, bits=bits, group_size=32)
    with ztensor.Writer(tmp_path / "q.zt") as wr:
        wr.write("q", q)
    with ztensor.Reader(tmp_path / "q.zt") as r:
        got = ztensor.dequantize(r.read("q"), dtype=np.float32)
    steps = q.components["scales"].astype(np.float32).T.repeat(32, axis=1)
    assert (np.abs(got - w) <= steps * 1.0001).all()  # within one step everywhere
    codes = to_gptq(q)
    assert codes["qweight"].shape == (192 * bits // 32, 64)


def test_group_size_minus_one_is_one_group_per_row(tmp_path):
    """GPTQ's group_size=-1: quantize, store (-1 kept, as configs say), read, dequantize."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 96)).astype(np.float32)  # N=32: GPTQ's whole qzeros words
    q = ztensor.quantize(w, bits=3, group_size=-1)
    assert q.attributes["group_size"] == -1 and q.components["scales"].shape == (1, 32)
    want = ztensor.dequantize(ztensor.quantize(w, bits=3, group_size=96), dtype=np.float32)
    with ztensor.Writer(tmp_path / "q.zt") as wr:
        wr.write("q", q)
    with ztensor.Reader(tmp_path / "q.zt") as r:
        np.testing.assert_array_equal(ztensor.dequantize(r.read("q"), dtype=np.float32), want)
    g = to_gptq(q)
    got = ztensor.dequantize(g, bits=3, group_size=-1, checkpoint_format="gptq", dtype=np.float32)
    np.testing.assert_array_equal(got, want)


def test_dequantize_takes_torch_dtypes():
    torch = pytest.importorskip("torch")
    q = ztensor.quantize(np.random.default_rng(2).standard_normal((8, 64)), bits=3,
                         group_size=32)
    for tdtype, ndtype in ((torch.float16, np.float16), (torch.float32, np.float32)):
        np.testing.assert_array_equal(ztensor.dequantize(q, dtype=tdtype),
                                      ztensor.dequantize(q, dtype=ndtype))


IMPLS = MODULES


@settings(max_examples=80)
@given(st.sampled_from([2, 3, 4, 8]), st.integers(1, 9), st.integers(1, 6), st.sampled_from([1, 3, 8, 32, 128]),
       st.sampled_from(["none", "f16", "f32", "bf16", "v1", "v2"]),
       st.sampled_from([0, 1, 2]), st.sampled_from([0, 1, 2]), st.booleans(), st.integers(0, 2**31))
def test_c_kernel_matches_fallback(bits, nw, nk, group_size, zero_kind, scale_type, out_type,
                                   act_order, seed):
    rng = np.random.default_rng(seed)
    per = _contract.block_codes(bits)
    N, K = per * nw, per * nk
    G = -(-K // group_size)
    qweight = rng.integers(0, 2**32, _contract.stream_words(K, bits) * N,
                           dtype=np.uint64).astype("<u4")
    zwords = G * _contract.stream_words(N, bits)
    scales = {0: (rng.random(G * N) - 0.5).astype("<f4"),
              1: (rng.random(G * N) - 0.5).astype("<f2"),
              2: ((rng.random(G * N) - 0.5).astype(np.float32).view(np.uint32) >> 16)
              .astype("<u2")}[scale_type]
    zero_type, zeros = {
        "none": (kernels.ZERO_NONE, None),
        "f16": (kernels.F16, (rng.random(G * N) * 15).astype("<f2")),
        "f32": (kernels.F32, (rng.random(G * N) * 15).astype("<f4")),
        "bf16": (kernels.BF16, (rng.integers(0, 15, G * N).astype(np.float32).view(np.uint32)
                                >> 16).astype("<u2")),
        "v1": (kernels.ZERO_PACKED_V1, rng.integers(0, 2**32, zwords, dtype=np.uint64)
               .astype("<u4")),
        "v2": (kernels.ZERO_PACKED_V2, rng.integers(0, 2**32, zwords, dtype=np.uint64)
               .astype("<u4")),
    }[zero_kind]
    g_idx = rng.integers(0, G, K).astype("<i4") if act_order else None
    outs = []
    for impl in IMPLS:
        out = np.zeros(N * K * (4 if out_type == 0 else 2), np.uint8)
        rows = sorted({0, N // 2, N})
        for lo, hi in zip(rows, rows[1:]):  # split rows like the thread pool does
            impl.dequant_rows(qweight.view(np.uint8), scales.view(np.uint8),
                              None if zeros is None else zeros.view(np.uint8),
                              None if g_idx is None else g_idx.view(np.uint8),
                              K, N, G, group_size, bits, scale_type, zero_type, out_type, out,
                              lo, hi)
        outs.append(out)
    if len(outs) == 2:
        a, b = (o.view(np.float32 if out_type == 0 else np.uint16) for o in outs)
        if out_type == 0:
            np.testing.assert_array_equal(a, b)
        else:  # compare as values so NaN payloads do not matter
            assert ((a == b) | ((a & 0x7FFF) > (0x7C00 if out_type == 1 else 0x7F80))).all()


def test_quantize_write_read_dequantize(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((96, 384)).astype(np.float32)
    for sym in (False, True):
        q = ztensor.quantize(w, bits=4, group_size=128, sym=sym)
        assert ("zeros" in q.components) != sym
        dense = ztensor.dequantize(q, dtype=np.float32)
        scale = q.components["scales"].astype(np.float32).T.repeat(128, axis=1)
        err = np.abs(dense - w)
        # rounding costs at most half a step; clipping at a group's ends at most one
        assert (err <= scale + 1e-6).all() and err.mean() < 0.3 * scale.mean()
        with ztensor.Writer(tmp_path / "q.zt") as wr:
            wr.write("layer.q", q, checksum="crc32c")
        with ztensor.Reader(tmp_path / "q.zt", verify=True) as r:
            obj = r.read("layer.q")
            meta = r.metadata("layer.q")
        assert meta.format == "quantized_group" and meta.shape == (96, 384)
        assert obj.attributes["pack_order"] == "lsb_first" and obj.attributes["bits"] == 4
        assert obj.components["packed_weight"].shape == (48, 96)
        assert obj.components["scales"].shape == (3, 96)
        np.testing.assert_array_equal(ztensor.dequantize(obj, dtype=np.float32), dense)


def test_gptq_checkpoint_stored_without_dequantizing(tmp_path):
    rng = np.random.default_rng(5)
    qweight, qzeros, scales, g_idx = random_gptq(rng, 64, 256, 4, 64, act_order=True)
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
    expected = ztensor.dequantize(tensors, bits=4, group_size=64, checkpoint_format="gptq")
    obj = ztensor.from_gptq(qweight, qzeros, scales, g_idx, bits=4, group_size=64)
    np.testing.assert_array_equal(obj.components["packed_weight"], qweight)
    with ztensor.Writer(tmp_path / "g.zt") as wr:
        wr.write("proj", obj)
    with ztensor.Reader(tmp_path / "g.zt") as r:
        back = r.read("proj")
    np.testing.assert_array_equal(ztensor.dequantize(back), expected)


def test_threads_give_the_same_result():
    rng = np.random.default_rng(9)
    q = ztensor.quantize(rng.standard_normal((257, 512)).astype(np.float32), group_size=32)
    one = ztensor.dequantize(q, threads=1)
    for threads in (2, 3, 16, 1000):
        np.testing.assert_array_equal(ztensor.dequantize(q, threads=threads), one)


def lying(q, **changes):
    comps = dict(q.components)
    attrs = dict(q.attributes)
    shape = changes.pop("shape", q.shape)
    for key, value in changes.items():
        if key in ("bits", "group_size", "packing", "pack_axis", "pack_order"):
            attrs[key] = value
        elif value is None:
            comps.pop(key)
        else:
            comps[key] = value
    return ztensor.Tensor(comps, shape=shape, format="quantized_group", attributes=attrs)


@pytest.mark.parametrize("change,error,words", [
    ({"packed_weight": np.zeros(5, np.int32)}, ztensor.FormatError, "packed_weight holds 5"),
    ({"scales": np.zeros(7, np.float16)}, ztensor.FormatError, "scales holds 7"),
    ({"zeros": np.zeros((9, 9), np.float16)}, ztensor.FormatError, "zeros holds 81"),
    ({"g_idx": np.full(256, 9, np.int32)}, ztensor.FormatError, "g_idx values"),
    ({"g_idx": np.zeros(3, np.int32)}, ztensor.FormatError, "g_idx holds 3"),
    ({"bits": 5}, ztensor.UnsupportedError, "bits=5"),
    ({"group_size": 0}, ztensor.FormatError, "group_size"),
    ({"group_size": True}, ztensor.FormatError, "group_size"),
    ({"shape": (32, 250)}, ztensor.FormatError, "multiple of 8"),
    ({"shape": (32,)}, ztensor.FormatError, "2-D"),
    ({"packed_weight": np.zeros((32, 32), np.float32)}, ztensor.FormatError, "int32 words"),
    ({"scales": np.zeros((2, 32), np.int8)}, ztensor.UnsupportedError, "scales must be"),
    ({"scales": None}, ztensor.FormatError, "no 'scales'"),
    # attribute values of the wrong type or size: clean errors, never TypeError,
    # OverflowError or ValueError from the arithmetic
    ({"bits": 4.0}, ztensor.FormatError, "bits must be an integer"),
    ({"bits": "4"}, ztensor.FormatError, "bits must be an integer"),
    # no convention could mean a width outside [1, 32]: malformed, not unsupported
    ({"bits": 2**20000}, ztensor.FormatError, "integer of 20001 bits"),
    ({"group_size": 2**64}, ztensor.FormatError, "group_size must be -1 or"),
    ({"group_size": 128.0}, ztensor.FormatError, "group_size must be an integer"),
    ({"group_size": -2}, ztensor.FormatError, "group_size must be -1 or"),
    # conventions we do not implement: refused, never dequantized to wrong weights
    ({"pack_order": "msb_first"}, ztensor.UnsupportedError, "pack_order='msb_first'"),
    ({"pack_axis": 1}, ztensor.UnsupportedError, "pack_axis=1"),
    ({"packing": "4_per_i32"}, ztensor.UnsupportedError, "packing='4_per_i32'"),
    ({"packing": 8}, ztensor.UnsupportedError, "packing=8"),
])
def test_lying_sizes_are_refused_before_any_kernel(change, error, words):
    q = ztensor.quantize(np.ones((32, 256), np.float32), group_size=128)
    with pytest.raises(error, match=words):
        ztensor.dequantize(lying(q, **change))


def test_msb_first_object_is_refused_not_silently_wrong(tmp_path):
    """An object packed MSB-first, and saying so, dequantized as LSB-first gives
    weights off by up to the whole code range: it must be an UnsupportedError."""
    w = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    q = ztensor.quantize(w, bits=4, group_size=32)
    words = np.asarray(q.components["packed_weight"]).view(np.uint32)
    nibbles = [(words >> (4 * j)) & 0xF for j in range(8)]
    msb = sum(n.astype(np.uint32) << (4 * (7 - j)) for j, n in enumerate(nibbles))
    q.components["packed_weight"] = msb.astype(np.uint32).view(np.int32)
    q.attributes["pack_order"] = "msb_first"
    with ztensor.Writer(tmp_path / "msb.zt") as wr:
        wr.write("w", q)           # a valid object: written and read as it is
    with ztensor.Reader(tmp_path / "msb.zt") as r:
        back = r.read("w")
        assert back.attributes["pack_order"] == "msb_first"
        with pytest.raises(ztensor.UnsupportedError, match="msb_first"):
            ztensor.dequantize(back)


def test_group_size_minus_one_set_on_a_stored_object_is_one_group_per_row():
    w = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    q = ztensor.quantize(w, bits=4, group_size=64)
    q.attributes["group_size"] = -1
    np.testing.assert_array_equal(
        ztensor.dequantize(q, dtype=np.float32),
        ztensor.dequantize(ztensor.quantize(w, bits=4, group_size=64), dtype=np.float32))


def test_out_of_range_g_idx_fails_read_and_verify(tmp_path):
    q = ztensor.quantize(np.ones((32, 256), np.float32), group_size=128)
    q.components["g_idx"] = np.full(256, 5, np.int32)  # G = 2
    path = tmp_path / "g.zt"
    with ztensor.Writer(path) as w:  # the writer refuses what a read refuses
        with pytest.raises(ztensor.FormatError, match="g_idx"):
            w.write("q", q)
        q.components["g_idx"] = np.zeros(256, np.int32)
        w.write("q", q)
    with ztensor.Reader(path) as r:  # then the file lies: g_idx patched in place
        comp = r.metadata("q").components["g_idx"]
    data = bytearray(path.read_bytes())
    data[comp.offset:comp.offset + comp.length] = np.full(256, 5, "<i4").tobytes()
    path.write_bytes(bytes(data))
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError, match="g_idx"):
            r.read("q")
    from ztensor.tools import cli
    assert cli.main(["verify", str(path)]) == 1


def test_gptq_mapping_checks():
    rng = np.random.default_rng(1)
    qweight, qzeros, scales, _ = random_gptq(rng, 64, 256, 4, 64, False)
    base = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    with pytest.raises(ValueError, match="checkpoint_format"):
        ztensor.dequantize(base, bits=4, group_size=64)
    with pytest.raises(ztensor.FormatError, match="qzeros holds"):
        ztensor.dequantize({**base, "qzeros": qzeros[:1]}, bits=4, group_size=64,
                           checkpoint_format="gptq")
    with pytest.raises(ztensor.FormatError, match="need 'qzeros'"):
        ztensor.dequantize({"qweight": qweight, "scales": scales}, bits=4, group_size=64,
                           checkpoint_format="gptq")


@pytest.mark.skipif(ml_dtypes is None, reason="compares with ml_dtypes arrays")
def test_fp8_and_bf16_via_type_and_dtype(tmp_path, monkeypatch):
    values = np.linspace(-300, 300, 50, dtype=np.float32).reshape(5, 10)
    with ztensor.Writer(tmp_path / "t.zt") as w:
        for t in ("f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz", "bf16"):
            w.write_numpy(t, values, type=t, compress=t.endswith("uz"))
        with pytest.raises(ValueError, match="type must be"):
            w.write_numpy("bad", values, type="f4_e2m1")
    ml = {"f8_e4m3fn": ml_dtypes.float8_e4m3fn, "f8_e5m2": ml_dtypes.float8_e5m2,
          "f8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "f8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
          "bf16": ml_dtypes.bfloat16}
    with ztensor.Reader(tmp_path / "t.zt") as r:
        for t, ml_type in ml.items():
            expect = values.astype(ml_type).astype(np.float32)
            np.testing.assert_array_equal(r.read_numpy(t, dtype=np.float32), expect)
            np.testing.assert_array_equal(r.read_numpy(t, dtype=np.float16),
                                          expect.astype(np.float16))
            assert r[t].dtype == np.dtype(ml_type)
        assert r.metadata("bf16").storage_dtype == "bf16" and r.metadata("f8_e5m2").type == "f8_e5m2"
    monkeypatch.setenv("ZTENSOR_NO_ML_DTYPES", "1")
    from ztensor import dtypes
    dtypes.ml_dtypes_module.cache_clear()
    try:
        with ztensor.Writer(tmp_path / "u.zt") as w:
            w.write_numpy("bf", values, type="bf16")
        with ztensor.Reader(tmp_path / "u.zt") as r:
            np.testing.assert_array_equal(r["bf"], values.astype(ml_dtypes.bfloat16)
                                          .astype(np.float32))
            t = r.read("bf")
            assert t.components["data"].dtype == np.uint16 and t.types == {"data": "bf16"}
            with ztensor.Writer(tmp_path / "v.zt") as w:
                w.write("bf", t)
        a, b = (tmp_path / "u.zt").read_bytes(), (tmp_path / "v.zt").read_bytes()
        assert a == b
    finally:
        monkeypatch.delenv("ZTENSOR_NO_ML_DTYPES")
        dtypes.ml_dtypes_module.cache_clear()


def test_worked_example_in_docs():
    """docs/quantized_group.md, computed by hand there."""
    t = ztensor.Tensor(
        {"packed_weight": np.array([[0x87654321, 0x0F0F0F0F]], np.uint32).view(np.int32),
         "scales": np.array([[0.5, 2.0]], np.float16),
         "zeros": np.array([[8, 7.5]], np.float16)},
        shape=(2, 8), format="quantized_group",
        attributes={"bits": 4, "group_size": 8, "packing": "8_per_i32"})
    np.testing.assert_array_equal(ztensor.dequantize(t, dtype=np.float32), [
        [-3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0], [15, -15, 15, -15, 15, -15, 15, -15]])


def test_fp8_type_means_encode_and_saturate_is_torchs_rule(tmp_path):
    path = tmp_path / "f8.zt"
    with ztensor.Writer(path) as w:
        with pytest.raises(ztensor.FormatError, match="ambiguous|already be encoded"):
            w.write_numpy("codes", np.array([56, 64, 126], np.uint8), type="f8_e4m3fn")
        w.write_numpy("v", np.array([1, 2, 448, 1e6, -np.inf, np.nan], np.float32),
                      type="f8_e4m3fn")
        w.write_numpy("s", np.array([1, 2, 448, 1e6, -np.inf, np.nan], np.float32),
                      type="f8_e4m3fn", saturate=True)
        w.write_numpy("i", np.array([1, 2, 3], np.int32), type="f8_e5m2")  # values
    with ztensor.Reader(path) as r:
        v = r.read_numpy("v", dtype=np.float32)
        s = r.read_numpy("s", dtype=np.float32)
        assert v[:3].tolist() == [1, 2, 448] and np.isnan(v[3]) and np.isnan(v[4])
        assert s[:5].tolist() == [1, 2, 448, 448, -448] and np.isnan(s[5])
        assert r.read_numpy("i", dtype=np.float32).tolist() == [1, 2, 3]
    torch = pytest.importorskip("torch")
    x = torch.tensor([1, 2, 448, 1e6, -float("inf")])
    assert s[:5].tolist() == x.to(torch.float8_e4m3fn).float().tolist()


def test_dequantize_gives_the_numpy_dtype_of_a_torch_dtype():
    torch = pytest.importorskip("torch")
    q = ztensor.quantize(np.ones((8, 64), np.float32), group_size=32)
    assert ztensor.dequantize(q, dtype=torch.float16).dtype == np.float16
    assert ztensor.dequantize(q, dtype=torch.float32).dtype == np.float32
