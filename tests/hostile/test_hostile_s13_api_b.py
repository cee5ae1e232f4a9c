"""Public API review (s13, second pass): pt get_slice is torch indexing as
safetensors' is; a caller's model dtype is their own ValueError; parse_size's
floats and strings as Hugging Face reads them; a closed ShardedReader answers
nothing; bytes are no filename for ztensor.torch.load_file.

Every expectation is the installed reference's own behaviour (safetensors,
huggingface_hub), asked at test time, on files its own writers made."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ztensor
import ztensor.numpy
from ztensor.sharded import parse_size

torch = pytest.importorskip("torch")
import ztensor.torch  # noqa: E402  (imports torch)
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open as st_safe_open  # noqa: E402
from safetensors.torch import save_file as st_save_file  # noqa: E402

SHAPES = {"s": (), "e": (0,), "v": (5,), "m": (4, 3), "z": (2, 0, 3), "c": (3, 4, 2)}


def _tensors():
    out = {}
    for key, shape in SHAPES.items():
        n = int(np.prod(shape, dtype=np.int64))
        out[key] = torch.arange(n, dtype=torch.float32).reshape(shape) * 1.5 - 3
    out["b"] = (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7).to(torch.bfloat16)
    out["i"] = torch.arange(30, dtype=torch.int16).reshape(5, 6)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(safetensors' file, the same tensors as raw .zt, as zstd .zt)."""
    folder = tmp_path_factory.mktemp("slices")
    tensors = _tensors()
    theirs = str(folder / "a.safetensors")
    st_save_file(tensors, theirs)
    raw, packed = str(folder / "a.zt"), str(folder / "c.zt")
    ztensor.torch.save_file(tensors, raw)
    ztensor.torch.save_file(tensors, packed, compression=True)
    return theirs, raw, packed


def _outcome(handle, name, index):
    """('ok', dtype, shape, values) or ('err', builtin kind, message)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warning for a non-tuple sequence
        try:
            got = handle.get_slice(name)[index]
        except (IndexError, TypeError, ValueError, RuntimeError) as exc:
            kind = next(k for k in (IndexError, TypeError, ValueError, RuntimeError)
                        if isinstance(exc, k))
            return ("err", kind, str(exc), exc)
    values = got.float().tolist() if got.dtype == torch.bfloat16 else got.tolist()
    return ("ok", got.dtype, tuple(got.shape), values)


def _same_as_safetensors(files, name, index):
    theirs_path, raw, packed = files
    with st_safe_open(theirs_path, "pt") as theirs:
        want = _outcome(theirs, name, index)
    for path in (theirs_path, raw, packed):
        with ztensor.safe_open(path, "pt") as ours:
            got = _outcome(ours, name, index)
        if want[0] == "ok":
            assert got == want, (path, name, index)
        else:
            # the builtin safetensors raised (ours, a SliceError, is an IndexError too)
            assert got[0] == "err" and got[2] == want[2], (path, name, index, got, want)
            assert isinstance(got[3], want[1]), (path, name, index, got, want)
            # ours is a ZTensorError (safetensors' SafetensorError) naming the tensor
            assert isinstance(got[3], ztensor.SafetensorError), got
            assert got[3].obj == name


FORMS = [
    None, (None, 1), (slice(None), None), ..., (..., 1), (1, ...), (..., None),
    slice(100, 200), slice(-100, 3), slice(5, 2), slice(None, None, 2), slice(1, None, 3),
    [1, 2], [1, -1], [], [[1, 2]], True, False, (True,), [True, False, True, False],
    (1, [0, 2]), ([1, 2], [0, 1]), (slice(None), [True, False, True]),
    np.array([True, False, True, True]), np.array([3, 0]), torch.tensor([1, 2]),
    torch.tensor(1), np.int64(2), slice(None, None, np.int64(2)), (0, 0), (..., ...),
    (None, None, ..., None), range(3), slice(2**70, None), slice(2**62, None, -3),
    # refused, each with torch's own builtin
    slice(None, None, -1), slice(None, None, 0), 10, -11, (1, 2, 3), 1.5, "a",
    slice(1.0, 3), 2**70, [1, "a"], np.True_, [5, 0],
    (slice(2, 8, 3), slice(-1, None, -2)),
]


@pytest.mark.parametrize("name", ["m", "s", "v", "c", "b", "i", "z"])
@pytest.mark.parametrize("index", FORMS, ids=repr)
def test_pt_get_slice_is_safetensors_pt_get_slice(files, name, index):
    """safetensors' pt get_slice indexes as torch does: None, clamped slices
    ([100:200] of 10 rows is empty), lists, masks, True, repeated ... ; ours
    refused them by numpy safetensors' rules.  Same values, dtype and shape, or the
    same builtin (ours also a SliceError) with torch's words.  Kept by
    ``safe._torch_row_span`` and ``safe._torch_applied``."""
    _same_as_safetensors(files, name, index)


_bound = st.one_of(st.none(), st.integers(-9, 9))
_item = st.one_of(
    st.integers(-6, 6),
    st.builds(slice, _bound, _bound, st.one_of(st.none(), st.integers(-2, 4))),
    st.none(),
    st.just(Ellipsis),
    st.lists(st.integers(-5, 5), max_size=3),
)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(SHAPES) + ["b", "i"]),
       index=st.one_of(_item, st.tuples(_item), st.tuples(_item, _item),
                       st.tuples(_item, _item, _item), st.tuples(_item, _item, _item, _item)))
def test_pt_get_slice_property(files, name, index):
    """Random index tuples (integers, slices with any step, None, ..., lists) on
    tensors of every rank: the same result as safetensors' pt get_slice, or both
    refuse with the same builtin and message."""
    _same_as_safetensors(files, name, index)


@pytest.mark.parametrize("index", [slice(None, None, 2**70), slice(1, None, 2**63 - 1),
                                   (..., slice(None, None, 2**62)), (1, slice(None, None, 2**64))])
@pytest.mark.parametrize("name", ["m", "c", "z"])
def test_pt_get_slice_step_past_int64_is_the_first_element(files, name, index):
    """A step near 2**63 overflowed torch's stride arithmetic (safetensors gave a
    wrong shape, an error about negative strides, or a tensor whose tolist()
    raised SystemError): ours is what the index selects, as numpy computes it.
    Kept by ``safe._bounded_steps``."""
    _, raw, packed = files
    want = _tensors()[name].numpy()[index]
    for path in (raw, packed):
        with ztensor.safe_open(path, "pt") as f:
            got = f.get_slice(name)[index]
        assert tuple(got.shape) == want.shape and np.array_equal(got.numpy(), want)


def test_np_get_slice_keeps_safetensors_np_rules(files):
    """framework='np' stays safetensors' numpy slicing: None refused, an
    out-of-range stop refused, as safetensors' np get_slice refuses them."""
    theirs_path, raw, _ = files
    for index in (None, slice(100, 200), [1, 2]):
        with st_safe_open(theirs_path, "np") as theirs:
            with pytest.raises(safetensors.SafetensorError):
                theirs.get_slice("m")[index]
        with ztensor.safe_open(raw, "np") as ours:
            with pytest.raises(ztensor.SafetensorError):
                ours.get_slice("m")[index]


def test_pt_get_slice_result_owns_its_memory(files):
    """A basic index of a mapped file's tensor is a view torch would share: ours
    is a copy of what it shows, so the handle closes under it."""
    _, raw, _ = files
    with ztensor.safe_open(raw, "pt") as f:
        part = f.get_slice("m")[..., 1:]
    assert part.tolist() == (_tensors()["m"][..., 1:]).tolist()
    part.add_(1)  # writable, its own


# ---------------------------------------------------------------- transformers
@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=32, max_position_embeddings=16))
    folder = tmp_path_factory.mktemp("tiny") / "zt"
    ztf.save_pretrained(model, str(folder))
    return str(folder), transformers, ztf


@pytest.mark.parametrize("keyword", ["torch_dtype", "dtype"])
@pytest.mark.parametrize("value", ["float8_e4m3fn", "float8_e5m2", "nonsense", "int8",
                                   "_C", torch.float8_e4m3fn, torch.int32, torch.complex64])
def test_a_caller_dtype_no_model_is_built_in_is_their_value_error(
        tiny_model_folder, tmp_path, keyword, value):
    """``torch_dtype="float8_e4m3fn"`` built the model in FP8, which torch refuses,
    and the error was a FormatError blaming config.json.  It is the caller's
    ValueError naming their keyword, raised before anything is read (a folder
    that does not exist gives it too).  Kept by ``transformers._caller_dtype``."""
    folder, transformers, ztf = tiny_model_folder
    for path in (folder, str(tmp_path / "absent")):
        with pytest.raises(ValueError, match=keyword) as info:
            ztf.from_pretrained(transformers.AutoModelForCausalLM, path, **{keyword: value})
        assert not isinstance(info.value, ztensor.ZTensorError)


def test_a_caller_dtype_of_no_dtype_type_is_a_type_error(tiny_model_folder):
    folder, transformers, ztf = tiny_model_folder
    with pytest.raises(TypeError, match="torch_dtype"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder, torch_dtype=3)


def test_a_config_dtype_no_model_is_built_in_still_blames_config(tiny_model_folder, tmp_path):
    """The config's own FP8 dtype is the config's fault: a FormatError naming it
    (what transformers refuses in config.json), and the caller's good dtype wins."""
    import shutil
    folder, transformers, ztf = tiny_model_folder
    copy = tmp_path / "fp8"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["dtype"] = "float8_e4m3fn"
    config.pop("torch_dtype", None)
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ztensor.FormatError, match="config.json"):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, str(copy))
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, str(copy),
                                torch_dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


# ---------------------------------------------------------------- parse_size
def test_parse_size_strings_as_huggingface_hub_reads_them():
    """huggingface_hub (which transformers 5's save_pretrained shards with) reads
    '1.5GB' as 1.5 * 10**9 and 'kB' in any case as 1000: the same here."""
    hub = pytest.importorskip("huggingface_hub.serialization._base")
    for text in ["1.5GB", "100kB", "100KB", "100kb", "5MB", " 5 GB ", ".5GB", "5.GB",
                 "1.1GB", "2TB", "7mb"]:
        assert parse_size(text) == hub.parse_size_to_int(text), text
    assert parse_size("5GiB") == 5 << 30  # transformers' own spelling, which the hub lacks


@pytest.mark.parametrize("size", [1.9, 0.5, 1e-3, float("inf"), float("nan"), -2.0,
                                  "1.5", "1.5B", True, 0, "0GB"])
def test_parse_size_refuses_a_fraction_of_a_byte(size):
    """``parse_size(1.9)`` quietly became 1 byte (1.9 most likely meant
    gigabytes): a float with a fraction, a fraction of a byte, a bool or no bytes
    is a ValueError naming max_shard_size.  Kept by ``sharded.parse_size``."""
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size(size)


def test_parse_size_takes_a_whole_float_as_bytes():
    assert parse_size(5e9) == 5_000_000_000 and isinstance(parse_size(5e9), int)
    assert parse_size(1024.0) == 1024


# ---------------------------------------------------------------- ShardedReader
def test_a_closed_sharded_reader_answers_nothing(tmp_path):
    """After close(), keys(), len(), ``in``, the index's attributes and shard
    listing answered as if open; every one is the ClosedError its reads raise.
    Kept by ``sharded.ShardedReader._require_open``."""
    ztensor.save_sharded({"a": np.arange(10.0), "b": np.ones(3)}, str(tmp_path),
                         max_shard_size=40)
    r = ztensor.open_sharded(str(tmp_path))
    first = r.files()[0]
    r.close()
    calls = {
        "keys": lambda: r.keys(), "len": lambda: len(r), "in": lambda: "a" in r,
        "iter": lambda: list(r), "attributes": lambda: r.attributes,
        "shards": lambda: r.shards, "files": lambda: r.files(),
        "file_of": lambda: r.file_of("a"), "names_in": lambda: r.names_in(first),
        "shard_path": lambda: r.shard_path(first), "open_shard": lambda: r.open_shard(first),
        "metadata": lambda: r.metadata("a"), "read_numpy": lambda: r.read_numpy("a"),
        "read_numpy_unknown": lambda: r.read_numpy("zzz"),
        "read_numpy_list": lambda: r.read_numpy([]), "read": lambda: r.read([]),
        "read_torch": lambda: r.read_torch([]), "read_into": lambda: r.read_into({}),
        "get_tensor": lambda: r.get_tensor("a"), "getitem": lambda: r["a"],
        "get_slice": lambda: r.get_slice("a"), "verify": lambda: r.verify(),
        "read_all": lambda: r.read_all(),
    }
    for what, call in calls.items():
        with pytest.raises(ztensor.ClosedError):
            call()
    assert "closed" in repr(r) and bool(r)


# ---------------------------------------------------------------- load_file
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_load_file_takes_a_name_never_contents(tmp_path, kind):
    """``load_file(b"a.zt")`` read the name as a file's contents ("<bytes>: file is
    truncated"); safetensors' load_file raises TypeError for bytes, and the
    reference ztensor's takes a name only.  A TypeError pointing to
    ``ztensor.torch.load``, for load_model too, and ``ztensor.numpy.load_file``'s to
    ``ztensor.numpy.load``.  Kept by ``reader.require_file_name``."""
    from safetensors.torch import load_file as st_load_file

    path = tmp_path / "a.zt"
    ztensor.torch.save_file({"w": torch.ones(2)}, str(path))
    with pytest.raises(TypeError):
        st_load_file(bytes(str(path), "utf-8"))
    for argument in (kind(str(path).encode()), kind(path.read_bytes())):
        with pytest.raises(TypeError, match=r"ztensor\.torch\.load\(data\)"):
            ztensor.torch.load_file(argument)
        with pytest.raises(TypeError, match=r"ztensor\.torch\.load\(data\)"):
            ztensor.torch.load_model(torch.nn.Linear(2, 1), argument)
        with pytest.raises(TypeError, match=r"ztensor\.numpy\.load\(data\)"):
            ztensor.numpy.load_file(argument)
    assert ztensor.torch.load(path.read_bytes())["w"].tolist() == [1.0, 1.0]
