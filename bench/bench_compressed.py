"""Compressed tensors: zstd frames with a seek table (ztensor/io/seekable.py) against the
single-stream layout and zstd itself, measured in one run.

    python bench/bench_compressed.py [--mb 128] [--repeat 3]

* write: Writer.write_numpy(compress=3) of one f16 tensor (normal values, which
  compress ~1.1x like real weights) vs zstandard's one-shot compress of the same
  bytes (one thread: what the single-stream layout costs).
* read: read_numpy of the compressed tensor vs zstandard's one-shot decompress.
* slices: 20 slices of 8 rows through safe_open, each on a fresh handle (a user
  script), for a framed file and a single-stream file (what files from before
  1.3.0, and other writers, give), and the same with one shared handle.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import median  # noqa: E402

import ztensor  # noqa: E402
from ztensor.io import seekable  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cols = 4096
    rows = args.mb * (1 << 20) // (2 * cols)
    arr = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float16)
    raw = arr.tobytes()
    folder = tempfile.mkdtemp()
    framed, single = os.path.join(folder, "framed.zt"), os.path.join(folder, "single.zt")
    frame_bytes = seekable.FRAME_BYTES

    def write(path, frames):
        seekable.FRAME_BYTES = frame_bytes if frames else 1 << 62
        try:
            with ztensor.Writer(path) as w:
                w.write_numpy("w", arr, compress=3)
        finally:
            seekable.FRAME_BYTES = frame_bytes

    t_framed = median(lambda: write(framed, True), args.repeat)
    t_single = median(lambda: write(single, False), args.repeat)
    blob = zstandard.ZstdCompressor(level=3).compress(raw)
    t_zstd = median(lambda: zstandard.ZstdCompressor(level=3).compress(raw), args.repeat)
    size = arr.nbytes
    print(f"{args.mb} MiB f16, {os.cpu_count()} cores; sizes: framed "
          f"{os.path.getsize(framed) / size:.3f}, single {os.path.getsize(single) / size:.3f}, "
          f"zstd {len(blob) / size:.3f} of the raw bytes")
    print(f"write   framed {size / t_framed / 1e9:5.2f} GB/s | single {size / t_single / 1e9:5.2f}"
          f" | zstd one-shot {size / t_zstd / 1e9:5.2f} | framed/zstd {t_zstd / t_framed:4.2f}x")

    def read(path):
        with ztensor.Reader(path) as r:
            r.read_numpy("w")
    r_framed = median(lambda: read(framed), args.repeat)
    r_single = median(lambda: read(single), args.repeat)
    r_zstd = median(lambda: zstandard.ZstdDecompressor().decompress(blob), args.repeat)
    print(f"read    framed {size / r_framed / 1e9:5.2f} GB/s | single {size / r_single / 1e9:5.2f}"
          f" | zstd one-shot {size / r_zstd / 1e9:5.2f} | framed/zstd {r_zstd / r_framed:4.2f}x")

    starts = np.linspace(0, rows - 8, 20).astype(int)

    def slices(path, shared):
        if shared:
            with ztensor.safe_open(path, framework="np") as f:
                for s in starts:
                    f.get_slice("w")[s:s + 8]
            return
        for s in starts:
            with ztensor.safe_open(path, framework="np") as f:
                f.get_slice("w")[s:s + 8]
    for shared in (False, True):
        a = median(lambda: slices(framed, shared), args.repeat)
        b = median(lambda: slices(single, shared), args.repeat)
        print(f"20 slices of 8 rows, {'one handle ' if shared else 'fresh handles'}: framed "
              f"{a * 1e3:7.1f} ms | single stream {b * 1e3:7.1f} ms | {b / a:5.1f}x")
    for path in (framed, single):
        os.unlink(path)


if __name__ == "__main__":
    main()
