"""Red team s11d (issue 21, round three): seek tables that lie, and stats' bins.

Files are made by the real writer (ztensor.Writer, zstd frames of 1 MiB with a seek
table), then the component's stored bytes are replaced with frames and a seek table
laid out here.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from crafted import relaid, seek_table  # tests/ is on sys.path: conftest.py

import ztensor
from ztensor.safe import safe_open
from ztensor.tools.stats import tensor_stats


@pytest.fixture(scope="module")
def seekable_file(tmp_path_factory):
    """(path, values, first frame, second frame, their seek-table entries)."""
    path = tmp_path_factory.mktemp("seek") / "seek.zt"
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    with ztensor.Writer(str(path)) as w:
        w.add("x", x, compress=True)  # 2 MiB: two frames and a table
    with ztensor.Reader(str(path)) as r:
        comp = r.metadata("x").components["data"]
        stored = bytes(r.stored_bytes("x", "data"))
    count = struct.unpack("<I", stored[-9:-5])[0]
    at = len(stored) - (8 + 8 * count + 9) + 8
    entries = [struct.unpack_from("<II", stored, at + 8 * i) for i in range(count)]
    assert count == 2 and comp.uncompressed_length == x.nbytes
    (c0, _), (c1, _) = entries
    return path, x, stored[:c0], stored[c0 : c0 + c1], entries


def test_stats_refuses_a_seek_table_every_read_refuses(seekable_file, tmp_path):
    """Frames whose declared decoded sizes are shifted by 4 bytes (the sums still
    add up): every read refused it, but stats streamed the component as one stream
    and gave figures (read_component_chunks ignored the table)."""
    src, x, f0, f1, [(c0, d0), (c1, d1)] = seekable_file
    path = relaid(src, tmp_path / "shift.zt", f0 + f1 + seek_table([(c0, d0 - 4), (c1, d1 + 4)]))
    with ztensor.Reader(str(path)) as r:
        with pytest.raises(ztensor.FormatError):
            r.read_numpy("x")
        with pytest.raises(ztensor.FormatError) as err:
            tensor_stats(r, "x")
    assert err.value.obj == "x" and err.value.path == str(path)
    # the honest table still streams
    good = relaid(src, tmp_path / "good.zt", f0 + f1 + seek_table([(c0, d0), (c1, d1)]))
    with ztensor.Reader(str(good)) as r:
        assert tensor_stats(r, "x")["count"] == x.size


def test_a_seek_table_of_many_empty_frames_costs_what_its_bytes_cost(seekable_file, tmp_path):
    """200,000 empty entries (a 1.6 MB table) before the real frames: a whole read
    decoded each in a thread pool task of its own, 6 s a read (a 100 MB table:
    minutes and gigabytes of Python ints).  Now each frame is decoded in turn on
    one reused decoder (seekable.decode_frames): about 0.6 s a read here."""
    src, x, f0, f1, [(c0, d0), (c1, d1)] = seekable_file
    entries = [(0, 0)] * 200_000 + [(c0, d0), (c1, d1)]
    path = relaid(src, tmp_path / "empty.zt", f0 + f1 + seek_table(entries))
    start = time.perf_counter()
    with ztensor.Reader(str(path)) as r:
        np.testing.assert_array_equal(r.read_numpy("x"), x)
        out = np.empty_like(x)
        r.read_into("x", out)
        np.testing.assert_array_equal(out, x)
        r.verify()
    assert time.perf_counter() - start < 120  # a hang guard: speed is bench/'s
    with safe_open(str(path), "np") as f:  # a slice still decodes only its frames
        np.testing.assert_array_equal(f.get_slice("x")[300:302], x[300:302])


@pytest.mark.parametrize("bins", [0, -1, 10**12, 2.5, True, "10", 1001])
def test_stats_bins_outside_the_cli_range_are_refused(tmp_path, bins):
    """bins=0 gave an empty histogram, -1 a bare IndexError/ValueError, 10**12 a 7 TiB
    allocation (MemoryError): the API takes what ``ztensor stats --bins`` takes."""
    path = tmp_path / "a.zt"
    with ztensor.Writer(str(path)) as w:
        w.add("big", np.array([-1.7e308, 1.7e308, 0.0]))
    with ztensor.Reader(str(path)) as r:
        with pytest.raises(ValueError, match="bins must be a whole number from 1 to 1000"):
            tensor_stats(r, "big", bins=bins)
        assert len(tensor_stats(r, "big", bins=1000)["histogram"]) == 1000
