"""Session 13, the core ``.zt`` read path red-teamed: objects every read path took,
turned into what a hostile user would hand them next.

* a sparse object whose values scipy.sparse cannot hold (f16, bf16, FP8): ``read_sparse``
  and ``Tensor.to_scipy`` raised scipy's bare ``ValueError``; without ml_dtypes a bf16 or
  FP8 object's bit patterns went to scipy as if they were its values
  (formats/sparse.scipy_values);
* a v0.1 sparse object of bf16 values came back from ``read`` with no type beside its
  bits (without ml_dtypes), so ``stats`` summarised the bits as numbers (reader.read's
  legacy branch, stats._values);
* a digest followed by a newline passed the well-formedness check (``re.match`` with
  ``$``): a right sha256 digest became a ``ChecksumError`` at verify, a crc32c one went
  through int()'s whitespace rule (manifest_checks.Checker.check_digest).
"""
import hashlib
import struct

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ztensor
from crafted import decode_both_ways, v1_file
from ztensor import kernels
from ztensor.tools import stats

ml_dtypes = pytest.importorskip("ml_dtypes")
scipy_sparse = pytest.importorskip("scipy.sparse")


def refused(exc_info, path, name, cls=ztensor.ZTensorError):
    exc = exc_info.value
    assert isinstance(exc, cls), exc
    assert exc.path == str(path) and exc.obj == name, (exc.path, exc.obj)
    return exc


# ------------------------------------------------------------------ sparse values scipy cannot hold
VALUES = {
    "f16": np.array([1.5, -2.0], np.float16),
    "bf16": np.array([1.5, -2.0], np.float32).astype(ml_dtypes.bfloat16),
    "f8_e4m3fn": np.array([1.5, -2.0], np.float32).astype(ml_dtypes.float8_e4m3fn),
    "f8_e5m2": np.array([1.5, -2.0], np.float32).astype(ml_dtypes.float8_e5m2),
}


def sparse_file(path, values, fmt):
    """One sparse object of ``values`` (2 non-zeros in a 2 x 3 matrix), by the Writer."""
    if fmt == "sparse_coo":
        comps = {"values": values, "coords": np.array([0, 1, 2, 0], "<u8")}
    else:
        comps = {"values": values, "indices": np.array([2, 0], "<u8"),
                 "indptr": np.array([0, 1, 2], "<u8")}
    with ztensor.Writer(path) as w:
        w.write("s", ztensor.Tensor(comps, shape=(2, 3), format=fmt))
    return path


@pytest.mark.parametrize("fmt", ["sparse_coo", "sparse_csr"])
@pytest.mark.parametrize("kind", sorted(VALUES))
def test_sparse_values_scipy_cannot_hold_are_unsupported_naming_the_object(tmp_path, kind, fmt):
    """read_sparse (and Tensor.to_scipy) of f16/bf16/FP8 values: scipy's bare ValueError
    before; now an UnsupportedError (still a ValueError) naming the file and object,
    while read() and stats keep working."""
    path = sparse_file(tmp_path / "s.zt", VALUES[kind], fmt)
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.UnsupportedError) as info:
            r.read_sparse("s")
        refused(info, path, "s")
        assert "scipy.sparse cannot hold" in str(info.value)
        t = r.read("s")
        with pytest.raises(ztensor.UnsupportedError):
            t.to_scipy()
        assert stats.tensor_stats(r, "s")["min"] == -2.0
        r.verify()


@pytest.mark.parametrize("kind", ["bf16", "f8_e4m3fn"])
def test_sparse_bits_are_never_handed_to_scipy_as_values(tmp_path, kind, no_ml_dtypes):
    """Without ml_dtypes read() keeps bf16/FP8 values as their bits, their type in
    ``types``: read_sparse gave a scipy array of the bit patterns (16320.0 for 1.5)."""
    path = sparse_file(tmp_path / "s.zt", VALUES[kind], "sparse_csr")
    with ztensor.Reader(path) as r:
        assert r.read("s").types == {"values": kind}
        with pytest.raises(ztensor.UnsupportedError) as info:
            r.read_sparse("s")
        refused(info, path, "s")


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint64, np.bool_,
                                   np.complex64])
def test_sparse_values_scipy_holds_still_convert(tmp_path, dtype):
    values = np.array([1, 2], dtype)
    path = sparse_file(tmp_path / "s.zt", values, "sparse_csr")
    with ztensor.Reader(path) as r:
        got = r.read_sparse("s")
    assert got.dtype == values.dtype
    np.testing.assert_array_equal(got.toarray(), [[0, 0, values[0]], [values[1], 0, 0]])


# ------------------------------------------------------------------ v0.1 bf16 sparse values
def v01_bf16_coo(path):
    """A v0.1 one-blob COO object (records of a u64 coordinate and a bf16 value), as
    the reference implementation lays it out (conventions.md)."""
    bits = np.array([1.5, -2.0, 3.0], np.float32).astype(ml_dtypes.bfloat16).view("<u2")
    rec = np.zeros(3, [("c", "<u8"), ("v", "<u2")])
    rec["c"], rec["v"] = [1, 4, 6], bits
    blob = rec.tobytes()
    out = b"ZTEN0001" + bytes(56) + blob
    entry = {"name": "s", "offset": 64, "size": len(blob), "dtype": "bfloat16", "shape": [8],
             "layout": "sparse", "sparse_format": "coo", "encoding": "raw"}
    meta = cbor2.dumps([entry])
    path.write_bytes(out + meta + struct.pack("<Q", len(meta)))
    return path


def test_v01_bf16_sparse_values_keep_their_type_and_stats_decode_them(tmp_path, no_ml_dtypes):
    """Without ml_dtypes a v0.1 bf16 sparse object's values are bits: read() named no
    type for them (a v1.2 object's read names "bf16"), and stats summarised the bits
    (min 16320.0 for values -2.0..3.0)."""
    path = v01_bf16_coo(tmp_path / "old.zt")
    with ztensor.Reader(path) as r:
        t = r.read("s")
        assert t.components["values"].dtype == np.uint16
        assert t.types == {"values": "bf16"}
        got = stats.tensor_stats(r, "s")
        assert (got["min"], got["max"], got["count"]) == (-2.0, 3.0, 3)
        with pytest.raises(ztensor.UnsupportedError):
            r.read_sparse("s")


def test_v01_bf16_sparse_values_with_ml_dtypes(tmp_path):
    path = v01_bf16_coo(tmp_path / "old.zt")
    with ztensor.Reader(path) as r:
        t = r.read("s")
        assert t.components["values"].dtype == ml_dtypes.bfloat16
        assert stats.tensor_stats(r, "s")["max"] == 3.0


# ------------------------------------------------------------------ digest spelling
BLOB = np.arange(16, dtype="<f4").tobytes()


def digests_of(data):
    crc = kernels.crc32c(np.frombuffer(data, np.uint8), 0)
    return {"sha256": "sha256:" + hashlib.sha256(data).hexdigest(),
            "crc32c": f"crc32c:0x{crc:08X}",
            "xxh3": f"xxh3:{kernels.xxh3_64(memoryview(data)):016x}"}


def digest_file(digest):
    m = {"version": "1.2.0", "objects": {"x": {"shape": [16], "format": "dense", "components": {
        "data": {"dtype": "f32", "offset": 64, "length": 64, "digest": digest}}}}}
    return v1_file(m, bytes(56) + BLOB)


def verdict(data):
    """'open' (FormatError opening), 'ok' (verify passed) or the verify error's class."""
    try:
        r = ztensor.Reader(data)
    except ztensor.FormatError:
        return "open"
    with r:
        try:
            r.verify()
        except ztensor.ZTensorError as exc:
            return type(exc).__name__
    return "ok"


@pytest.mark.parametrize("algorithm", ["sha256", "crc32c", "xxh3"])
@pytest.mark.parametrize("tail", ["\n", "\r\n", "\n\n", " ", "\t"])
def test_a_digest_with_trailing_whitespace_is_malformed_on_both_manifest_paths(algorithm, tail):
    """``$`` matched before a final newline: a right sha256 digest + "\\n" opened and
    then failed verify as a ChecksumError (bytes blamed for a spelling), a crc32c one
    verified (int() strips the newline)."""
    data = digest_file(digests_of(BLOB)[algorithm] + tail)
    assert verdict(data) == "open"
    fast, general, _ = decode_both_ways(data)
    assert fast == general and fast[0] == "FormatError" and "malformed" in fast[1], fast


def test_xxh3_digest_syntax_is_checked_at_open():
    """An xxh3 digest (verified over a v1 component's stored bytes) that cannot be one
    (not 16 hex digits) is a FormatError at open, not a ChecksumError at verify."""
    assert verdict(digest_file(digests_of(BLOB)["xxh3"])) == "ok"
    for bad in ("xxh3:zz", "xxh3:" + "0" * 15, "xxh3:" + "0" * 17, "xxh3:"):
        assert verdict(digest_file(bad)) == "open", bad


@settings(max_examples=150, deadline=None)
@given(algorithm=st.sampled_from(["sha256", "crc32c", "xxh3"]),
       upper=st.booleans(),
       prefix=st.text(alphabet="0 \t\n_x:", max_size=2),
       suffix=st.text(alphabet="0 \t\n_:\x00", max_size=2))
def test_property_a_respelled_right_digest_is_refused_at_open_or_verifies(algorithm, upper,
                                                                          prefix, suffix):
    """Property: the right digest of the bytes, respelled (case, characters before or
    after its hex), is either a FormatError at open or verifies: never a ChecksumError
    blaming bytes that match, and the two manifest paths agree."""
    right = digests_of(BLOB)[algorithm]
    name, _, hexpart = right.partition(":")
    if algorithm == "crc32c":
        hexpart = hexpart[2:]
        name += ":0x"
    else:
        name += ":"
    hexpart = hexpart.upper() if upper else hexpart.lower()
    data = digest_file(name + prefix + hexpart + suffix)
    got = verdict(data)
    assert got in ("open", "ok"), (prefix, suffix, got)
    if prefix or suffix:
        # only leading zeros of a crc32c within its 8 digits may stay well-formed
        assert got == "open" or (algorithm == "crc32c" and set(prefix) <= {"0"} and not suffix)
    fast, general, _ = decode_both_ways(data)
    assert (fast[0] == "FormatError") == (general[0] == "FormatError") == (got == "open")


# ------------------------------------------------------------------ read_into leaves nothing refused
@pytest.fixture
def bool_zstd(tmp_path):
    """A bool object written compressed by the Writer (64 elements)."""
    path = tmp_path / "b.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("b", np.arange(64) % 3 == 0, compress=True)
    return path


@pytest.mark.parametrize("decoded", [b"\x02" * 50, b"\x02" * 80, b"\x01" * 63 + b"\x02"],
                         ids=["short", "long", "bad-byte"])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_read_into_a_bool_destination_holds_no_refused_byte(bool_zstd, tmp_path, decoded,
                                                            framework):
    """A zstd stream that decodes to fewer or more bytes than declared fills the
    caller's memory before its size is judged: the FormatError left 0x02 bytes in the
    caller's bool array or tensor (only a bad byte of a stream of the right size was
    cleared)."""
    import zstandard
    from crafted import relaid
    path = relaid(bool_zstd, tmp_path / "lying.zt", zstandard.ZstdCompressor().compress(decoded),
                  name="b")
    if framework == "torch":
        torch = pytest.importorskip("torch")
        dst = torch.ones(64, dtype=torch.bool)
    else:
        dst = np.ones(64, np.bool_)
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError) as info:
            r.read_into("b", dst)
        refused(info, path, "b")
        with pytest.raises(ztensor.FormatError):
            r.read_numpy("b")
    raw = dst.view(np.uint8) if framework == "numpy" else dst.view(torch.uint8).numpy()
    assert int(raw.max()) <= 1
