"""GGUF import: files written by llama.cpp's own Python writer (package ``gguf``),
our block table checked against theirs, and lying files refused cleanly."""
import struct

import numpy as np
import pytest

import ztensor
from ztensor.foreign import gguf_file as zgguf
from ztensor.tools.cli import main

gguf = pytest.importorskip("gguf")


def test_block_table_matches_llama_cpp():
    for type_id, (name, block, nbytes, _) in zgguf.GGML_TYPES.items():
        theirs = gguf.GGMLQuantizationType(type_id)
        assert theirs.name == name
        assert gguf.GGML_QUANT_SIZES[theirs] == (block, nbytes), name


@pytest.fixture
def gguf_file(tmp_path):
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.context_length", 4096)
    w.add_string("general.name", "tiny")
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25, 2.0])
    rng = np.random.default_rng(0)
    tensors = {"tok_embd.weight": rng.standard_normal((8, 64)).astype(np.float32),
               "norm.weight": rng.standard_normal(64).astype(np.float16),
               "ids": np.arange(10, dtype=np.int32)}
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    bf16_bits = (rng.standard_normal(64).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("bf", bf16_bits, raw_shape=(64,), raw_dtype=gguf.GGMLQuantizationType.BF16)
    q8 = rng.integers(0, 256, 2 * 34 * 2, dtype=np.uint8)          # 2 rows x 64 values
    w.add_tensor("q8", q8.reshape(2, 68), raw_shape=(2, 68),  # bytes per row, as gguf takes it
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, tensors, bf16_bits, q8


def test_convert_gguf(gguf_file, tmp_path):
    path, tensors, bf16_bits, q8 = gguf_file
    assert main(["convert", str(path), str(tmp_path / "m.zt"), "-q"]) == 0
    with ztensor.Reader(tmp_path / "m.zt", verify=True) as r:
        for name, arr in tensors.items():
            np.testing.assert_array_equal(r[name], arr)
            assert r.metadata(name).shape == arr.shape
        assert r.metadata("bf").storage_dtype == "bf16"
        np.testing.assert_array_equal(r.read("bf").components["data"].view(np.uint16), bf16_bits)
        q = r.read("q8")
        assert q.format == "gguf_blocks" and q.shape == (2, 64)
        assert q.attributes["ggml_type"] == "Q8_0" and q.attributes["block_bytes"] == 34
        np.testing.assert_array_equal(q.components["blocks"], q8)
        assert r.attributes["gguf.general.name"] == "tiny"
        assert r.attributes["gguf.llama.context_length"] == 4096
        assert r.attributes["gguf.tokenizer.ggml.scores"] == [0.5, -1.25, 2.0]


def lie(data, old, new):
    i = data.index(old)
    return data[:i] + new + data[i + len(old):]


def test_lying_gguf_files_fail_cleanly(gguf_file, tmp_path, capsys):
    path, *_ = gguf_file
    data = path.read_bytes()
    name_at = data.index(b"tok_embd.weight")
    cases = {
        "magic": b"GGUX" + data[4:],
        "version": data[:4] + struct.pack("<I", 9) + data[8:],
        "truncated": data[: len(data) // 2],
        "count": data[:8] + struct.pack("<Q", 1 << 40) + data[16:],
        "dims": data[:name_at + 15] + struct.pack("<I", 99) + data[name_at + 19:],
        "offset": data[:name_at + 15 + 4 + 16 + 4] + struct.pack("<Q", 1 << 40)
        + data[name_at + 15 + 4 + 16 + 4 + 8:],
    }
    for label, bad in cases.items():
        p = tmp_path / f"{label}.gguf"
        p.write_bytes(bad)
        code = main(["convert", str(p), str(tmp_path / f"{label}.zt"), "-q"])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and err.startswith("ztensor: "), label
        assert not (tmp_path / f"{label}.zt").exists(), label
    # an unknown ggml type is not a lie: the tensor is kept as raw bytes, with a warning
    unknown = data[:name_at + 15 + 4 + 16] + struct.pack("<I", 77) \
        + data[name_at + 15 + 4 + 16 + 4:]
    p = tmp_path / "unknown.gguf"
    p.write_bytes(unknown)
    capsys.readouterr()
    # the command folds Python's warnings into one line of its own (docs/cli.md)
    assert main(["convert", str(p), str(tmp_path / "unknown.zt")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ztensor: warning:") and "ggml type 77" in err[0]
    with ztensor.Reader(tmp_path / "unknown.zt") as r:
        assert r.metadata("tok_embd.weight").format == "gguf_blocks"


def test_key_value_arrays_whole_and_unknown_types_kept(tmp_path):
    path = tmp_path / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    tokens = [f"tok{i}" for i in range(32000)]
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.scores", [float(i) / 8 for i in range(32000)])
    w.add_tensor("norm", np.arange(8, dtype=np.float32))
    tq = getattr(gguf.GGMLQuantizationType, "TQ1_0", None)
    if tq is not None:
        assert int(tq) not in zgguf.GGML_TYPES  # a type this version does not know
        block, nbytes = gguf.GGML_QUANT_SIZES[tq]
        raw = np.arange(2 * nbytes, dtype=np.uint8)
        w.add_tensor("ternary", raw.reshape(1, 2 * nbytes), raw_shape=(1, 2 * nbytes),
                     raw_dtype=tq)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.warns(UserWarning, match="ggml type"):
        r = ztensor.Reader(path)
    with r:
        assert r.attributes["gguf.tokenizer.ggml.tokens"] == tokens
        assert r.attributes["gguf.tokenizer.ggml.scores"][8] == 1.0
        np.testing.assert_array_equal(r["norm"], np.arange(8, dtype=np.float32))
        if tq is not None:
            t = r.read("ternary")
            assert t.format == "gguf_blocks" and t.attributes["ggml_type_id"] == int(tq)
            assert np.asarray(t.components["blocks"])[:2 * nbytes].tolist() == \
                raw.tolist()[:2 * nbytes]
    out = tmp_path / "vocab.zt"
    assert main(["convert", "-q", str(path), str(out)]) == 0  # warnings folded, -q: none
    with ztensor.Reader(out) as z:              # nothing lost on the way to .zt
        assert z.attributes["gguf.tokenizer.ggml.tokens"] == tokens


# the f16 fields of each block type (scales and mins): finite values, so every output
# is a number and the comparison below can be bit for bit
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(rng, qtype, rows, row_elements):
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * row_elements // block
    blocks = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    for at in F16_FIELDS[qtype.name]:
        blocks[:, at:at + 2] = (rng.standard_normal(n) * 0.1).astype(np.float16) \
            .view(np.uint8).reshape(n, 2)
    return blocks.reshape(rows, -1)


def test_block_types_dequantize_exactly_as_gguf_py(tmp_path):
    """Every block type gguf.py decodes, written by gguf's own writer, converted and
    dequantized by ztensor (both the API and the command): the same float32 bits."""
    rng = np.random.default_rng(1)
    path = tmp_path / "q.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    written = {}
    for name in F16_FIELDS:
        qtype = gguf.GGMLQuantizationType[name]
        blocks = random_blocks(rng, qtype, 3, 512)
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
        written[name] = gguf.quants.dequantize(blocks, qtype).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["convert", str(path), str(tmp_path / "q.zt"), "-q"]) == 0
    with ztensor.Reader(tmp_path / "q.zt") as r:
        for name, expected in written.items():
            obj = r.read(name)
            assert obj.format == "gguf_blocks" and obj.shape == (3, 512)
            got = ztensor.dequantize(obj, dtype=np.float32, threads=2)
            assert got.shape == expected.shape
            assert got.tobytes() == expected.tobytes(), name
            half = ztensor.dequantize(obj, dtype=np.float16)
            np.testing.assert_array_equal(half, expected.astype(np.float16))
    assert main(["dequantize", str(tmp_path / "q.zt"), str(tmp_path / "d.zt"), "--dtype",
                 "float32", "-q"]) == 0
    with ztensor.Reader(tmp_path / "d.zt") as r:
        for name, expected in written.items():
            assert r.read_numpy(name).tobytes() == expected.tobytes(), name


def test_undecodable_and_lying_blocks(tmp_path):
    from ztensor.tensor import Tensor
    blocks = np.zeros(34, np.uint8)
    obj = Tensor({"blocks": blocks}, shape=(32,), format="gguf_blocks",
                 attributes={"ggml_type": "TQ1_0", "ggml_type_id": 34})
    with pytest.raises(ztensor.UnsupportedError, match="TQ1_0"):
        ztensor.dequantize(obj)
    short = Tensor({"blocks": blocks[:30]}, shape=(32,), format="gguf_blocks",
                   attributes={"ggml_type": "Q8_0", "ggml_type_id": 8})
    with pytest.raises(ztensor.FormatError, match="do not hold"):
        ztensor.dequantize(short)


# ------------------------------------------------------------------ .gguf output
def gguf_contents(path):
    """(key -> (value types, value), tensor name -> (ggml type, shape, bytes)) as
    gguf-py's own reader sees a file."""
    r = gguf.GGUFReader(str(path))
    fields = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            value = [f.contents(i) for i in range(len(f.data))]
        else:
            value = f.contents()
        fields[f.name] = (list(f.types), value)
    tensors = {t.name: (t.tensor_type.name, [int(d) for d in t.shape], bytes(t.data))
               for t in r.tensors}
    return fields, tensors


def test_gguf_round_trip_keeps_types_values_and_blocks(tmp_path):
    rng = np.random.default_rng(4)
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.context_length", 4096)
    w.add_int64("llama.big", -(1 << 40))
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(100)])
    w.add_array("tokenizer.ggml.token_type", [1, 2, 3])
    w.add_custom_alignment(64)
    w.add_tensor("f32", rng.standard_normal((4, 32)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(32).astype(np.float16))
    w.add_tensor("i32", np.arange(7, dtype=np.int32))
    bf = rng.integers(0, 2**15, 64, dtype=np.uint16)
    w.add_tensor("bf", bf, raw_shape=(64,), raw_dtype=gguf.GGMLQuantizationType.BF16)
    for name in ("Q4_0", "Q6_K"):
        qtype = gguf.GGMLQuantizationType[name]
        blocks = random_blocks(rng, qtype, 2, 256)
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    tq = getattr(gguf.GGMLQuantizationType, "TQ1_0", None)
    if tq is not None:  # a type our reader does not know: kept raw, written back raw
        block, nbytes = gguf.GGML_QUANT_SIZES[tq]
        w.add_tensor("ternary", np.arange(2 * nbytes, dtype=np.uint8).reshape(1, -1),
                     raw_shape=(1, 2 * nbytes), raw_dtype=tq)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["convert", "-q", str(path), str(tmp_path / "m.zt")]) == 0
    assert main(["convert", "-q", str(tmp_path / "m.zt"), str(tmp_path / "back.gguf")]) == 0
    before, after = gguf_contents(path), gguf_contents(tmp_path / "back.gguf")
    assert after[0] == before[0]           # every key, its value types and its value
    assert after[1] == before[1]           # every tensor: ggml type, shape, bytes
    # and the data section follows the recorded alignment
    assert gguf.GGUFReader(str(tmp_path / "back.gguf")).alignment == 64


def test_other_files_to_gguf(tmp_path):
    """An .npz (no architecture, no GGUF types recorded) and a zTensor file with
    plain attributes: typed from their values."""
    arrays = {"w": np.arange(12, dtype=np.float64).reshape(3, 4), "n": np.arange(3, dtype=np.int8)}
    np.savez(tmp_path / "a.npz", **arrays)
    assert main(["convert", "-q", str(tmp_path / "a.npz"), str(tmp_path / "a.gguf")]) == 0
    fields, tensors = gguf_contents(tmp_path / "a.gguf")
    assert fields == {}
    assert tensors["w"][:2] == ("F64", [4, 3]) and tensors["w"][2] == arrays["w"].astype("<f8").tobytes()
    with ztensor.Writer(tmp_path / "b.zt", attributes={"name": "x", "layers": 3,
                                                       "ids": [1, -2], "eps": 1e-5}) as w:
        w.write_numpy("e", np.ones(4, np.float32))
    assert main(["convert", "-q", str(tmp_path / "b.zt"), str(tmp_path / "b.gguf")]) == 0
    fields, _ = gguf_contents(tmp_path / "b.gguf")
    T = gguf.GGUFValueType
    assert fields["name"] == ([T.STRING], "x") and fields["layers"] == ([T.INT32], 3)
    assert fields["ids"] == ([T.ARRAY, T.INT32], [1, -2]) and fields["eps"] == ([T.FLOAT64], 1e-5)


@pytest.mark.parametrize("make,message", [
    (lambda w: w.write_numpy("u", np.arange(3, dtype=np.uint8)), "'u8' has no GGUF"),
    (lambda w: w.write("q", ztensor.quantize(np.ones((8, 64), np.float32), bits=4,
                                             group_size=32)), "quantized_group object"),
    (lambda w: w.write_numpy("e", np.ones(2, np.float32), attributes={"a": 1}),
     "per-tensor attributes"),
])
def test_what_gguf_cannot_hold_is_refused(tmp_path, make, message, capsys):
    with ztensor.Writer(tmp_path / "x.zt") as w:
        make(w)
    with pytest.raises(ztensor.UnsupportedError, match=message):
        ztensor.convert(tmp_path / "x.zt", tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
    assert main(["convert", "-q", str(tmp_path / "x.zt"), str(tmp_path / "y.gguf")]) != 0
    assert "y.gguf" not in " ".join(p.name for p in tmp_path.iterdir())
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_maps_as_attributes_are_refused(tmp_path):
    with ztensor.Writer(tmp_path / "m.zt", attributes={"cfg": {"a": 1}}) as w:
        w.write_numpy("e", np.ones(2, np.float32))
    with pytest.raises(ztensor.UnsupportedError, match="'cfg'"):
        ztensor.convert(tmp_path / "m.zt", tmp_path / "m.gguf")
