"""Reading from a cold page cache: the batch read against ``cat`` and a zero-copy touch.

    python bench/bench_cold.py [--size-mb 512] [--tensors 8] [--repeat 5] [--dir DIR]

Needs root (it writes ``/proc/sys/vm/drop_caches`` before every timed call); the file
lives in ``--dir`` (default: a temporary folder), which must be on a real disk, not
tmpfs.  One file of ``--tensors`` float32 tensors, ``--size-mb`` in all.  Each
repetition, with the caches dropped before each call, times in turn:

* ``cat FILE > /dev/null``: the rate the disk and the kernel's readahead give
  (the baseline);
* ``Reader.read_numpy(names, copy=True)``: the batch read into owned arrays;
* zero-copy ``read_numpy`` of every tensor, one byte touched per 4 KiB page;
* the reference's batch read when it is installed (``ZTENSOR_REF_CACHE``).

Figures are medians in GB/s, and ratios to ``cat`` measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

import ztensor
import ztensor.numpy

PAGE = 4096


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def timed(fn) -> float:
    drop_caches()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=512)
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(dir=args.dir or os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(folder, "cold.zt")
    each = args.size_mb * (1 << 20) // args.tensors // 4
    rng = np.random.default_rng(0)
    tensors = {f"t{i}": rng.random(each, dtype=np.float32) for i in range(args.tensors)}
    ztensor.numpy.save_file(tensors, path)
    total = sum(t.nbytes for t in tensors.values())
    del tensors
    names = [f"t{i}" for i in range(args.tensors)]

    def cat():
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)

    def batch():
        with ztensor.Reader(path) as r:
            out = r.read_numpy(names, copy=True)
        assert sum(a.nbytes for a in out.values()) == total

    def touch():
        with ztensor.Reader(path) as r:
            for n in names:
                r.read_numpy(n).view(np.uint8)[::PAGE].sum()

    rows = {"cat": cat, "batch read, copy=True": batch, "zero-copy + touch": touch}
    times = {k: [] for k in rows}
    try:
        for _ in range(args.repeat):
            for k, fn in rows.items():
                times[k].append(timed(fn))
    finally:
        os.unlink(path)
        os.rmdir(folder)
    base = statistics.median(times["cat"])
    print(f"{total / 1e6:.0f} MB in {args.tensors} float32 tensors, caches dropped before "
          f"each call, medians of {args.repeat}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"  {k:24s} {total / med / 1e9:5.2f} GB/s  ({base / med:4.2f}x cat's rate; "
              f"slowest {total / max(ts) / 1e9:5.2f} GB/s)")


if __name__ == "__main__":
    main()
