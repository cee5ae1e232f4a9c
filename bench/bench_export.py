"""Exports (``ztensor convert IN.zt OUT.safetensors|OUT.npz``) against the tools people
would use instead: ``safetensors.numpy.save_file`` and ``numpy.savez`` of the same
arrays, already in memory (so theirs is the lower bound: ours also reads the input).

    python bench/bench_export.py [--size-mb 512] [--repeat 5]

Each output is written twice per repetition: over no file (fresh) and over the file
the last repetition wrote (replacing, where ext4's rename rule can flush the whole new
file inside the rename: csrc/blobwrite.c).  The libraries alternate within each
repetition; times are medians; ratio = the other tool's time over ours.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import ztensor
from ztensor.foreign import export


def arrays(size_mb: int) -> dict:
    """An LLM-shaped set: two large float16 tables and layers of 1-8 MB weights."""
    rng = np.random.default_rng(0)
    out = {}
    big = size_mb * (1 << 20) // 4 // 2  # float16 elements of each large table
    out["embed.weight"] = rng.standard_normal(big, np.float32).astype(np.float16)
    out["lm_head.weight"] = rng.standard_normal(big, np.float32).astype(np.float16)
    layer = 0
    while sum(a.nbytes for a in out.values()) < size_mb << 20:
        for proj, n in (("q", 1 << 19), ("k", 1 << 19), ("mlp", 1 << 21)):
            out[f"layers.{layer}.{proj}.weight"] = rng.standard_normal(n, np.float32).astype(
                np.float16
            )
        out[f"layers.{layer}.norm.weight"] = np.ones(2048, np.float32)
        layer += 1
    return out


def timed(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    import safetensors.numpy as stn

    data = arrays(args.size_mb)
    total = sum(a.nbytes for a in data.values())
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        root = Path(tmp)
        source = root / "in.zt"
        with ztensor.Writer(str(source)) as w:
            for name, a in data.items():
                w.write_numpy(name, a)
        reader = ztensor.Reader(str(source))
        ours = {
            "safetensors": lambda p: export.write_safetensors(reader, p),
            "npz": lambda p: export.write_npz(reader, p),
        }
        theirs = {
            "safetensors": lambda p: stn.save_file(data, p),
            "npz": lambda p: np.savez(p, **data),
        }
        times: dict = {}
        for _ in range(args.repeat):
            for fmt in ours:
                for who, fn in (("ztensor", ours[fmt]), ("other", theirs[fmt])):
                    out = str(root / f"{who}.{fmt}")
                    if os.path.exists(out):
                        os.unlink(out)
                    os.sync()
                    times.setdefault((fmt, who, "fresh"), []).append(timed(lambda: fn(out)))
                    os.sync()
                    times.setdefault((fmt, who, "replacing"), []).append(timed(lambda: fn(out)))
        reader.close()
    print(f"{len(data)} tensors, {total / 1e6:.0f} MB, medians of {args.repeat}")
    print(f"{'format':12} {'case':10} {'ztensor':>10} {'other':>10} {'ratio':>7}")
    for fmt, other in (("safetensors", "safetensors"), ("npz", "np.savez")):
        for case in ("fresh", "replacing"):
            z = statistics.median(times[(fmt, "ztensor", case)])
            o = statistics.median(times[(fmt, "other", case)])
            print(f"{fmt:12} {case:10} {z * 1e3:8.0f}ms {o * 1e3:8.0f}ms {o / z:6.2f}x  ({other})")


if __name__ == "__main__":
    main()
