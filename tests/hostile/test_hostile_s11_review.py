"""Breaks a review of session 10's hardening found: each test failed before its fix."""
import io
import math
import os

import numpy as np
import pytest

import ztensor
from http_servers import NOT_FOUND, raw, serving, serving_files  # noqa: F401  (the fixture)

torch = pytest.importorskip("torch")


# ------------------------------------------------------------------ file objects
def test_a_file_object_source_reads_a_component_larger_than_one_piece(tmp_path):
    """Reads from a file object go in pieces of 64 MiB; readinto was handed the whole
    rest of the buffer and a 70 MiB tensor was refused as 'claims more bytes'."""
    path = tmp_path / "big.zt"
    values = np.arange(70 << 18, dtype=np.float32)          # 70 MiB
    with ztensor.Writer(str(path)) as w:
        w.add("a", values)
    with open(path, "rb") as f, ztensor.Reader(f) as r:
        assert np.array_equal(r.read_numpy("a"), values)

    class Unbuffered(io.RawIOBase):       # a file object whose readinto fills all it can
        def __init__(self, data):
            self.data = data
            self.pos = 0

        def readable(self):
            return True

        def seekable(self):
            return True

        def seek(self, offset, whence=io.SEEK_SET):
            self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos,
                        io.SEEK_END: len(self.data)}[whence] + offset
            return self.pos

        def tell(self):
            return self.pos

        def readinto(self, buffer):
            n = min(len(buffer), len(self.data) - self.pos)
            buffer[:n] = self.data[self.pos:self.pos + n]
            self.pos += n
            return n

    with ztensor.Reader(Unbuffered(path.read_bytes())) as r:
        assert np.array_equal(r.read_numpy("a"), values)


# ------------------------------------------------------------------ read_into
@pytest.mark.parametrize("kind", ["sparse", "nested", "meta"])
def test_read_into_a_tensor_without_plain_memory_is_a_clear_refusal(tmp_path, kind):
    """A sparse or nested destination raised torch's bare RuntimeError from
    data_ptr() in the dict form, and a wrong 'elements share memory' alone; two meta
    tensors were said to share memory (both at address 0)."""
    path = str(tmp_path / "t.zt")
    with ztensor.Writer(path) as w:
        w.add("a", np.ones((4, 4), np.float32))
        w.add("b", np.ones((4, 4), np.float32))

    def make():
        if kind == "sparse":
            return torch.eye(4).to_sparse()
        if kind == "nested":
            with pytest.warns(UserWarning) if torch.__version__ < "2" else _quiet():
                return torch.nested.nested_tensor([torch.ones(4, 4)])
        return torch.empty(4, 4, device="meta")

    words = {"sparse": "sparse", "nested": "nested", "meta": "meta device"}[kind]
    with ztensor.Reader(path) as r:
        with pytest.raises(ValueError, match=words):
            r.read_into("a", make())
        with pytest.raises(ValueError, match=words):
            r.read_into({"a": make(), "b": make()})
        with pytest.raises(ValueError, match=words):
            r.read_into({"a": torch.empty(4, 4), "b": make()})


class _quiet:
    def __enter__(self):
        import warnings
        self.w = warnings.catch_warnings()
        self.w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        return self.w.__exit__(*exc)


# ------------------------------------------------------------------ FP8 copies
def test_load_file_copy_of_fp8_gives_the_fp8_values(tmp_path):
    """With ml_dtypes installed, an f8_e5m2 array reports kind 'f' and went to
    torch.from_numpy, a bare TypeError, with copy=True."""
    import ztensor.torch as zt
    pytest.importorskip("ml_dtypes")
    g = torch.Generator().manual_seed(0)
    sd = {"a": torch.randn(4, 4, generator=g).to(torch.float8_e5m2),
          "b": torch.randn(3, generator=g).to(torch.float8_e4m3fn),
          "c": torch.randn(3, generator=g).bfloat16()}
    path = str(tmp_path / "f8.zt")
    zt.save_file(sd, path)
    for copy in (False, True):
        loaded = zt.load_file(path, copy=copy)
        for name, t in sd.items():
            assert loaded[name].dtype == t.dtype
            assert torch.equal(loaded[name].view(torch.uint8), t.view(torch.uint8))


# ------------------------------------------------------------------ allocation bound
ALLOCATIONS = [
    ("zeros", (5, 3), {}), ("zeros", ((4, 5),), {}), ("zeros", (np.int64(5), 3), {}),
    ("empty", (torch.Size([2, 3]),), {}), ("ones", (), {"size": (2, 7)}),
    ("rand", (9,), {}), ("randn", (2, 2, 2), {}), ("full", ((2, 3), 1.5), {}),
    ("empty_strided", ((2, 3), (3, 1)), {}),
    ("arange", (10,), {}), ("arange", (2, 10, 3), {}), ("arange", (0.0, 1.0, 0.1), {}),
    ("arange", (), {"end": 5}), ("arange", (np.int64(7),), {}),
    ("randint", (0, 10, (3, 4)), {}), ("randint", (10,), {"size": (5,)}),
    ("randperm", (7,), {}), ("eye", (3,), {}), ("eye", (3, 5), {}),
    ("linspace", (0, 1, 50), {}), ("logspace", (0, 1), {"steps": 6}),
]


@pytest.mark.parametrize("name,args,kwargs", ALLOCATIONS)
def test_the_allocation_bound_reads_each_allocator_as_torch_does(name, args, kwargs):
    """Oracle: torch's own result.  The bound watched only empty/zeros/ones/rand/
    randn/full/empty_strided, so BERT's arange(max_position_embeddings) passed, and
    a numpy-int size read as 0."""
    from ztensor import transformers as ztf
    made = getattr(torch, name)(*args, **kwargs)
    assert ztf._requested_elements(name, args, kwargs) == made.numel()


@pytest.mark.parametrize("method,args", [("new_zeros", (2, 3)), ("new_zeros", ((2, 3),)),
                                         ("new_empty", ((4,),)), ("new_ones", (5,)),
                                         ("new_full", ((2, 3), 1.0))])
def test_the_allocation_bound_reads_tensor_methods_as_torch_does(method, args):
    from ztensor import transformers as ztf
    base = torch.ones(1)
    made = getattr(base, method)(*args)
    assert ztf._requested_elements(method, (base,) + args, {}) == made.numel()


def test_a_config_whose_buffer_would_be_huge_is_refused_before_allocation(tmp_path):
    """BERT registers position_ids = arange(max_position_embeddings) while it is
    built: 10**11 positions would write 800 GB of int64 before any check."""
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        vocab_size=64, max_position_embeddings=64))
    folder = tmp_path / "bert"
    ztf.save_pretrained(model, folder)
    loaded = ztf.from_pretrained(transformers.BertModel, folder)
    assert torch.equal(loaded.embeddings.word_embeddings.weight,
                       model.embeddings.word_embeddings.weight)
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(
        config.replace('"max_position_embeddings": 64', '"max_position_embeddings": 100000000000'))
    with pytest.raises(ztensor.LimitError, match="elements; at most"):
        ztf.from_pretrained(transformers.BertModel, folder)
    # the buffer itself, which nothing else refused: arange writes every element
    with ztf._AllocationBound(64, "config.json"):
        with pytest.raises(ztensor.LimitError, match="100000000000 elements"):
            torch.arange(100000000000)
        with pytest.raises(ztensor.LimitError, match="100000000000 elements"):
            torch.ones(1).new_zeros(np.int64(100000000000))
        assert torch.arange(64).numel() == 64


# ------------------------------------------------------------------ storage_options
def _gpt2_files(transformers, tmp_path):
    """A small GPT-2 (seeded) saved by ztensor.transformers.save_pretrained, and its
    folder's files as a server holds them under /m/: (model, path -> bytes)."""
    import ztensor.transformers as ztf
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=32))
    folder = tmp_path / "m"
    ztf.save_pretrained(model, folder)
    return model, {"/m/" + p.name: p.read_bytes() for p in folder.iterdir()}


def test_from_pretrained_and_load_file_take_storage_options(tmp_path, raw):  # noqa: F811
    """A server naming no version is refused unless storage_options opt in; the
    configs were opened without the caller's storage_options, so the opt-in (or
    credentials) could not reach them."""
    transformers = pytest.importorskip("transformers")
    import ztensor.torch as zt
    import ztensor.transformers as ztf
    model, files = _gpt2_files(transformers, tmp_path)
    server = raw(serving_files(files, etag=None))
    index = server.url("/m/model.zt.index.json")
    with pytest.raises(ztensor.UnsupportedError):
        ztf.from_pretrained(transformers.GPT2LMHeadModel, index)
    opt_in = {"ztensor_allow_unversioned": True}
    loaded = ztf.from_pretrained(transformers.GPT2LMHeadModel, index, storage_options=opt_in)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    tensors = zt.load_file(index, storage_options=opt_in)
    assert torch.equal(tensors["transformer.wte.weight"], model.transformer.wte.weight)


# ------------------------------------------------------------------ counting decoded bytes
def test_threads_reading_one_sizeless_part_count_it_once():
    """A v1.1 zstd part that declares no size counts towards max_total_decompressed
    once decoded.  The count was read and written without a lock, so threads
    decoding one part at once could count it twice and refuse a file within its
    limit; the count also wrote the size into the shared spec."""
    import threading
    from test_hostile_s10_core import sizeless_sparse_file
    data, values = sizeless_sparse_file(2)
    limits = ztensor.Limits(max_total_decompressed=32000)      # exactly the two parts
    for _ in range(20):
        with ztensor.Reader(data, limits=limits) as r:
            start = threading.Barrier(8)
            failures = []

            def read(name):
                start.wait()
                try:
                    for _ in range(5):
                        got = r.read(name).components["values"]
                        assert np.array_equal(got, values)
                except Exception as exc:  # noqa: BLE001 - collected for the assert
                    failures.append(exc)

            threads = [threading.Thread(target=read, args=(f"s{i % 2}",)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert failures == []
            assert r.metadata("s0").components["values"].uncompressed_length is None


# ------------------------------------------------------------------ fast path = general path
def _many_dtypes():
    g = torch.Generator().manual_seed(3)
    out = {}
    for dt in (torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int8,
               torch.uint8, torch.int16, torch.int32, torch.int64, torch.complex64):
        out[f"t_{str(dt)[6:]}"] = (torch.randn(5, 3, generator=g) * 50).to(dt)
    out["t_bool"] = torch.randn(7, generator=g) > 0
    out["t_scalar"] = torch.tensor(2.5)
    out["t_empty"] = torch.zeros(0, 4)
    for dt in ("float8_e4m3fn", "float8_e5m2"):
        out[f"t_{dt}"] = torch.randn(6, generator=g).to(getattr(torch, dt))
    return out


@pytest.mark.parametrize("fmt", ["zt", "safetensors", "pt", "npz"])
def test_load_file_fast_path_agrees_with_read_torch(tmp_path, fmt):
    """torch.load_file takes plain tensors from ReaderInternals.plain_view (a .zt
    file's view table; another format's reader's array) and everything else from
    the general path: both must give each tensor's dtype, shape and bytes as
    Reader.read_torch gives them."""
    import ztensor.torch as zt
    tensors = _many_dtypes()
    path = str(tmp_path / f"m.{fmt}")
    if fmt == "zt":
        zt.save_file(tensors, path)
    elif fmt == "safetensors":
        st = pytest.importorskip("safetensors.torch")
        tensors = {k: v for k, v in tensors.items() if v.dtype != torch.complex64}
        st.save_file(tensors, path)
    elif fmt == "pt":
        torch.save(tensors, path)
    else:
        tensors = {k: v for k, v in tensors.items()
                   if v.dtype not in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)}
        np.savez(path, **{k: v.numpy() for k, v in tensors.items()})
    for copy in (False, True):
        fast = zt.load_file(path, copy=copy)
        with ztensor.Reader(path) as r:
            general = {name: r.read_torch(name, copy=True) for name in r.keys()}
        assert sorted(fast) == sorted(general) == sorted(tensors)
        for name, t in general.items():
            assert fast[name].dtype == t.dtype == tensors[name].dtype, name
            assert fast[name].shape == t.shape, name
            assert _bytes(fast[name]) == _bytes(t) == _bytes(tensors[name]), name


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).tolist()


def test_onnx_subgraph_names_keep_a_node_name_that_starts_with_a_slash(tmp_path):
    """torch.onnx.export names nodes like "/model/If"; the listed name of a subgraph
    initializer lost that first "/" (the owner path was left-stripped)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    inner = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])], "then",
        [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])])
    other = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["y"])], "else",
        [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[helper.make_tensor("v", TensorProto.FLOAT, [2], [3.0, 4.0])])
    node = helper.make_node("If", ["c"], ["out"], name="/model/If",
                            then_branch=inner, else_branch=other)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with ztensor.Reader(str(path)) as r:
        assert sorted(r.attributes["onnx.skipped_subgraph_initializers"]) == [
            "/model/If.else_branch/v", "/model/If.then_branch/w"]


def test_attribute_text_never_makes_a_tensor_name_fail(tmp_path):
    """Tensor names and attribute text drew on one budget: a checkpoint whose plain
    values came first in the walk used it up, and a later tensor's ordinary name was
    then a LimitError, where the documented rule is that values past the budget are
    only omitted (and counted).  The budget is made small through the limits."""
    checkpoint = {f"n{i}": "x" for i in range(5000)}
    checkpoint["model.layer.weight"] = torch.arange(6, dtype=torch.float32)
    path = str(tmp_path / "c.pt")
    torch.save(checkpoint, path)
    limits = ztensor.Limits(max_manifest_size=10_000)
    with ztensor.Reader(path, limits=limits) as r:
        assert r.keys() == ["model.layer.weight"]
        assert torch.equal(r.read_torch("model.layer.weight"), checkpoint["model.layer.weight"])
        kept = [k for k in r.attributes if k.startswith("pickle.n")]
        assert all(r.attributes[k] == "x" for k in kept)
        assert len(kept) + r.attributes["pickle.omitted_attributes"] == 5000
        assert 0 < len(kept) < 5000


# ------------------------------------------------------------------ caller input said plainly
def test_a_masked_array_is_refused_not_written_without_its_mask(tmp_path):
    """np.asarray dropped the mask and the values it hides were written as data."""
    masked = np.ma.MaskedArray([1.0, 2.0, 3.0], mask=[False, True, False])
    path = str(tmp_path / "m.zt")
    with pytest.raises(TypeError, match="masked array"):
        with ztensor.Writer(path) as w:
            w.add("m", masked)
    assert not os.path.exists(path)


def test_remove_tensors_with_a_name_that_is_not_a_string_says_so(tmp_path):
    path = str(tmp_path / "r.zt")
    with ztensor.Writer(path) as w:
        w.add("b", np.ones(2, np.float32))
    before = open(path, "rb").read()
    with pytest.raises(TypeError, match="strings, not list"):
        ztensor.remove_tensors(path, [["b"]])
    assert open(path, "rb").read() == before


def test_an_index_whose_metadata_is_not_an_object_is_refused(tmp_path):
    import json
    with ztensor.Writer(str(tmp_path / "s.zt")) as w:
        w.add("a", np.ones(2, np.float32))
    for metadata, ok in ([1, 2], False), ("x", False), (None, True), ({"total_size": 8}, True):
        (tmp_path / "model.zt.index.json").write_text(
            json.dumps({"metadata": metadata, "weight_map": {"a": "s.zt"}}))
        if ok:
            with ztensor.open_sharded(str(tmp_path)) as ckpt:
                assert np.array_equal(ckpt.read_numpy("a"), np.ones(2, np.float32))
        else:
            with pytest.raises(ztensor.FormatError, match="'metadata' is a JSON object"):
                ztensor.open_sharded(str(tmp_path))


def test_a_masked_component_is_refused_by_tensor_too():
    with pytest.raises(TypeError, match="masked array"):
        ztensor.Tensor({"data": np.ma.MaskedArray([1.0, 2.0], mask=[True, False])})


def test_a_stream_chunk_that_would_overrun_is_refused_before_it_is_copied(tmp_path):
    """A stride-0 chunk showing 2**40 elements (8 bytes of memory) was made
    contiguous before its size was compared with the tensor's: a bare MemoryError
    (or terabytes reserved) instead of the documented 'would overrun' refusal."""
    path = str(tmp_path / "s.zt")
    huge = np.broadcast_to(np.float64(1.0), (1 << 40,))
    with ztensor.Writer(path) as w:
        with w.stream("x", (4,), np.float64) as s:
            with pytest.raises(ztensor.FormatError, match="would overrun"):
                s.write(huge)
            s.write(np.arange(4, dtype=np.float64))      # a correct chunk may follow
    with ztensor.Reader(path) as r:
        assert np.array_equal(r.read_numpy("x"), np.arange(4, dtype=np.float64))


def test_pickle_values_no_attribute_holds_are_counted_not_dropped_unsaid(tmp_path):
    """None values were neither kept nor counted in pickle.omitted_attributes.  (A
    bytes value, which torch.save's protocol 2 writes as a call of _codecs.encode,
    is read in that one form, encode(latin-1 text, "latin1"): foreign.pytorch's
    _Load.encode; any other call of it is a FormatError.)"""
    path = str(tmp_path / "c.pt")
    torch.save({"w": torch.ones(2), "nothing": None, "scheduler": {"last": None},
                "epoch": 3}, path)
    with ztensor.Reader(path) as r:
        assert r.attributes["pickle.epoch"] == 3
        assert r.attributes["pickle.omitted_attributes"] == 2


def test_hdf5_soft_and_external_links_are_listed_not_dropped_unsaid(tmp_path):
    """They are not followed (containment), but a name the file gives was dropped
    without a word; they are now listed in hdf5_skipped_links."""
    h5py = pytest.importorskip("h5py")
    path = str(tmp_path / "m.h5")
    with h5py.File(path, "w") as f:
        f["layer/weight"] = np.arange(4, dtype=np.float32)
        f["layer/alias"] = h5py.SoftLink("/layer/weight")
        f["outside"] = h5py.ExternalLink("other.h5", "/x")
    with ztensor.Reader(path) as r:
        assert r.keys() == ["layer.weight"]
        assert sorted(r.attributes["hdf5_skipped_links"]) == ["/layer/alias", "/outside"]


def test_a_config_replaced_while_read_is_refused(tmp_path, raw):  # noqa: F811
    """from_pretrained read config.json in one read, never holding the reply to the
    size opened: on a server naming no version (the caller opted in), a config
    replaced between the HEAD and the GET was read as the other file."""
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    model, files = _gpt2_files(transformers, tmp_path)
    asked = {"n": 0}

    def config_now():
        asked["n"] += 1
        text = files["/m/config.json"]
        return text if asked["n"] == 1 else text.replace(b"{", b'{"extra": 1, ', 1)

    def reply(method, asked_range, headers):
        path = headers[":path"]
        if path == "/m/config.json":
            return serving(config_now, etag=None)(method, asked_range, headers)
        data = files.get(path)
        if data is None:
            return NOT_FOUND
        return serving(data, etag=None)(method, asked_range, headers)

    server = raw(reply)
    with pytest.raises(ztensor.FormatError, match="changed on the server"):
        ztf.from_pretrained(transformers.GPT2LMHeadModel, server.url("/m/model.zt.index.json"),
                            storage_options={"ztensor_allow_unversioned": True})


@pytest.mark.parametrize("dtype", ["complex32", "float8_e8m0fnu", "bits8"])
def test_a_checkpoint_of_a_torch_dtype_zt_lacks_is_unsupported_not_code(tmp_path, dtype):
    """A valid torch.save of complex32/float8_e8m0fnu/bits8 tensors was refused as if
    its pickle ran code ('refusing to load torch.complex32 ... no code is run')."""
    dt = getattr(torch, dtype)
    t = torch.zeros(4, dtype=dt) if dtype == "complex32" else torch.zeros(4, dtype=torch.uint8).view(dt)
    path = str(tmp_path / "d.pt")
    torch.save({"a": t}, path)
    with pytest.raises(ztensor.UnsupportedError, match=f"torch.{dtype} tensors"):
        ztensor.Reader(path)


def test_a_closed_sharded_checkpoint_reads_nothing(tmp_path):
    """read_numpy, read_into and verify reopened the shards after close() (leaking
    them), where a closed Reader or safe_open raises ClosedError."""
    tensors = {f"t{i}": np.full(1000, i, np.float32) for i in range(4)}
    ztensor.save_sharded(tensors, str(tmp_path), max_shard_size=5000)
    ckpt = ztensor.open_sharded(str(tmp_path))
    assert np.array_equal(ckpt.read_numpy("t1"), tensors["t1"])
    ckpt.close()
    with pytest.raises(ztensor.ClosedError):
        ckpt.read_numpy("t2")
    with pytest.raises(ztensor.ClosedError):
        ckpt.read_into("t0", np.empty(1000, np.float32))
    with pytest.raises(ztensor.ClosedError):
        ckpt.verify()


def test_a_reader_over_an_mmap_object(tmp_path):
    """mmap.mmap's seek returns None: the size was taken from it, a bare TypeError."""
    import mmap
    path = str(tmp_path / "m.zt")
    with ztensor.Writer(path) as w:
        w.add("a", np.arange(5.0))
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    with ztensor.Reader(m) as r:
        assert np.array_equal(r.read_numpy("a"), np.arange(5.0))


def test_the_unversioned_opt_in_is_a_bool():
    """'false' (a string) read as true."""
    from ztensor.io import source
    with pytest.raises(TypeError, match="True or False"):
        source.open_url("http://127.0.0.1:1/x.zt", {"ztensor_allow_unversioned": "false"})


@pytest.mark.parametrize("url,options", [
    ("async_wrapper://x.zt", "memory-fs"),
    ("dask://x.zt", {"target_protocol": "memory"}),
])
def test_a_filesystem_over_another_is_refused_by_what_it_is(url, options):
    """url_filesystem refused chains and caches by protocol name; a wrapper under
    another registered name (async_wrapper, dask) read through its inner filesystem
    unchecked.  The filesystem made is judged by what it is."""
    fsspec = pytest.importorskip("fsspec")
    from ztensor.io import source
    if options == "memory-fs":
        options = {"fs": fsspec.filesystem("memory")}
    with pytest.raises(ztensor.UnsupportedError, match="another filesystem"):
        source.url_filesystem(url, options)
    fs, _ = source.url_filesystem("memory://x.zt")        # a store of its own: kept
    assert type(fs).__name__ == "MemoryFileSystem"


def test_an_index_past_its_bound_is_refused_before_it_is_parsed(tmp_path):
    """Parsed JSON takes about 20 times its bytes in Python objects (a 96 MB index
    took 2 GB): the index is at most MAX_INDEX_BYTES, refused past it as it is read."""
    from ztensor import sharded
    with ztensor.Writer(str(tmp_path / "s.zt")) as w:
        w.add("a", np.ones(2, np.float32))
    head = b'{"metadata": {}, "weight_map": {"a": "s.zt"}}'
    with open(tmp_path / "model.zt.index.json", "wb") as f:
        f.write(head + b" " * (sharded.MAX_INDEX_BYTES + 1 - len(head)))
    with pytest.raises(ztensor.FormatError, match=f"larger than {sharded.MAX_INDEX_BYTES}"):
        ztensor.open_sharded(str(tmp_path))
    with open(tmp_path / "model.zt.index.json", "r+b") as f:
        f.truncate(sharded.MAX_INDEX_BYTES)
    with ztensor.open_sharded(str(tmp_path)) as ckpt:
        assert ckpt.keys() == ["a"]
