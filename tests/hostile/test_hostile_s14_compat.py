"""Session 14: what code written against the reference ztensor 1.2.3 or safetensors
0.8 does, and ours did otherwise (a probe of both peers' documented APIs).

Each test's docstring says what broke and names the one function that now keeps the
rule.  Optional packages (torch, safetensors, ml_dtypes) are imported with
``pytest.importorskip`` before ``ztensor.torch`` is.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

import ztensor
import ztensor.numpy
from ztensor.objects import ComponentSpec
from ztensor.arguments import AMBIGUOUS_DTYPE_NAMES, caller_dtype


@pytest.fixture()
def small(tmp_path):
    """A .zt file: float32 ``x`` (2x3), zstd ``z``, int64 ``i``."""
    path = tmp_path / "small.zt"
    with ztensor.Writer(str(path)) as w:
        w.add("x", np.arange(6, dtype=np.float32).reshape(2, 3))
        w.add("z", np.arange(100, dtype=np.float32), compress=True, checksum="crc32c")
        w.add("i", np.array([1, -2, 300], np.int64))
    return path


def safetensors_file(path, header: dict, data: bytes) -> None:
    """A .safetensors file with exactly this header (padded to 8 bytes) and data."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


# ---------------------------------------------------------------- 1. dtype names
@pytest.mark.parametrize("name", ["u8", "i8", "f16"])
def test_read_numpy_refuses_a_dtype_name_numpy_and_the_spec_read_apart(small, name):
    """read_numpy(dtype="u8") gave uint64 (numpy counts bytes), "f16" float128 and
    "i8" int64, silently: the spec's own names at another width.  They are now a
    ValueError naming both readings and the unambiguous spellings
    (arguments.caller_dtype, the one rule for a caller's dtype)."""
    numpy_reading, spec_reading = AMBIGUOUS_DTYPE_NAMES[name]
    assert numpy_reading != spec_reading
    with ztensor.Reader(str(small)) as r:
        with pytest.raises(ValueError, match="ambiguous") as info:
            r.read_numpy("i", dtype=name)
    assert numpy_reading.name in str(info.value) and spec_reading.name in str(info.value)


def test_the_ambiguous_names_are_exactly_the_table_rows_numpy_also_reads():
    """The refused spellings come from the dtype table, not a hand-kept list
    (arguments.AMBIGUOUS_DTYPE_NAMES): every spec name numpy reads as another type."""
    expected = set()
    for row in ztensor.dtypes.ROWS:
        try:
            numpy_reading, spec_reading = np.dtype(row.spec), np.dtype(row.numpy)
            # another type, not another byte order (the table's dtypes are
            # little-endian: on s390x "complex64" differs from it only so)
            if (numpy_reading.kind, numpy_reading.itemsize) != (
                spec_reading.kind,
                spec_reading.itemsize,
            ):
                expected.add(row.spec)
        except TypeError:
            pass
    assert set(AMBIGUOUS_DTYPE_NAMES) == expected == {"u8", "i8", "f16"}


@pytest.mark.parametrize(
    "given, expected",
    [
        ("f32", np.float32),
        ("f64", np.float64),
        ("i16", np.int16),
        ("u32", np.uint32),
        ("float32", np.float32),
        ("<f4", np.float32),
        ("int8", np.int8),
        ("uint8", np.uint8),
        ("float16", np.float16),
        ("bool", np.bool_),
        ("complex64", np.complex64),
        (np.float32, np.float32),
        (float, np.float64),
        (np.dtype("int32"), np.int32),
    ],
)
def test_read_numpy_takes_numpy_and_spec_names(small, given, expected):
    """"f32" was a TypeError ("data type 'f32' not understood"): the spec's names are
    taken beside numpy's (arguments.caller_dtype)."""
    with ztensor.Reader(str(small)) as r:
        got = r.read_numpy("x", dtype=given)
    # the byte order the caller named ("<f4") is kept: native on either host else
    assert got.dtype.newbyteorder("=") == np.dtype(expected)
    assert np.array_equal(got, np.arange(6).reshape(2, 3).astype(expected))


def test_read_numpy_takes_bf16_and_fp8_by_every_name(small):
    """"bf16" and "f8_e4m3fn" were TypeErrors, and "bfloat16" worked only once
    ml_dtypes happened to be imported: each is looked up in the dtype table
    (arguments.caller_dtype)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with ztensor.Reader(str(small)) as r:
        for name in ("bf16", "bfloat16", ml_dtypes.bfloat16):
            assert r.read_numpy("x", dtype=name).dtype == np.dtype(ml_dtypes.bfloat16)
        for name in ("f8_e4m3fn", "float8_e4m3fn"):
            got = r.read_numpy("x", dtype=name)
            assert got.dtype == np.dtype(ml_dtypes.float8_e4m3fn)


def test_read_numpy_takes_torch_dtypes(small):
    """torch.float32 was a TypeError from numpy; torch dtypes are read by the dtype
    table's torch names (arguments.caller_dtype), torch itself never imported there."""
    torch = pytest.importorskip("torch")
    with ztensor.Reader(str(small)) as r:
        assert r.read_numpy("x", dtype=torch.float64).dtype == np.float64
        assert r.read_numpy("x", dtype=torch.int16).dtype == np.int16


@pytest.mark.parametrize("bad, error", [("nonsense", ValueError), ("F32", ValueError),
                                        (5, TypeError), (b"u8", TypeError),
                                        (object(), TypeError)])
def test_read_numpy_refuses_what_is_no_dtype_clearly(small, bad, error):
    """An unknown name is a ValueError, a value of the wrong kind a TypeError, each
    saying what a dtype may be (arguments.caller_dtype); bytes are refused, never read
    as numpy reads b"u8" (uint64)."""
    with ztensor.Reader(str(small)) as r:
        with pytest.raises(error, match="dtype"):
            r.read_numpy("x", dtype=bad)
    with pytest.raises(TypeError):
        caller_dtype(None)  # numpy would read None as float64


# ---------------------------------------------------------------- 2. Tensor
def test_tensor_takes_dtype_and_reports_dtype_and_type():
    """Tensor(..., dtype="float32", format="sparse_csr") (the reference's documented
    form) was a TypeError, and .dtype/.type AttributeErrors.  .dtype is the
    primary component's storage type by numpy's name, as metadata().dtype reports
    it; a declared dtype the component does not hold is a ValueError (the
    reference kept it and wrote the array's own).  Tensor.spec_types and
    objects.primary_role keep the rules."""
    csr = {
        "values": np.ones(2, np.float32),
        "indices": np.array([0, 1], np.uint64),
        "indptr": np.array([0, 1, 2], np.uint64),
    }
    t = ztensor.Tensor(csr, shape=[2, 2], dtype="float32", format="sparse_csr")
    assert (t.dtype, t.type, t.storage_dtype) == ("float32", None, "f32")
    assert ztensor.Tensor(csr, shape=[2, 2], format="sparse_csr", dtype="f32").dtype == "float32"
    with pytest.raises(ValueError, match="holds float32"):
        ztensor.Tensor(csr, shape=[2, 2], format="sparse_csr", dtype="float64")
    no_values = {k: v for k, v in csr.items() if k != "values"}
    assert ztensor.Tensor(no_values, shape=[2, 2], format="sparse_csr").dtype is None
    with pytest.raises(ValueError, match="missing"):
        ztensor.Tensor(no_values, shape=[2, 2], format="sparse_csr", dtype="float32")
    codes = ztensor.Tensor({"data": np.array([56, 64], np.uint8)}, type="f8_e4m3fn")
    assert (codes.dtype, codes.type) == ("uint8", "f8_e4m3fn")  # as the reference
    # the reported dtype is taken back (the reference's own round trip)
    ztensor.Tensor(codes.components, dtype=codes.dtype, type=codes.type)
    c = ztensor.Tensor({"data": np.ones(2, np.complex64)})
    assert (c.dtype, c.type) == ("float32", "complex64")


def test_tensor_dtype_matches_metadata_dtype(tmp_path):
    """What Reader.read(name) gives reports the dtype and type metadata(name) does
    (objects.reference_dtype_name, one naming rule for both)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    path = tmp_path / "t.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("f", np.ones(2, np.float32))
        w.write_numpy("b", np.ones(2, ml_dtypes.bfloat16))
        w.write_numpy("q", np.ones(2, np.float32), type="f8_e4m3fn")
        w.write_numpy("c", np.ones(2, np.complex64))
    with ztensor.Reader(str(path)) as r:
        for name in r.keys():
            meta, t = r.metadata(name), r.read(name)
            assert (t.dtype, t.type) == (meta.dtype, meta.type), name


def test_tensor_torch_as_the_reference_documents_it(tmp_path):
    """Tensor.torch(device=) was an AttributeError.  bf16 and FP8 become torch's
    own dtypes, from ml_dtypes arrays and from bits with types alike
    (Tensor.torch, by the dtype table's torch names)."""
    torch = pytest.importorskip("torch")
    t = ztensor.Tensor({"data": np.arange(4, dtype=np.float32)})
    assert torch.equal(t.torch(), torch.arange(4, dtype=torch.float32))
    assert t.torch(device="cpu").device.type == "cpu"
    bf16_bits = torch.tensor([1.5, -2.0]).to(torch.bfloat16).view(torch.int16).numpy()
    bits = ztensor.Tensor({"data": bf16_bits.view(np.uint16)}, types={"data": "bf16"})
    assert bits.torch().dtype == torch.bfloat16
    assert bits.torch().float().tolist() == [1.5, -2.0]
    codes = ztensor.Tensor({"data": np.array([0x38, 0x40], np.uint8)}, type="f8_e4m3fn")
    assert codes.torch().dtype == torch.float8_e4m3fn
    assert codes.torch().float().tolist() == [1.0, 2.0]
    with pytest.raises(TypeError, match="dense"):
        ztensor.Tensor({"values": np.ones(1)}, shape=[1], format="sparse_coo").torch()


# ---------------------------------------------------------------- 3. components
def test_component_spec_is_a_read_only_mapping(small):
    """meta.components["data"]["length"] (the reference's documented read_into
    arena pattern) was a TypeError: ComponentSpec is now a read-only Mapping of its
    manifest fields too (objects.COMPONENT_FIELDS), attributes kept."""
    with ztensor.Reader(str(small)) as r:
        comp = r.metadata("z").components["data"]
        assert isinstance(comp, ComponentSpec)
        assert comp["length"] == comp.length and comp.get("type") is None
        assert comp["encoding"] == "zstd" and comp["digest"].startswith("crc32c:")
        assert set(comp) >= {"dtype", "type", "offset", "length", "encoding"}
        assert dict(comp) == comp.to_dict()
        assert comp.get("role") is None and "role" not in comp
        with pytest.raises(KeyError):
            comp["role"]
        with pytest.raises(TypeError):
            comp["length"] = 5  # type: ignore[index]
        assert comp == comp and hash(comp) == hash(comp)  # by identity, as before
        arena = np.empty(sum(c["length"] for c in r.metadata("x").components.values()), np.uint8)
        assert arena.nbytes == 24


# ---------------------------------------------------------------- 4. keywords
def test_the_references_keyword_names(small, tmp_path):
    """w.add(name=, data=), Reader(path=) and remove_tensors(input=, output=,
    names=) were TypeErrors: the reference's keywords are taken beside ours, and
    both at once is a TypeError naming them (arguments.keyword_aliases)."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "kw.zt"
    with ztensor.Writer(str(out)) as w:
        w.add(name="a", data=np.ones(2))
        w.write_numpy(name="b", data=np.ones(2))
        w.write_torch(name="c", data=torch.ones(2))
        w.write(name="d", data=ztensor.Tensor({"data": np.ones(2)}))
        w.add("e", array=np.ones(2))  # ours still
        with pytest.raises(TypeError, match="'array' and its alias 'data'"):
            w.add("f", np.ones(2), data=np.ones(2))
    with ztensor.Reader(path=str(out)) as r:
        assert r.keys() == ["a", "b", "c", "d", "e"]
    with pytest.raises(TypeError, match="alias"):
        ztensor.Reader(str(out), path=str(out))
    ztensor.remove_tensors(input=str(out), output=str(tmp_path / "kw2.zt"), names=["a"])
    with ztensor.Reader(str(tmp_path / "kw2.zt")) as r:
        assert "a" not in r and "b" in r
    ztensor.remove_tensors(str(out), names=["b"])  # in place, names by keyword
    with ztensor.Reader(str(out)) as r:
        assert "b" not in r
    with pytest.raises(TypeError, match="names"):
        ztensor.remove_tensors(str(out))


# ---------------------------------------------------------------- 5. Limits
@pytest.mark.parametrize(
    "value, error",
    [
        (float("nan"), TypeError),
        (math.inf, TypeError),
        (1.5, TypeError),
        ("3", TypeError),
        (None, TypeError),
        (True, TypeError),
        (-1, ValueError),
    ],
)
@pytest.mark.parametrize("field", ["max_manifest_size", "max_component_size", "max_rank"])
def test_limits_are_checked_when_made(field, value, error):
    """Limits(max_component_size=nan) silently disabled the limit, -1 gave a bare
    OverflowError at read, a float or a string failed mid-read: each is refused
    when the Limits is made, naming the field (Limits.__post_init__)."""
    with pytest.raises(error, match=f"Limits.{field}"):
        ztensor.Limits(**{field: value})
    with pytest.raises(error, match=f"Limits.{field}"):
        ztensor.DEFAULT_LIMITS.with_(**{field: value})


def test_limits_take_numpy_ints_and_cap_huge_ones(small):
    """A numpy integer is an int here; a limit past what a u64 holds (10**30 gave
    an OverflowError for max_manifest_size) means the same as 2**64 - 1
    (Limits.__post_init__)."""
    lim = ztensor.Limits(max_rank=np.int64(3), max_manifest_size=10**30)
    assert type(lim.max_rank) is int and lim.max_rank == 3
    # a float holding a whole number is that number, as written (max_objects=1e7
    # worked before Limits was checked); nan, inf and 1.5 are refused above
    assert ztensor.Limits(max_objects=1e7).max_objects == 10_000_000
    assert lim.max_manifest_size == (1 << 64) - 1
    with ztensor.Reader(str(small), limits=lim) as r:
        assert r.read_numpy("z", copy=True).shape == (100,)


# ---------------------------------------------------------------- 6. metadata
def test_safe_open_metadata_of_an_empty_safetensors_metadata_is_empty(tmp_path):
    """ztensor.safe_open(f).metadata() gave None for a header whose __metadata__
    is {}, where safetensors gives {}; None stays for none (absent or null).
    SafetensorsFile.header_metadata keeps the difference; safe_open.metadata
    reports it."""
    entry = {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    for declared, expected in [(None, None), ({}, {}), ({"a": "b"}, {"a": "b"})]:
        path = tmp_path / f"m{len(str(declared))}.safetensors"
        header = dict(entry) if declared is None else {"__metadata__": declared, **entry}
        safetensors_file(path, header, b"\0" * 4)
        with ztensor.safe_open(str(path), "np") as f:
            assert f.metadata() == expected
    path = tmp_path / "null.safetensors"
    safetensors_file(path, {"__metadata__": None, **entry}, b"\0" * 4)
    with ztensor.safe_open(str(path), "np") as f:
        assert f.metadata() is None


def test_safe_open_metadata_of_a_zt_file_is_none_when_empty(tmp_path):
    """A zTensor file does not tell an empty attribute map from none: metadata()
    stays None for both (docs/migrating.md)."""
    path = tmp_path / "m.zt"
    ztensor.numpy.save_file({"x": np.ones(1)}, str(path), metadata={})
    with ztensor.safe_open(str(path), "np") as f:
        assert f.metadata() is None


# ---------------------------------------------------------------- 7. F8_E8M0, F4
@pytest.mark.parametrize("dtype, shape", [("F8_E8M0", [6]), ("F4", [12])])
def test_safetensors_dtypes_missing_from_our_table_are_refused_cleanly(tmp_path, dtype, shape):
    """safetensors 0.8 writes float8_e8m0fnu as "F8_E8M0" and float4_e2m1fn_x2 as
    "F4" (its shape counts 4-bit elements: 12 for 6 bytes).  The dtype table has
    neither type, so reading such a file is an UnsupportedError naming the file,
    the tensor and the dtype, never a misread (safetensors_file._entry, by
    dtypes.SAFETENSORS_STORAGE)."""
    path = tmp_path / "q.safetensors"
    safetensors_file(path, {"x": {"dtype": dtype, "shape": shape, "data_offsets": [0, 6]}},
                     bytes(6))
    with pytest.raises(ztensor.UnsupportedError, match=dtype) as info:
        ztensor.safe_open(str(path), "np")
    assert info.value.path == str(path) and info.value.obj == "x"


# ---------------------------------------------------------------- 8. signatures
def test_safetensors_08_keywords(tmp_path):
    """safetensors.numpy.save_file(tensor_dict=) and load_file(backend=) (0.8) were
    TypeErrors.  tensor_dict= is an alias of tensors= (arguments.keyword_aliases);
    backend "mmap" or "pread" is Reader's mmap= (safe.mapped_for_backend), anything
    else refused in safetensors' words."""
    path = tmp_path / "kw.zt"
    ztensor.numpy.save_file(tensor_dict={"x": np.ones(2)}, filename=str(path))
    assert len(ztensor.numpy.save(tensor_dict={"x": np.ones(2)})) > 0
    assert ztensor.numpy.load_file(str(path), backend="pread")["x"].tolist() == [1.0, 1.0]
    with ztensor.safe_open(str(path), "np", backend="pread") as f:
        assert f.get_tensor("x").tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match='backend "MMAP" is invalid'):
        ztensor.numpy.load_file(str(path), backend="MMAP")
    with pytest.raises(TypeError, match="backend"):
        ztensor.safe_open(str(path), "np", backend=None)


def test_safetensors_08_torch_keywords_match(tmp_path):
    """Every parameter name of safetensors 0.8's torch and numpy functions is one of
    ours (code passing any of them by keyword runs)."""
    pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    st_numpy = pytest.importorskip("safetensors.numpy")
    import inspect

    import ztensor.torch as zt_torch

    for ours, theirs in [(zt_torch, st_torch), (ztensor.numpy, st_numpy)]:
        for fn in ("save_file", "load_file", "save", "load", "save_model", "load_model"):
            if not hasattr(theirs, fn):
                continue
            mine = inspect.signature(getattr(ours, fn)).parameters
            aliases = {"tensor_dict"} if ours is ztensor.numpy else set()
            missing = set(inspect.signature(getattr(theirs, fn)).parameters) - set(mine) - aliases
            assert not missing, (fn, missing)
    path = tmp_path / "t.zt"
    zt_torch.save_file({"x": zt_torch.torch.ones(2)}, str(path))
    assert zt_torch.load_file(str(path), backend="pread")["x"].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- 9. bool indices
def test_np_get_slice_takes_bools_as_integers(small):
    """get_slice(...)[True] with framework="np" was refused; safetensors reads True
    and False as 1 and 0, in an index, a bound or a step (safe._selection)."""
    with ztensor.safe_open(str(small), "np") as f:
        s = f.get_slice("x")
        assert s[True].tolist() == [3.0, 4.0, 5.0]
        assert s[False].tolist() == [0.0, 1.0, 2.0]
        assert s[True, False] == 3.0
        assert s[..., True].tolist() == [1.0, 4.0]
        assert s[0:2:True].shape == (2, 3)
        with pytest.raises(ztensor.SafetensorError, match="step"):
            s[::False]
        with pytest.raises(ztensor.SafetensorError):
            s[np.True_]  # numpy's bool is no integer, in safetensors either


# ---------------------------------------------------------------- 10. copy_from
def test_copy_from_takes_a_reader_only(small, tmp_path):
    """Writer.copy_from("y.safetensors", "a") was a bare AttributeError: a
    TypeError saying it takes a Reader (Writer.copy_from)."""
    with ztensor.Writer(str(tmp_path / "o.zt")) as w:
        with pytest.raises(TypeError, match="ztensor.Reader"):
            w.copy_from(str(small), "x")
        with ztensor.Reader(str(small)) as r:
            w.copy_from(r, "x")


# ---------------------------------------------------------------- 11. names
@pytest.mark.parametrize("name", [5, b"n", None, 1.5])
def test_a_name_that_is_no_str_is_a_type_error(tmp_path, name):
    """w.add(5, arr) and w.add(b"n", arr) raised FormatError; the reference and
    safetensors raise TypeError for a name that is no str (Writer._check_name's
    first rule, for every write method)."""
    with ztensor.Writer(str(tmp_path / "n.zt")) as w:
        with pytest.raises(TypeError, match="object names are strings"):
            w.add(name, np.ones(2))
        with pytest.raises(TypeError, match="object names are strings"):
            w.write(name, ztensor.Tensor({"data": np.ones(2)}))
        with pytest.raises(ztensor.FormatError):
            w.add("", np.ones(2))  # a str, but empty: still the format's rule
    with pytest.raises(TypeError):
        ztensor.numpy.save({"b": np.zeros(1), 1: np.zeros(1)})
