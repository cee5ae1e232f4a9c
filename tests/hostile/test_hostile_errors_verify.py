"""Issue 21, round three: clean errors from the bytes entry points, ``verify`` meaning
everything a read refuses (one function per format's attribute rule), ``stats`` and
``diff`` bounded by the elements a file really holds, and the command's one line.

Files are made by the real writers (ztensor.Writer, torch.save, safetensors, numpy);
what the writer refuses is crafted by editing a real file's manifest."""
import json
import math
import struct
import subprocess
import sys
import tempfile

import cbor2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ztensor
import ztensor.numpy
from conftest import TESTS
from ztensor.tools import stats
from ztensor.formats import gguf_blocks, quantized

TMP = tempfile.gettempdir()


def cli(*argv, timeout=60):
    """The command in a child process: (exit code, stdout, stderr lines)."""
    proc = subprocess.run([sys.executable, "-m", "ztensor", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr.splitlines()


def with_manifest(path, edit):
    """Rewrite a real file's manifest (what the writer refuses to write)."""
    data = bytearray(open(path, "rb").read())
    size = struct.unpack("<Q", data[-16:-8])[0]
    manifest = cbor2.loads(bytes(data[-16 - size:-16]))
    edit(manifest)
    raw = cbor2.dumps(manifest)
    with open(path, "wb") as f:
        f.write(bytes(data[:-16 - size]) + raw + struct.pack("<Q", len(raw)) + b"ZTEN1000")


def quantized_file(path, **attributes):
    q = ztensor.quantize(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32),
                         bits=4, group_size=32)
    with ztensor.Writer(path) as w:
        w.write("q", q)
        w.write_numpy("dense", np.arange(6, dtype=np.float32))

    def edit(m):
        m["objects"]["q"]["attributes"].update(attributes)
    with_manifest(path, edit)
    return q


# ------------------------------------------------------------------ 1. bytes entry points
def test_deserialize_of_non_dense_objects_is_a_clean_error(tmp_path):
    pytest.importorskip("scipy")
    import scipy.sparse
    q = ztensor.quantize(np.ones((8, 64), np.float32), group_size=32)
    blocks = ztensor.Tensor({"blocks": np.zeros(34, np.uint8)}, shape=(32,), format="gguf_blocks",
                            attributes={"ggml_type": "Q8_0", "ggml_type_id": 8})
    for name, obj in (("sparse", scipy.sparse.csr_array(np.eye(3))), ("quantized", q),
                      ("blocks", blocks)):
        with ztensor.Writer(tmp_path / f"{name}.zt") as w:
            w.write(name, obj)
        with pytest.raises(ztensor.UnsupportedError, match="deserialize returns dense") as exc:
            ztensor.deserialize((tmp_path / f"{name}.zt").read_bytes())
        assert exc.value.path == "<bytes>" and exc.value.obj == name


def test_serialize_of_an_impossible_shape_is_a_format_error():
    for shape in ([0, 2**63], [2**62, 2**62, 0], [2**40, 2**40]):
        with pytest.raises(ztensor.FormatError, match="2\\*\\*63"):
            ztensor.serialize({"x": {"dtype": "float32", "shape": shape, "data": b""}})
    for bad in ({"dtype": ["F32"], "shape": [1], "data": b"1234"},   # unhashable dtype
                {"dtype": "float32", "shape": [1], "data": "1234"},   # text, not bytes
                {"dtype": "float32", "shape": [1]}):
        with pytest.raises(ztensor.ZTensorError):
            ztensor.serialize({"x": bad})


def test_errors_from_bytes_name_the_bytes_never_a_temp_file(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save
    good = save({"w": np.arange(4, dtype=np.float32)})
    n = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + n])
    header["w"]["data_offsets"] = [0, 1 << 40]      # runs past the file
    text = json.dumps(header).encode()
    lying = struct.pack("<Q", len(text)) + text + good[8 + n:]
    for load in (ztensor.deserialize, ztensor.numpy.load):
        with pytest.raises(ztensor.FormatError) as exc:
            load(lying)
        assert exc.value.path == "<bytes>" and TMP not in str(exc.value)
    with pytest.raises(ztensor.FormatError) as exc:  # the writer's refusal, through bytes
        ztensor.serialize({"": {"dtype": "float32", "shape": [0], "data": b""}})
    assert exc.value.path == "<bytes>" and TMP not in str(exc.value)
    with pytest.raises(ztensor.FormatError) as exc:
        ztensor.numpy.save({"": np.zeros(1)})
    assert exc.value.path == "<bytes>" and TMP not in str(exc.value)


def _seed_files():
    out = [ztensor.serialize({"a": {"dtype": "float32", "shape": [2],
                                    "data": np.ones(2, np.float32).tobytes()}})]
    try:
        from safetensors.numpy import save
    except ImportError:  # the clean-wheel job: the .zt seed alone
        return out
    return [save({"a": np.arange(6, dtype=np.float32).reshape(2, 3),
                  "b": np.ones(3, np.int8)})] + out


SEEDS = _seed_files()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(SEEDS), edits=st.lists(
    st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, 10**6))
def test_mutated_bytes_give_a_result_or_a_clean_error(seed, edits, cut):
    data = bytearray(seed)
    for at, value in edits:
        data[at % len(data)] = value
    data = bytes(data[:max(1, len(data) - cut % 16)])
    for load in (ztensor.deserialize, ztensor.numpy.load):
        try:
            load(data)
        except ztensor.ZTensorError as exc:
            assert TMP not in str(exc), exc


# ------------------------------------------------------------------ 2. stats bounds, one line
def test_stats_of_the_largest_float64_values(tmp_path):
    values = np.array([1.7e308, -1.7e308, 0.0, 1.0, np.finfo(np.float64).max])
    p = tmp_path / "big.zt"
    with ztensor.Writer(p) as w:
        w.write_numpy("x", values)
    with ztensor.Reader(p) as r:
        got = stats.tensor_stats(r, "x")
    exact = [float(v) for v in values]
    assert got["min"] == -1.7e308 and got["max"] == np.finfo(np.float64).max
    mean = sum(v / 4 for v in exact) / len(exact) * 4       # no overflow, by hand
    assert got["mean"] == pytest.approx(mean, rel=1e-12)
    std = math.ldexp(math.sqrt(sum((math.ldexp(v, -1000) - math.ldexp(mean, -1000)) ** 2
                                         for v in exact)
                               / len(exact)), 1000)
    assert got["std"] == pytest.approx(std, rel=1e-12)
    assert sum(got["histogram"]) == 5 and got["histogram"][0] == 1 and got["histogram"][-1] == 2
    code, out, err = cli("stats", p)
    assert code == 0 and err == [] and "x" in out


def test_stats_of_a_stride_zero_view_is_exact_and_instant(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "expand.pt"
    torch.save({"big": torch.full((1,), 2.5).expand(2**34),
                "grid": torch.tensor([[1.0], [-3.0]]).expand(2, 2**33)}, p)
    assert p.stat().st_size < 4096
    with ztensor.Reader(p) as r:
        big = stats.tensor_stats(r, "big")
        grid = stats.tensor_stats(r, "grid")
    assert big["count"] == 2**34 and big["mean"] == 2.5 and big["std"] == 0
    assert big["histogram"] == [2**34]
    assert grid["count"] == 2**34 and grid["mean"] == -1.0 and grid["std"] == 2.0
    assert grid["histogram"][0] == grid["histogram"][-1] == 2**33
    code, out, err = cli("stats", p, timeout=60)
    assert code == 0 and err == [] and "big" in out


def test_stats_and_diff_refuse_overlapping_views_beyond_the_budget(tmp_path):
    torch = pytest.importorskip("torch")
    p = tmp_path / "overlap.pt"
    storage = torch.arange(2**18, dtype=torch.float32)
    torch.save({"w": storage.as_strided((2**17, 2**17), (1, 1))}, p)   # 2**34 elements
    # a view reading its 1 MB storage 2**16 times over is refused when the file is
    # opened (pytorch._check_visits: at most 64 times, plus 64 MiB)
    with pytest.raises(ztensor.LimitError, match="64 times"):
        ztensor.Reader(p)
    for argv in (("stats", p), ("diff", p, p)):
        code, out, err = cli(*argv)
        assert code == 2 and len(err) == 1 and "64 times" in err[0], (argv, err)
    # within that, stats' own budget of elements still holds
    within = tmp_path / "within.pt"
    torch.save({"w": storage.as_strided((2**12, 2**12), (1, 1))}, within)  # 64 MB read
    with ztensor.Reader(within) as r:
        with pytest.raises(ztensor.LimitError, match="max-elements"):
            stats.tensor_stats(r, "w", max_elements=2**20)
    for argv in (("stats", "--max-elements", "1048576", within),):
        code, out, err = cli(*argv)
        assert code == 2 and len(err) == 1 and "--max-elements" in err[0], (argv, err)
    small = tmp_path / "small.zt"
    with ztensor.Writer(small) as w:
        w.write_numpy("v", np.arange(10.0))
    code, _, err = cli("stats", "--max-elements", "9", small)
    assert code == 2 and len(err) == 1 and "limit of 9" in err[0]
    assert cli("stats", "--max-elements", "10", small)[0] == 0


def test_diff_of_stride_zero_views_is_instant(tmp_path):
    torch = pytest.importorskip("torch")
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"w": torch.ones(1).expand(2**34)}, a)
    torch.save({"w": torch.full((1,), 2.0).expand(2**34)}, b)
    code, out, err = cli("diff", a, b)
    assert code == 1 and f"{2**34} of {2**34} values differ" in out and err == []


def test_warnings_are_one_line_and_none_on_error(tmp_path):
    """A GGUF tensor of a type this version does not know warns (kept as raw
    blocks); the command folds it into one line, drops it with -q and on error."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("norm", np.arange(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    at = data.index(b"norm") + 4 + 4 + 8               # name, n_dims, one dim: the type
    path.write_bytes(data[:at] + struct.pack("<I", 77) + data[at + 4:])
    code, out, err = cli("ls", path)
    assert code == 0 and len(err) == 1 and err[0].startswith("ztensor: warning:") \
        and "ggml type 77" in err[0]
    assert cli("ls", "-q", path)[2] == []
    code, out, err = cli("stats", path)      # over the file: skipped and said
    assert code == 0 and "skipped 1 objects" in "".join(out)
    code, out, err = cli("stats", path, "norm")  # named: no statistics, an error
    # (the path itself holds "warning": pytest names the folder after this test)
    assert code == 2 and len(err) == 1 and not err[0].startswith("ztensor: warning:")
    assert "ggml type 77" in err[0] and "warning:" not in err[0]


# ------------------------------------------------------------------ 3. one attribute rule
BAD_ATTRIBUTES = [{"bits": "4"}, {"bits": -2**15000}, {"group_size": 2**64 + 1},
                  {"bits": 0}, {"group_size": 1.5}, {"bits": None}]
IDS = ["bits-text", "bits-bignum", "group_size-2**64+1", "bits-0", "group_size-float",
       "bits-none"]


@pytest.mark.parametrize("attrs", BAD_ATTRIBUTES, ids=IDS)
def test_verify_refuses_what_no_dequantizer_accepts(tmp_path, attrs):
    p = tmp_path / "q.zt"
    quantized_file(p, **attrs)
    with ztensor.Reader(p) as r:
        assert r.read_numpy("dense").tolist() == list(range(6))   # the rest still reads
        with pytest.raises(ztensor.FormatError) as exc:
            r.read("q")
        assert exc.value.obj == "q" and exc.value.path == str(p)
        with pytest.raises(ztensor.FormatError):
            r.verify()
        problems = []
        r.verify(errors=problems)
        assert [e.obj for e in problems] == ["q"]
    code, out, err = cli("verify", p)
    lines = out.splitlines()
    assert code == 1 and err == [] and len(lines) == 2
    assert lines[0].startswith("FAILED") and "'q'" in lines[0] and "FAILED (1 problems)" in lines[1]


@pytest.mark.parametrize("attrs", BAD_ATTRIBUTES, ids=IDS)
def test_the_writer_refuses_what_a_read_refuses(tmp_path, attrs):
    q = ztensor.quantize(np.ones((16, 64), np.float32), group_size=32)
    q.attributes.update(attrs)
    with ztensor.Writer(tmp_path / "w.zt") as w:
        with pytest.raises(ztensor.FormatError):
            w.write("q", q)
        w.write_numpy("kept", np.ones(2))
    with ztensor.Reader(tmp_path / "w.zt") as r:
        assert r.keys() == ["kept"]
    # nor is such an object copied as stored (append, edits)
    p = tmp_path / "crafted.zt"
    quantized_file(p, **attrs)
    with pytest.raises(ztensor.FormatError):
        ztensor.Writer.append(p)


def test_one_function_decides_for_dequantize_read_and_writer(tmp_path):
    """check_attributes is the rule: its verdict on any attribute value is the
    dequantizer's, the read's and the writer's."""
    q = ztensor.quantize(np.ones((16, 64), np.float32), group_size=32)
    for attrs in BAD_ATTRIBUTES + [{"bits": 5}, {"pack_order": "msb_first"}]:
        t = ztensor.Tensor(dict(q.components), shape=q.shape, format="quantized_group",
                           attributes={**q.attributes, **attrs})
        with pytest.raises(ztensor.ZTensorError) as rule:
            quantized.check_attributes(t.shape, t.attributes)
        with pytest.raises(type(rule.value)) as deq:
            ztensor.dequantize(t)
        assert str(deq.value) == str(rule.value)
    # an UnsupportedError names another convention: valid, written, verified OK
    q.attributes["pack_order"] = "msb_first"
    with ztensor.Writer(tmp_path / "o.zt") as w:
        w.write("q", q)
    code, out, err = cli("verify", tmp_path / "o.zt")
    assert code == 0 and "OK" in out


@settings(max_examples=80, deadline=None)
@given(bits=st.one_of(st.integers(-2**70, 2**70), st.sampled_from([2, 3, 4, 8, 5, 32, 33]),
                      st.floats(), st.text(max_size=3), st.none()),
       group_size=st.one_of(st.integers(-2**70, 2**70), st.sampled_from([-1, 32, 64]),
                            st.floats(), st.none()))
def test_any_attribute_value_is_written_only_if_read(bits, group_size):
    """Property: whatever bits/group_size hold, the writer writes the object exactly
    when the reader's rule (quantized.validate) accepts it, and then a read and
    verify of the file succeed."""
    q = ztensor.quantize(np.ones((16, 64), np.float32), group_size=32)
    q.attributes.update(bits=bits, group_size=group_size)
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/p.zt"
        with ztensor.Writer(path) as w:
            try:
                w.write("q", q)
                written = True
            except ztensor.FormatError:
                written = False
        with ztensor.Reader(path) as r:
            if written:
                r.read("q")
                r.verify()
            else:
                assert r.keys() == []
        try:   # the reader's rule, on the arrays (an UnsupportedError is no refusal)
            quantized.validate(q.shape, q.attributes, q.components)
            verdict = True
        except ztensor.FormatError:
            verdict = False
        assert written == verdict


def test_gguf_blocks_attributes_one_rule(tmp_path):
    blocks = ztensor.Tensor({"blocks": np.zeros(34, np.uint8)}, shape=(32,),
                            format="gguf_blocks",
                            attributes={"ggml_type": "Q8_0", "ggml_type_id": 8})
    for bad in ({"ggml_type_id": "8"}, {"ggml_type_id": 2**40}, {"block_bytes": 35}):
        t = ztensor.Tensor(blocks.components, shape=blocks.shape, format="gguf_blocks",
                           attributes={**blocks.attributes, **bad})
        with pytest.raises(ztensor.FormatError):
            gguf_blocks.check_attributes(t.shape, t.attributes)
        with pytest.raises(ztensor.FormatError):
            ztensor.dequantize(t)
        with ztensor.Writer(tmp_path / "g.zt") as w:
            with pytest.raises(ztensor.FormatError):
                w.write("b", t)
    p = tmp_path / "g.zt"
    with ztensor.Writer(p) as w:
        w.write("b", blocks)
        w.write("short", ztensor.Tensor({"blocks": np.zeros(34, np.uint8)}, shape=(32,),
                                        format="gguf_blocks", attributes=blocks.attributes))

    def edit(m):
        m["objects"]["b"]["attributes"]["ggml_type_id"] = "8"
        m["objects"]["short"]["shape"] = [64]          # 34 bytes cannot hold 64 elements
    with_manifest(p, edit)
    code, out, err = cli("verify", p)
    assert code == 1 and out.count("FAILED") == 3 and err == []


# ------------------------------------------------------------------ 4. sharded verify
def test_sharded_verify_reports_every_problem(tmp_path):
    tensors = {f"t{i}": np.full(4000, i, np.float32) for i in range(4)}
    files = ztensor.save_sharded(tensors, tmp_path, max_shard_size="20kB", checksum="crc32c")
    assert len(files) == 4
    for file in files[1:3]:                 # two broken shards: a flipped data byte each
        data = bytearray((tmp_path / file).read_bytes())
        data[100] ^= 0xFF
        (tmp_path / file).write_bytes(bytes(data))
    index = tmp_path / "model.zt.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost"] = files[0]   # a tensor its shard lacks
    index.write_text(json.dumps(doc))
    code, out, err = cli("verify", tmp_path)
    lines = out.splitlines()
    assert code == 1 and err == []
    assert len(lines) == 4 and all(line.startswith("FAILED") for line in lines[:3])
    assert "ghost" in out and files[1] in out and files[2] in out
    assert "FAILED (3 problems)" in lines[-1]
    with ztensor.open_sharded(tmp_path) as s:
        with pytest.raises(ztensor.ZTensorError):
            s.verify()
        problems = []
        s.verify(errors=problems)
        assert len(problems) == 3


def test_sharded_verify_of_a_missing_shard(tmp_path):
    tensors = {f"t{i}": np.full(4000, i, np.float32) for i in range(3)}
    files = ztensor.save_sharded(tensors, tmp_path, max_shard_size="20kB")
    (tmp_path / files[1]).unlink()
    code, out, err = cli("verify", tmp_path / "model.zt.index.json")
    assert code == 1 and err == [] and out.count("FAILED") == 2 and files[1] in out
    with ztensor.open_sharded(tmp_path) as s:
        with pytest.raises(ztensor.FormatError, match="cannot open shard"):
            s.verify()


def test_stats_of_a_sparse_object_lacking_its_values_is_a_clean_error(tmp_path):
    """fuzz_cli found `ztensor stats` printing "KeyError: 'values'": stats looked up
    the component before the read checked the sparse layout."""
    sys.path.insert(0, str(TESTS))
    import crafted
    manifest = {"version": "1.2.0", "objects": {"s": {
        "shape": [2, 2], "format": "sparse_csr", "components": {
            "indices": {"dtype": "i64", "offset": 64, "length": 8},
            "indptr": {"dtype": "i64", "offset": 128, "length": 24}}}}}
    blobs = bytes(56) + np.array([0], "<i8").tobytes() + bytes(56) \
        + np.array([0, 1, 1], "<i8").tobytes()
    path = tmp_path / "s.zt"
    path.write_bytes(crafted.v1_file(manifest, blobs))
    with ztensor.Reader(path) as r, pytest.raises(ztensor.FormatError, match="lacks values"):
        stats.tensor_stats(r, "s")
    done = subprocess.run([sys.executable, "-m", "ztensor", "stats", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "lacks values" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
