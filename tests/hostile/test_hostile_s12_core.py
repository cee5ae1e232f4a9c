"""Hostile input, session 12, the core reader: seek tables (per-frame checksums, frames
that lie about their sizes) and a fresh pass over the .zt reader.

Files are made by the real writer (ztensor.Writer: zstd frames of 1 MiB with a seek
table); where a test needs frames or a table laid out otherwise, the component's
stored bytes are replaced with frames zstandard compresses and a table built as
zstd's seekable format lays it out.  Each test names the promise of
docs/threat-model.md it holds and the one function that keeps it.
"""

from __future__ import annotations

import struct

import cbor2
import numpy as np
import pytest
import zstandard
from crafted import relaid, seek_table  # tests/ is on sys.path: conftest.py

import ztensor
from ztensor.io import seekable
from ztensor.safe import safe_open
from ztensor.tools.stats import tensor_stats


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(path, values): one 2 MiB float32 tensor the Writer stores as two frames."""
    path = tmp_path_factory.mktemp("s12") / "src.zt"
    x = np.random.default_rng(12).standard_normal((512, 1024)).astype(np.float32)
    with ztensor.Writer(str(path)) as w:
        w.add("x", x, compress=True)
    with ztensor.Reader(str(path)) as r:
        stored = bytes(r.stored_bytes("x", "data"))
    assert struct.unpack("<I", stored[-9:-5])[0] == 2  # two frames and a table
    return path, x


def frames_of(raw, step, checksum=False):
    """``raw`` cut into zstd frames of ``step`` decoded bytes: (frames, entries)."""
    cctx = zstandard.ZstdCompressor(level=1, write_checksum=checksum)
    parts = [raw[i : i + step] for i in range(0, len(raw), step)]
    frames = [cctx.compress(p) for p in parts]
    return frames, [(len(f), len(p)) for f, p in zip(frames, parts)]


def every_read_refuses(path, exc=ztensor.FormatError, rows=(0, 512)):
    """Whole read, read_into, stats, a slice over ``rows`` and dask chunks all
    refuse the file, each naming it and the object."""
    errors = []
    with ztensor.Reader(str(path)) as r:
        with pytest.raises(exc) as err:
            r.read_numpy("x")
        errors.append(err.value)
        with pytest.raises(exc) as err:
            r.read_into("x", np.empty((512, 1024), np.float32))
        errors.append(err.value)
        with pytest.raises(exc) as err:
            tensor_stats(r, "x")
        errors.append(err.value)
    with safe_open(str(path), "np") as f:
        with pytest.raises(exc) as err:
            f.get_slice("x")[rows[0] : rows[1]]
        errors.append(err.value)
    for e in errors:
        assert e.path == str(path) and e.obj == "x", e


# ---- a seek table whose frames lie about their sizes is refused on every path
# (Bounded/Clean: seekable.decode_frames, used by decode_whole, decode_range and
# frame_chunks)


def test_tiny_frames_that_lie_about_their_sizes_are_refused_by_every_read(written, tmp_path):
    """512 real frames of 4 KiB, the first two entries' decoded sizes shifted by 4
    bytes (the sums still add up).  A whole read decoded such a table (frames under
    64 KiB on average) as one stream and returned the values, stats streamed them,
    while a slice of the first frame refused: one file, two answers."""
    src, x = written
    frames, entries = frames_of(x.astype("<f4").tobytes(), 4096)
    (c0, d0), (c1, d1) = entries[:2]
    lying = [(c0, d0 - 4), (c1, d1 + 4)] + entries[2:]
    path = relaid(src, tmp_path / "tiny.zt", b"".join(frames) + seek_table(lying))
    every_read_refuses(path, rows=(0, 1))
    # the same frames with an honest table read on every path
    good = relaid(src, tmp_path / "good.zt", b"".join(frames) + seek_table(entries))
    with ztensor.Reader(str(good)) as r:
        np.testing.assert_array_equal(r.read_numpy("x"), x)
        assert tensor_stats(r, "x")["count"] == x.size
    with safe_open(str(good), "np") as f:
        np.testing.assert_array_equal(f.get_slice("x")[3:7], x[3:7])


def test_a_slice_across_two_lying_frames_is_refused_not_shifted(written, tmp_path):
    """The Writer's two frames, their decoded sizes shifted by 4 bytes: a slice whose
    rows span both frames decoded them as one stream, checked only the total, and
    returned the rows 4 bytes off (wrong values, silently)."""
    src, x = written
    with ztensor.Reader(str(src)) as r:
        stored = bytes(r.stored_bytes("x", "data"))
    count = 2
    at = len(stored) - (8 + 8 * count + 9) + 8
    (c0, d0), (c1, d1) = [struct.unpack_from("<II", stored, at + 8 * i) for i in range(2)]
    frames = stored[: c0 + c1]
    path = relaid(src, tmp_path / "shift.zt", frames + seek_table([(c0, d0 - 4), (c1, d1 + 4)]))
    with safe_open(str(path), "np") as f:
        with pytest.raises(ztensor.FormatError) as err:
            f.get_slice("x")[250:260]  # rows 250..259 straddle the 1 MiB boundary
    assert err.value.path == str(path) and err.value.obj == "x"


def test_dask_chunks_refuse_a_lying_table(written, tmp_path):
    pytest.importorskip("dask")
    import ztensor.dask

    src, x = written
    frames, entries = frames_of(x.astype("<f4").tobytes(), 4096)
    (c0, d0), (c1, d1) = entries[:2]
    lying = [(c0, d0 - 4), (c1, d1 + 4)] + entries[2:]
    path = relaid(src, tmp_path / "tiny.zt", b"".join(frames) + seek_table(lying))
    arr = ztensor.dask.from_zt(str(path), "x", rows=64)
    with pytest.raises(ztensor.FormatError) as err:
        arr[:64].compute(scheduler="synchronous")
    assert err.value.obj == "x"
    np.testing.assert_array_equal(arr[64:128].compute(scheduler="synchronous"), x[64:128])


def test_a_frame_stored_in_zero_bytes_cannot_declare_decoded_bytes(written, tmp_path):
    """An entry of 0 stored bytes that declares 4 decoded ones, the next frame's
    declaration 4 less: refused, not skipped."""
    src, x = written
    frames, entries = frames_of(x.astype("<f4").tobytes(), 4096)
    (c0, d0) = entries[0]
    lying = [(0, 4), (c0, d0 - 4)] + entries[1:]
    path = relaid(src, tmp_path / "zero.zt", b"".join(frames) + seek_table(lying))
    every_read_refuses(path, rows=(0, 1))


# ---- per-frame checksums in a seek table are checked (the checksum flag)
# (Clean: seekable._FrameDecoder.check, under seekable.decode_frames)


def test_frame_checksum_is_xxh64s_low_word():
    """xxHash's published XXH64 values (seed 0): "" -> ef46db3751d8e999,
    "abc" -> 44bc2cf5ad770999; the seek table stores the low 32 bits."""
    assert seekable.frame_checksum(b"") == 0x51D8E999
    assert seekable.frame_checksum(b"abc") == 0xAD770999
    # and what zstd itself ends a checksummed frame with
    data = np.arange(300_000, dtype=np.float32).tobytes()
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(data)
    assert seekable.frame_checksum(data) == struct.unpack("<I", frame[-4:])[0]


def checksummed(x, step=256 << 10):
    """Frames without zstd's own content checksum, and a table that carries the
    XXH64 low words, as zstd's seekable format writers with the checksum flag do."""
    raw = x.astype("<f4").tobytes()  # the file's byte order on any host
    frames, entries = frames_of(raw, step)
    sums = [seekable.frame_checksum(raw[i : i + step]) for i in range(0, len(raw), step)]
    return frames, entries, sums


def test_a_table_with_checksums_reads_when_they_match(written, tmp_path):
    src, x = written
    frames, entries, sums = checksummed(x)
    path = relaid(src, tmp_path / "sums.zt", b"".join(frames) + seek_table(entries, sums))
    with ztensor.Reader(str(path)) as r:
        np.testing.assert_array_equal(r.read_numpy("x"), x)
        out = np.empty_like(x)
        r.read_into("x", out)
        np.testing.assert_array_equal(out, x)
        assert tensor_stats(r, "x")["count"] == x.size
    with safe_open(str(path), "np") as f:
        np.testing.assert_array_equal(f.get_slice("x")[100:300], x[100:300])


def test_a_frame_whose_bytes_differ_from_its_checksum_is_refused(written, tmp_path):
    """Frame 2 replaced by a frame of other values of the same size (a splice, or
    corruption that still decodes): the table's checksum for it no longer matches.
    It was parsed and never checked: every read returned the other values."""
    src, x = written
    frames, entries, sums = checksummed(x)
    other = x.copy()
    other[200:210] += 1.0  # inside frame 3 (rows 192..255)
    swapped = zstandard.ZstdCompressor(level=1).compress(other.astype("<f4").tobytes()[3 * (256 << 10) : 4 * (256 << 10)])
    frames[3] = swapped
    entries[3] = (len(swapped), 256 << 10)
    path = relaid(src, tmp_path / "splice.zt", b"".join(frames) + seek_table(entries, sums))
    every_read_refuses(path, exc=ztensor.ChecksumError, rows=(200, 201))
    with safe_open(str(path), "np") as f:  # frames the slice does not touch still read
        np.testing.assert_array_equal(f.get_slice("x")[0:100], x[0:100])


def test_tiny_checksummed_frames_are_checked_too(written, tmp_path):
    """Frames of 1 KiB (under the size where frames are decoded in threads): the
    sequential path checks the same checksums."""
    src, x = written
    frames, entries, sums = checksummed(x, step=1024)
    sums[7] ^= 1
    path = relaid(src, tmp_path / "tinysum.zt", b"".join(frames) + seek_table(entries, sums))
    every_read_refuses(path, exc=ztensor.ChecksumError, rows=(1, 2))  # frame 7: row 1


# ---- dequantizing a file's object names the file and object when it refuses
# (Clean: quantized.dequantize_read, used by stats and `ztensor dequantize`)


@pytest.fixture
def other_convention(tmp_path):
    """A quantized_group object in a convention ztensor does not dequantize (codes
    packed along axis 1): a valid object the Writer writes and read() returns."""
    w = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
    q = ztensor.quantize(w, bits=4, group_size=128)
    other = ztensor.Tensor(
        dict(q.components), shape=q.shape, format=q.format,
        attributes={**q.attributes, "pack_axis": 1},
    )
    path = tmp_path / "other.zt"
    with ztensor.Writer(str(path)) as out:
        out.write("layer.weight", other)
    return path


def test_stats_of_a_quantized_object_it_cannot_dequantize_names_it(other_convention):
    """The UnsupportedError named neither the file nor the object."""
    with ztensor.Reader(str(other_convention)) as r:
        assert r.read("layer.weight").attributes["pack_axis"] == 1
        with pytest.raises(ztensor.UnsupportedError, match="pack_axis") as err:
            tensor_stats(r, "layer.weight")
    assert err.value.path == str(other_convention) and err.value.obj == "layer.weight"


def test_cli_dequantize_refusal_names_the_file_and_object(other_convention, tmp_path, capsys):
    from ztensor.tools import cli

    assert cli.main(["dequantize", str(other_convention), str(tmp_path / "o.zt")]) != 0
    err = capsys.readouterr().err
    assert str(other_convention) in err and "layer.weight" in err and "pack_axis" in err


# ---- property: however a table cuts the frames and whatever it declares, every read
# of the component either gives the values or refuses (seekable.decode_frames)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(path, values): a 64 x 64 float32 tensor the Writer stores as one zstd frame."""
    path = tmp_path_factory.mktemp("s12p") / "small.zt"
    x = (np.arange(64 * 64, dtype=np.float32) % 97).reshape(64, 64)
    with ztensor.Writer(str(path)) as w:
        w.add("x", x, compress=True)
    return path, x


def outcomes(path, x, rows):
    """What each read path gives: "values" (exactly x's), or the error class."""
    got = {}

    def run(key, fn):
        try:
            fn()
            got[key] = "values"
        except (ztensor.FormatError, ztensor.ChecksumError) as e:
            assert e.path == str(path) and e.obj == "x", e
            got[key] = "refused"

    def whole():
        with ztensor.Reader(str(path)) as r:
            np.testing.assert_array_equal(r.read_numpy("x"), x)

    def into():
        with ztensor.Reader(str(path)) as r:
            out = np.empty_like(x)
            r.read_into("x", out)
            np.testing.assert_array_equal(out, x)

    def stats():
        with ztensor.Reader(str(path)) as r:
            assert tensor_stats(r, "x")["count"] == x.size

    def part():
        with safe_open(str(path), "np") as f:
            np.testing.assert_array_equal(f.get_slice("x")[rows[0] : rows[1]], x[rows[0] : rows[1]])

    for key, fn in (("whole", whole), ("into", into), ("stats", stats), ("slice", part)):
        run(key, fn)
    return got


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cuts=st.lists(st.integers(1, 64 * 64 * 4 - 1), max_size=12, unique=True),
    shift=st.tuples(st.integers(0, 12), st.integers(-64, 64)),
    checksums=st.booleans(),
    rows=st.tuples(st.integers(0, 63), st.integers(1, 64)).map(sorted),
    tmp=st.just(None),
)
def test_every_read_agrees_on_any_seek_table(small, tmp_path_factory, cuts, shift, checksums, rows, tmp):
    src, x = small
    raw = x.astype("<f4").tobytes()  # the file's byte order on any host
    bounds = [0] + sorted(cuts) + [len(raw)]
    parts = [raw[a:b] for a, b in zip(bounds, bounds[1:])]
    cctx = zstandard.ZstdCompressor(level=1)
    frames = [cctx.compress(p) for p in parts]
    entries = [[len(f), len(p)] for f, p in zip(frames, parts)]
    at, by = shift
    lying = False
    if len(entries) > 1 and by and at < len(entries) - 1:
        # move ``by`` decoded bytes from one frame's declaration to the next: the sums
        # still add up, the frames no longer yield what the table says
        by = max(-entries[at][1], min(by, entries[at + 1][1]))
        entries[at][1] += by
        entries[at + 1][1] -= by
        lying = by != 0
    sums = [seekable.frame_checksum(p) for p in parts] if checksums else None
    path = relaid(src, tmp_path_factory.mktemp("p") / "p.zt",
                  b"".join(frames) + seek_table([tuple(e) for e in entries], sums))
    got = outcomes(path, x, (rows[0], max(rows[1], rows[0] + 1)))
    whole = {got["whole"], got["into"], got["stats"]}
    assert len(whole) == 1, got  # whole reads, read_into and stats agree
    assert whole == {"refused" if lying else "values"}, got
    if not lying:
        assert got["slice"] == "values", got


# ---- a manifest map that holds one key twice is refused, not merged
# (Clean, nothing dropped silently: manifest_checks.refuse_repeated_keys, used by
# manifest._cbor_loads and manifest_table._attributes)


def _manifest_of(path):
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[-16:-8])[0]
    return raw[: -16 - size], raw[-16 - size : -16]


def _with_manifest(body, manifest, dst):
    dst.write_bytes(body + manifest + struct.pack("<Q", len(manifest)) + b"ZTEN1000")
    return dst


def _renamed_key(encoded, old, new):
    """CBOR bytes with one text key ``old`` spelt ``new`` (same length)."""
    old_b, new_b = bytes([0x60 + len(old)]) + old.encode(), bytes([0x60 + len(new)]) + new.encode()
    assert encoded.count(old_b) == 1 and len(old) == len(new) < 24
    return encoded.replace(old_b, new_b)


@pytest.fixture
def two_tensors(tmp_path):
    path = tmp_path / "two.zt"
    w = np.random.default_rng(5).standard_normal((64, 256)).astype(np.float32)
    with ztensor.Writer(str(path), attributes={"big": 2**70, "note": "x"}) as out:
        out.write_numpy("aa", np.arange(16, dtype=np.float32))
        out.write_numpy("ab", np.arange(16, dtype=np.float32) + 100)
        out.write("q", ztensor.quantize(w, bits=4, group_size=128))
    return path


def test_a_file_with_no_repeated_key_still_opens(two_tensors):
    """The Writer's file, a bignum attribute included (its tag makes the scan count
    one item more than the decoded tree: the keys are then walked, and none repeats)."""
    with ztensor.Reader(str(two_tensors)) as r:
        assert r.keys() == ["aa", "ab", "q"] and r.attributes["big"] == 2**70


@pytest.mark.parametrize("old,new", [("ab", "aa"), ("group_size", "pack_order")])
def test_a_repeated_key_is_refused(two_tensors, tmp_path, old, new):
    """Both objects named 'aa': cbor2 kept the second, and the file opened with one
    tensor, 'aa' holding the other's values.  An attribute given twice (the quantized
    object's 'pack_order' written again where 'group_size' was) was merged the same
    way, on the fast path's attribute decoding too."""
    body, manifest = _manifest_of(two_tensors)
    path = _with_manifest(body, _renamed_key(manifest, old, new), tmp_path / "dup.zt")
    with pytest.raises(ztensor.FormatError, match=f"key '{new}' twice") as err:
        ztensor.Reader(str(path)).close()
    assert err.value.path == str(path)


def test_a_repeated_component_role_or_root_key_is_refused(tmp_path):
    """A component role given twice ('data' under both names) and the root's
    'objects' given twice (the first map of objects dropped whole)."""
    src = tmp_path / "one.zt"
    with ztensor.Writer(str(src)) as out:
        out.write_numpy("a", np.arange(16, dtype=np.float32))
        out.write_numpy("b", np.arange(16, dtype=np.float32) + 100)
    body, manifest = _manifest_of(src)
    m = cbor2.loads(manifest)
    m["objects"]["a"]["components"]["datb"] = m["objects"]["b"]["components"]["data"]
    del m["objects"]["b"]
    path = _with_manifest(body, _renamed_key(cbor2.dumps(m), "datb", "data"), tmp_path / "r.zt")
    with pytest.raises(ztensor.FormatError, match="key 'data' twice"):
        ztensor.Reader(str(path)).close()
    m = cbor2.loads(manifest)
    m["objectz"] = {"c": m["objects"].pop("b")}
    path = _with_manifest(body, _renamed_key(cbor2.dumps(m), "objectz", "objects"), tmp_path / "o.zt")
    with pytest.raises(ztensor.FormatError, match="key 'objects' twice"):
        ztensor.Reader(str(path)).close()
