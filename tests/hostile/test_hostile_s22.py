"""Session 22: what helpers 21-23 found (a shard name a server reads as ``..``,
decoded tensors a handle kept, files that cannot be mapped or read, integer scales
read as bf16, stats over a file holding an object it cannot decode, an edit that
dropped a shared file's group).  Each test names the one function that keeps its
rule."""
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import zstandard

import ztensor
from tiny_models import tiny_llama  # tests/ is on sys.path: conftest.py
from ztensor import sharded
from ztensor.formats.quantized import pack_codes


# ------------------------------------------------------------------ shard names
@pytest.mark.parametrize("name", ["..;", "..;x.zt", ".;", "s.zt;v=1", "..\uff1b"])
def test_a_shard_name_with_a_path_parameter_is_refused(tmp_path, name):
    """sharded.check_shard_name: Tomcat and Jetty strip a segment's ``;...`` before
    resolving dot segments, so ``..;`` reached the index folder's parent (fullwidth
    ``;`` becomes ``;`` under NFKC)."""
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        sharded.check_shard_name(name, "index.json")
    folder = tmp_path / "ckpt"
    ztensor.save_sharded({"a": np.arange(4.0)}, folder)
    (folder / "model.zt.index.json").write_text('{"weight_map": {"a": "%s"}}' % name)
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        with ztensor.open_sharded(folder) as r:
            r["a"]


# ------------------------------------------------------------------ safe_open's decoded tensors
def _zstd_file(path, count, nbytes):
    """``count`` float32 tensors, each one zstd frame of ``nbytes`` zeros and no seek
    table (as other writers make them), written as raw manifest bytes."""
    import struct

    import cbor2

    frame = zstandard.ZstdCompressor(level=3).compress(bytes(nbytes))
    body = bytearray(b"ZTEN1000" + bytes(56))
    objects = {}
    for i in range(count):
        offset = len(body)
        body += frame + bytes(-(len(body) + len(frame)) % 64)
        objects[f"t{i}"] = {"shape": [nbytes // 4096, 1024], "format": "dense",
                            "components": {"data": {
                                "dtype": "f32", "offset": offset, "length": len(frame),
                                "uncompressed_length": nbytes, "encoding": "zstd"}}}
    manifest = cbor2.dumps({"version": "1.2.0", "objects": objects})
    path.write_bytes(bytes(body) + manifest + struct.pack("<Q", len(manifest)) + b"ZTEN1000")
    return path


def test_slicing_every_zstd_tensor_in_turn_holds_one_decoded(tmp_path):
    """safe._Slice._selected: a tensor without a seek table is decoded once for its
    slices and kept until another is sliced.  Six one-row slices of a 50 KB file
    held 6 x 256 MiB; here four of 16 MiB hold at most one."""
    path = _zstd_file(tmp_path / "z.zt", 4, 16 << 20)
    tracemalloc.start()
    try:
        with ztensor.safe_open(str(path), framework="np") as f:
            rows = [f.get_slice(f"t{i}")[0:1] for i in range(4)]
            held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(r.shape == (1, 1024) and not r.any() for r in rows)
    assert held < 24 << 20, held


# ------------------------------------------------------------------ files that cannot be mapped or read
@pytest.mark.skipif(not os.path.isfile("/sys/kernel/notes"), reason="Linux's sysfs is not here")
def test_a_regular_file_that_cannot_be_mapped_is_read_by_pread():
    """source.Source._open_file: sysfs (and some FUSE and network mounts) refuse
    mmap; the file is read as mmap=False reads it, and judged on its bytes (this one
    is no zTensor file) instead of a bare OSError naming nothing."""
    with pytest.raises(ztensor.FormatError, match="/sys/kernel/notes: not a zTensor file"):
        ztensor.Reader("/sys/kernel/notes")


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="Linux's procfs is not here")
def test_a_file_whose_reads_fail_is_a_read_error_naming_it():
    """foreign.sniff and source._pread_exactly_into: an EIO (here /proc/self/mem
    at offset 0) is a ReadError, an OSError and a ZTensorError, naming the file."""
    for open_it in (ztensor.Reader, lambda p: ztensor.safe_open(p, framework="np")):
        with pytest.raises(ztensor.ReadError, match="/proc/self/mem: the system refused") as err:
            open_it("/proc/self/mem")
        assert isinstance(err.value, OSError) and err.value.errno is not None


# ------------------------------------------------------------------ quantized scales
def test_uint16_scales_are_not_read_as_bf16_bits(tmp_path):
    """quantized._float_bytes: a Tensor's plain uint16 scales are integers, refused on
    write (dequantize read them as bf16 bits: 15360 gave 0.0078); bf16 bits given the
    type 'bf16' are bf16, and read back so without ml_dtypes."""
    codes = np.full((8, 2), 9)  # code 9 over the symmetric zero 8: W = scale
    scales = np.array([[0x3F80, 0x4000]], np.uint16)  # bf16 1.0 and 2.0
    comps = {"packed_weight": pack_codes(codes, 4), "scales": scales}
    attrs = {"bits": 4, "group_size": 8, "packing": "8_per_i32"}
    plain = ztensor.Tensor(comps, shape=(2, 8), format="quantized_group", attributes=attrs)
    with pytest.raises(ztensor.UnsupportedError, match="uint16 integers"):
        ztensor.dequantize(plain, dtype=np.float32)
    path = tmp_path / "q.zt"
    with pytest.raises(ztensor.UnsupportedError, match="'q'.*scales.*uint16"):
        with ztensor.Writer(str(path)) as w:
            w.write("q", plain)
    typed = ztensor.Tensor(comps, shape=(2, 8), format="quantized_group", attributes=attrs,
                           types={"scales": "bf16"})
    with ztensor.Writer(str(path)) as w:
        w.write("q", typed)
    with ztensor.Reader(str(path)) as r:
        assert r.metadata("q").components["scales"].dtype == "bf16"
        weight = ztensor.dequantize(r.read("q"), dtype=np.float32)
    np.testing.assert_array_equal(weight, [[1.0] * 8, [2.0] * 8])


# ------------------------------------------------------------------ stats over the whole file
def test_stats_over_a_file_skips_a_valid_object_it_cannot_decode(tmp_path):
    """cli.cmd_stats: a GGUF type kept as raw blocks (what convert makes of IQ*
    tensors) is valid (verify says OK); over the whole file stats skips and lists it,
    named it is an error.  Before, the whole-file stats exited 2."""
    path = tmp_path / "raw.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("dense", np.arange(4.0))
        w.write("raw_q", ztensor.Tensor(
            {"blocks": np.zeros(18, np.uint8)}, shape=(32,), format="gguf_blocks",
            attributes={"ggml_type": "IQ9_X", "ggml_type_id": 99, "block_elements": 32,
                        "block_bytes": 18}))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "ztensor", *args], capture_output=True,
                              text=True, timeout=120)

    whole = run("stats", "--json", str(path))
    assert whole.returncode == 0, whole.stderr
    import json
    report = json.loads(whole.stdout)
    assert [t["name"] for t in report["tensors"]] == ["dense"]
    assert report["tensors"][0]["max"] == 3.0
    assert report["skipped"] == [{"name": "raw_q", "format": "gguf_blocks"}]
    named = run("stats", str(path), "raw_q")
    assert named.returncode == 2 and "IQ9_X" in named.stderr
    assert len(named.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ an edit keeps the group
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file another owner and group needs root")
def test_an_edit_keeps_the_replaced_files_owner_and_group(tmp_path):
    """atomic._keep_owner: the replacement of a file shared through its group (660,
    another group and owner) is that group's and owner's still.  Before, an edit made
    it the editor's, and the group lost its access."""
    path = tmp_path / "shared.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("a", np.zeros(4, np.float32))
    os.chown(path, 65534, 1234)
    os.chmod(path, 0o660)
    ztensor.replace_tensor(str(path), "a", np.ones(4, np.float32))
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (65534, 1234, 0o660)
    with ztensor.Reader(str(path)) as r:
        np.testing.assert_array_equal(r.read_numpy("a"), np.ones(4, np.float32))


# ------------------------------------------------------------------ dask's chunking keywords
def test_dask_chunking_keywords_are_whole_counts(tmp_path):
    """dask._check_chunking: max_chunks=nan compared False with every count and
    switched the chunk guard off (100,000 chunks where max_chunks=100 refuses);
    None failed deep in the plan; numpy's integers were refused with a message that
    contradicted itself."""
    zdask = pytest.importorskip("ztensor.dask")
    pytest.importorskip("dask")
    path = tmp_path / "rows.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("x", np.arange(1000.0).reshape(1000, 1))
    for bad in ({"max_chunks": float("nan")}, {"max_chunks": None}, {"max_chunks": 1.5},
                {"max_chunks": True}, {"max_chunks": 0}, {"rows": "5"}, {"chunk_bytes": 2.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            zdask.from_zt(str(path), "x", **{"rows": 1, **bad})
    arr = zdask.from_zt(str(path), "x", rows=np.int64(100), max_chunks=np.int32(10))
    assert arr.numblocks == (10, 1)
    np.testing.assert_array_equal(arr.compute(), np.arange(1000.0).reshape(1000, 1))
    with pytest.raises(ztensor.LimitError, match="max_chunks"):
        zdask.from_zt(str(path), "x", rows=1, max_chunks=np.int64(999))


# ------------------------------------------------------------------ transformers' config
@pytest.mark.parametrize("where", ["config.json", "text_config", "keyword"])
def test_a_config_declaring_a_billion_layers_is_refused_before_it_is_made(tmp_path, where):
    """transformers._refuse_layer_counts: Gemma2's config (as Qwen2's, GPT-OSS's...)
    builds a list a layer in its constructor; num_hidden_layers=10**9 held
    from_pretrained for minutes and gigabytes before the parameter count could
    refuse it.  A real count still loads."""
    import json
    import time

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from ztensor import transformers as ztf

    config = transformers.Gemma2Config(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, vocab_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(config)
    folder = tmp_path / "gemma"
    ztf.save_pretrained(model, folder)
    loaded = ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    raw = json.loads((folder / "config.json").read_text())
    raw.pop("layer_types", None)
    kwargs = {}
    if where == "config.json":
        raw["num_hidden_layers"] = 10**9
    elif where == "text_config":
        raw["text_config"] = {"num_hidden_layers": 10**9}
    else:
        kwargs["num_hidden_layers"] = 10**9
    (folder / "config.json").write_text(json.dumps(raw))
    start = time.monotonic()
    with pytest.raises(ztensor.LimitError, match="config.json.*num_hidden_layers=1000000000"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder, **kwargs)
    assert time.monotonic() - start < 30


# ------------------------------------------------------------------ superseded weights
@pytest.mark.parametrize("shards", [1, 3])
def test_save_pretrained_over_a_transformers_checkpoint_removes_its_weights(tmp_path, shards):
    """sharded.transformers_weights (save_pretrained's ``supersedes``): the new
    config.json describes the new weights only.  Before, transformers' own
    model.safetensors stayed beside it, and transformers loaded the old weights under
    the new config without a word.  A file of another kind (the tokenizer) stays."""
    old, new = tiny_llama(0), tiny_llama(1)
    from ztensor import transformers as ztf

    folder = tmp_path / "ckpt"
    old.save_pretrained(folder, max_shard_size="20KB" if shards > 1 else "5GB")
    (folder / "tokenizer.json").write_text("{}")
    before = set(os.listdir(folder))
    assert any(n.endswith(".safetensors") for n in before)
    ztf.save_pretrained(new, folder)
    after = set(os.listdir(folder))
    assert not any(n.endswith((".safetensors", ".safetensors.index.json")) for n in after), after
    assert "tokenizer.json" in after and "model.zt.index.json" in after
    import torch
    loaded = ztf.from_pretrained(type(new), folder)
    assert torch.equal(loaded.lm_head.weight, new.lm_head.weight)


def test_convert_over_a_transformers_checkpoint_removes_its_weights(tmp_path):
    """convert's replaced files: a model folder converted over another model's
    transformers checkpoint (--force) leaves only the new weights beside the new
    config.json."""
    old, new = tiny_llama(0), tiny_llama(1)
    source, target = tmp_path / "new", tmp_path / "out"
    new.save_pretrained(source)
    old.save_pretrained(target)
    ztensor.convert(str(source), str(target), force=True)
    names = set(os.listdir(target))
    assert "model.safetensors" not in names and "config.json" in names, names
    from ztensor import transformers as ztf
    import torch
    loaded = ztf.from_pretrained(type(new), target)
    assert torch.equal(loaded.lm_head.weight, new.lm_head.weight)


# ------------------------------------------------------------------ JSON numbers beyond a float
def test_an_index_number_beyond_a_float_is_refused_not_written_as_infinity(tmp_path):
    """names.load_json's parse_float, atomic.write_json_atomically's allow_nan=False:
    1e999 read as inf, and convert then wrote ``Infinity`` into an index its own
    reader refused."""
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    from ztensor.io import atomic

    source = tmp_path / "in"
    source.mkdir()
    save_file({"a": np.ones(3, np.float32)}, str(source / "s1.safetensors"))
    (source / "model.safetensors.index.json").write_text(
        '{"metadata": {"x": 1e999}, "weight_map": {"a": "s1.safetensors"}}')
    with pytest.raises(ztensor.FormatError, match="1e999 is beyond the range of a float"):
        ztensor.open_sharded(source)
    with pytest.raises(ztensor.FormatError, match="1e999"):
        ztensor.convert(str(source), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    (source / "model.safetensors.index.json").write_text(
        '{"metadata": {"x": 1e300}, "weight_map": {"a": "s1.safetensors"}}')
    with ztensor.open_sharded(source) as r:
        np.testing.assert_array_equal(r["a"], np.ones(3, np.float32))
    with pytest.raises(ValueError, match="x.json.*JSON"):
        atomic.write_json_atomically(str(tmp_path / "x.json"), {"x": float("inf")})
    assert not (tmp_path / "x.json").exists()
