"""`ztensor stats` of a zstd-compressed dense object decodes it a chunk at a time on
each pass, never whole: memory stays at one chunk whatever it decodes to, the figures
are exactly those of the same tensor stored raw, and a read's checks still hold (the
declared decoded length, corrupt data, digests, limits), each a clean ZTensorError
naming the file and the object."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
from unittest import mock

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ztensor
from sanitizers import measured_env
from v2files import build
from ztensor.tools import stats
from ztensor.tools.cli import main

BIG = 256 << 20  # float32 zeros: 1 GiB decoded, about 60 KB compressed
SKIPPABLE = 0x184D2A50  # a zstd skippable frame: every decoder passes over it


@pytest.fixture(scope="module")
def zeros(tmp_path_factory):
    """The 256M-zero tensor, compressed, and the same tensor stored raw."""
    where = tmp_path_factory.mktemp("zeros")
    packed, raw = str(where / "packed.zt"), str(where / "raw.zt")
    data = np.zeros(BIG, np.float32)  # calloc'd: the untouched pages cost nothing
    with ztensor.Writer(packed) as w:
        w.write_numpy("zeros", data, compress=True)
    with ztensor.Writer(raw) as w:
        w.write_numpy("zeros", data)
    return packed, raw


def _peak_script(path):
    """A fresh interpreter that prints the stats and how much its resident memory
    grew while they were computed (imports and the open come first, so they are not
    counted).  The peak is the process's VmHWM: ru_maxrss would also count the peak
    of this pytest process, which a forked child inherits across exec."""
    return textwrap.dedent(
        f"""
        import json, ztensor
        from ztensor.tools.stats import tensor_stats
        def status_kib(field):
            with open("/proc/self/status") as f:
                return int(f.read().split(field + ":")[1].split()[0])
        with ztensor.Reader({path!r}) as r:
            before = status_kib("VmRSS")
            out = tensor_stats(r, "zeros")
        grew = status_kib("VmHWM") - before
        print(json.dumps({{"stats": out, "grew_kib": grew}}))
        """
    )


def test_stats_of_a_compressed_gigabyte_stay_within_a_chunk(zeros):
    packed, raw = zeros
    assert os.path.getsize(packed) < 100_000  # what the report measured: 1 GiB in KBs
    run = subprocess.run(
        [sys.executable, "-c", _peak_script(packed)],
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard: s390x emulation takes ~100 s
        env=measured_env(),
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    # whole decoding held the 1 GiB (about 1.3 GB of peak RSS); a chunk is a few MiB
    assert found["grew_kib"] < 64 * 1024, found["grew_kib"]
    with ztensor.Reader(raw) as r:
        assert r.metadata("zeros").components["data"].encoding == "raw"
        expected = stats.tensor_stats(r, "zeros")
    assert found["stats"] == expected
    assert expected["count"] == expected["zeros"] == BIG
    assert expected["histogram"] == [BIG]


def test_the_command_on_the_compressed_gigabyte(zeros):
    packed, _ = zeros
    # a wrapper whose only child is the command: its RUSAGE_CHILDREN is the command's
    wrapper = textwrap.dedent(
        f"""
        import resource, subprocess, sys
        run = subprocess.run([sys.executable, "-m", "ztensor", "stats", {packed!r}],
                             capture_output=True, text=True)
        sys.stdout.write(run.stdout)
        sys.stderr.write(run.stderr)
        print("PEAK", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        sys.exit(run.returncode)
        """
    )
    # the timeout only guards against a hang: speed is measured in bench/, and
    # under s390x emulation this run takes about 100 s
    run = subprocess.run(
        [sys.executable, "-c", wrapper],
        capture_output=True,
        text=True,
        timeout=900,
        env=measured_env(),
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:5] == ["NAME", "MIN", "MAX", "MEAN", "STD"]
    row = lines[1].split()
    assert row[:7] == ["zeros", "0", "0", "0", "0", "0", "0"]
    peak_kib = int(lines[-1].split()[1])
    assert peak_kib < 256 * 1024, peak_kib  # the whole stream held: over 1.3 GB


# ------------------------------------------------------------------ equal to raw
KINDS = {
    "float16": (np.float16, None),
    "float32": (np.float32, None),
    "float64": (np.float64, None),
    "bf16": (np.float32, "bf16"),
    "f8_e4m3fn": (np.float32, "f8_e4m3fn"),
    "f8_e5m2": (np.float32, "f8_e5m2"),
    "complex64": (np.complex64, None),
    "int16": (np.int16, None),
}


@st.composite
def tensors(draw):
    kind = draw(st.sampled_from(sorted(KINDS)))
    dtype, ltype = KINDS[kind]
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9))
    kind_of = np.dtype(dtype).kind
    if kind_of == "i":
        elements = st.integers(-(2**15), 2**15 - 1)
    elif kind_of == "c":
        elements = st.complex_numbers(allow_nan=True, allow_infinity=True, width=64)
    else:  # float64's full range too: its sums are scaled so as never to overflow
        width = 8 * np.dtype(dtype).itemsize
        elements = st.floats(allow_nan=True, allow_infinity=True, width=width)
    arr = draw(hnp.arrays(dtype, shape, elements=elements))
    return arr, ltype


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("pairs")


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # examples: the profile's
@given(
    tensor=tensors(),
    chunk=st.integers(1, 40),
    checksum=st.sampled_from([None, "crc32c", "sha256"]),
    verify=st.booleans(),
)
def test_stats_of_compressed_equal_stats_of_raw(scratch, tensor, chunk, checksum, verify):
    arr, ltype = tensor
    figures = []
    for compress in (False, True):
        path = str(scratch / f"t{int(compress)}.zt")
        with ztensor.Writer(path) as w:
            w.write_numpy("t", arr, compress=compress, checksum=checksum, type=ltype)
        # a small chunk: the stream crosses many piece boundaries, as a large one does
        with mock.patch.object(stats, "_CHUNK", chunk), ztensor.Reader(path, verify=verify) as r:
            assert r.metadata("t").components["data"].encoding == ("zstd" if compress else "raw")
            figures.append(stats.tensor_stats(r, "t", bins=7))
    assert figures[0] == figures[1]


def test_stats_of_a_multi_frame_stream_equal_raw(tmp_path):
    """A component of several seekable frames (1 MiB each) and its seek table."""
    rng = np.random.default_rng(5)
    arr = rng.standard_normal(700_000).astype(np.float32)
    arr[::1000] = np.nan
    arr[7] = -np.inf
    out = []
    for compress in (False, True):
        path = str(tmp_path / f"m{int(compress)}.zt")
        with ztensor.Writer(path) as w:
            w.write_numpy("m", arr, compress=compress, checksum="sha256")
        with ztensor.Reader(path, verify=True) as r:
            out.append(stats.tensor_stats(r, "m"))
    assert out[0] == out[1]
    assert out[1]["nan"] == 700 and out[1]["neginf"] == 1


def test_a_sharded_checkpoint_streams_its_compressed_shards(tmp_path):
    arr = np.linspace(-3, 3, 5000, dtype=np.float32)
    ztensor.save_sharded({"a": arr, "b": arr[:10]}, tmp_path, compress=True)
    with ztensor.open_sharded(tmp_path) as r:
        # streamed: the whole-component decoder is never called
        with mock.patch("ztensor.io.zstd_stream.zstd_decode", side_effect=AssertionError):
            got = stats.tensor_stats(r, "a")
    with ztensor.Reader(_write_raw(tmp_path / "raw.zt", arr)) as r:
        assert got == stats.tensor_stats(r, "a")


def _write_raw(path, arr):
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("a", arr)
    return str(path)


# ------------------------------------------------------------------ v2 decoded digests
def _v2_file(tmp_path, arr, digest):
    """A v2 file holding ``arr`` as one zstd-seekable part with a decoded digest."""
    stored = arr.astype("<f4").tobytes()
    stream = zstandard.ZstdCompressor().compress(stored)
    part = {"dtype": "f32", "blob": [4096, len(stream)], "encoding": "zt.zstd-seekable/1",
            "decoded_length": len(stored), "digest": digest(stored)}
    path = tmp_path / "v2.zt"
    path.write_bytes(build({"v": {"shape": [arr.size], "layout": "dense",
                                  "parts": {"data": part}}}, [(4096, stream)]))
    return str(path)


@pytest.mark.parametrize("algorithm", ["sha256", "xxh3"])
def test_v2_decoded_digests_are_checked_while_streaming(tmp_path, algorithm):
    import hashlib

    from v2files import xxh3

    arr = np.arange(40_000, dtype=np.float32)

    def good(stored):
        if algorithm == "sha256":
            return "sha256:" + hashlib.sha256(stored).hexdigest()
        return f"xxh3:{xxh3(stored):016x}"

    def bad(stored):
        return good(stored[:-1] + b"\x01")

    path = _v2_file(tmp_path, arr, good)
    with ztensor.Reader(path, verify=True) as r, mock.patch.object(stats, "_CHUNK", 1000):
        assert stats.tensor_stats(r, "v")["max"] == 39_999.0
    path = _v2_file(tmp_path, arr, bad)
    with ztensor.Reader(path) as r:  # not verifying: the figures, unchecked
        assert stats.tensor_stats(r, "v")["count"] == 40_000
    with ztensor.Reader(path, verify=True) as r, mock.patch.object(stats, "_CHUNK", 1000):
        with pytest.raises(ztensor.ChecksumError, match=algorithm) as err:
            stats.tensor_stats(r, "v")
    assert err.value.obj == "v" and err.value.path == path


# ------------------------------------------------------------------ corrupt streams
N = 60_000  # float32: one frame (under 1 MiB), so no seek table


@pytest.fixture
def corruptible(tmp_path):
    """(path, offset, length, data): a file whose compressed component can be
    replaced, in place, by other bytes of the same length."""
    # compressible values: a stream made at a higher level below has room to spare
    data = np.random.default_rng(3).integers(-8, 8, N).astype(np.float32)
    path = str(tmp_path / "c.zt")
    with ztensor.Writer(path) as w:
        w.write_numpy("w", data, compress=True)
    with ztensor.Reader(path) as r:
        comp = r.metadata("w").components["data"]
        assert comp.encoding == "zstd"
    return path, comp.offset, comp.length, data.tobytes()


def _replace(path, offset, length, stream):
    """Put ``stream`` where the component was, padded to its length with a skippable
    frame: the manifest still holds."""
    pad = length - len(stream)
    assert pad >= 8
    stream += struct.pack("<II", SKIPPABLE, pad - 8) + bytes(pad - 8)
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(stream)


def _compress(data):  # smaller than the writer's level 3: room for a skippable frame
    return zstandard.ZstdCompressor(level=19).compress(data)


def _shorter(data, length):  # decodes to 4000 bytes fewer than declared
    return _compress(data[:-4000])


def _short_of_an_element(data, length):  # 3 bytes fewer: the last piece is no whole float
    return _compress(data[:-3])


def _longer(data, length):  # decodes to 4 bytes more than declared
    return _compress(bytes(len(data) + 4))


def _truncated(data, length):  # the frame cut in half
    return _compress(data)[: length // 2]


def _garbage(data, length):  # not zstd at all
    return np.random.default_rng(9).integers(0, 256, length - 8, np.uint8).tobytes()


@pytest.mark.parametrize(
    "make, words",
    [
        (_shorter, "ends after 236000 bytes"),
        (_short_of_an_element, "ends after 239997 bytes"),
        (_longer, "yields more than the 240000 bytes"),
        (_truncated, "corrupt zstd data|ends after"),
        (_garbage, "corrupt zstd data"),
    ],
)
@pytest.mark.parametrize("verify", [False, True])
def test_a_corrupt_stream_is_a_format_error_naming_the_object(corruptible, make, words, verify):
    path, offset, length, data = corruptible
    _replace(path, offset, length, make(data, length))
    with ztensor.Reader(path, verify=verify) as r, mock.patch.object(stats, "_CHUNK", 4096):
        with pytest.raises(ztensor.FormatError, match=words) as err:
            stats.tensor_stats(r, "w")
        assert err.value.obj == "w" and err.value.path == r.path
        with pytest.raises(ztensor.FormatError, match=words):  # as a whole read says
            r.read_numpy("w")


def test_the_command_reports_a_corrupt_stream_in_one_line(corruptible, capsys):
    path, offset, length, data = corruptible
    _replace(path, offset, length, _shorter(data, length))
    assert main(["stats", path]) != 0
    err = capsys.readouterr().err
    assert "object 'w'" in err and "ends after" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_stored_digest_is_still_checked(tmp_path):
    """v1 digests cover the stored bytes: a verifying Reader checks them before the
    first piece is decoded."""
    data = np.arange(N, dtype=np.float32)
    path = str(tmp_path / "d.zt")
    with ztensor.Writer(path) as w:
        w.write_numpy("w", data, compress=True, checksum="crc32c")
    with ztensor.Reader(path) as r:
        comp = r.metadata("w").components["data"]
    with open(path, "r+b") as f:  # one byte of the frame's content changed
        f.seek(comp.offset + comp.length - 1)
        last = f.read(1)
        f.seek(comp.offset + comp.length - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    with ztensor.Reader(path, verify=True) as r:
        with pytest.raises(ztensor.ChecksumError, match="crc32c") as err:
            stats.tensor_stats(r, "w")
        assert err.value.obj == "w"


def test_limits_still_apply(corruptible):
    path = corruptible[0]
    small = ztensor.Limits().with_(max_total_decompressed=N * 4 - 1)
    with pytest.raises(ztensor.LimitError):  # the declared size, refused at open
        ztensor.Reader(path, limits=small)
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.LimitError, match="max-elements") as err:
            stats.tensor_stats(r, "w", max_elements=N - 1)  # before any decoding
        assert err.value.obj == "w"
