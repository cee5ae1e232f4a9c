"""Exports (``ztensor convert IN.zt OUT.safetensors|OUT.npz``) against the tools people
would use instead: ``safetensors.numpy.save_file`` and ``numpy.savez`` of the same
arrays, already in memory (so theirs is the lower bound: ours also reads the input).

    python bench/bench_export.py [--size-mb 512] [--repeat 5]

Each output is written twice per repetition: over no file (fresh) and over the file
the last repetition wrote (replacing, where ext4's rename rule can flush the whole new
file inside the rename: csrc/blobwrite.c).  The libraries alternate within each
repetition; times are medians; ratio = the other tool's time over ours.

The floor is what any writer pays for the same bytes in the same case, measured beside
the libraries: ``os.write`` of the arrays' bytes into a new file renamed over the old
one.  On a virtual machine whose memory the host hands out page by page, a run can
take 10x longer to fill the page cache than the next (session 20: 16 ms against 158 ms
per 64 MB write, with no library involved); the floor shows when a row is that.
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


def floor_write(data: dict, path: str) -> None:
    """The bytes alone: no header, no checks, one ``os.write`` per array, then a rename."""
    tmp = path + ".floor.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for a in data.values():
            os.write(fd, memoryview(a).cast("B"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


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
                contenders = (
                    ("ztensor", ours[fmt]),
                    ("other", theirs[fmt]),
                    ("floor", lambda p: floor_write(data, p)),
                )
                for who, fn in contenders:
                    out = str(root / f"{who}.{fmt}")
                    if os.path.exists(out):
                        os.unlink(out)
                    os.sync()
                    times.setdefault((fmt, who, "fresh"), []).append(timed(lambda: fn(out)))
                    os.sync()
                    times.setdefault((fmt, who, "replacing"), []).append(timed(lambda: fn(out)))
        reader.close()
    print(f"{len(data)} tensors, {total / 1e6:.0f} MB, medians of {args.repeat}")
    print(
        f"{'format':12} {'case':10} {'ztensor':>10} {'other':>10} {'floor':>10}"
        f" {'other/ours':>11} {'floor/ours':>11}"
    )
    for fmt, other in (("safetensors", "safetensors"), ("npz", "np.savez")):
        for case in ("fresh", "replacing"):
            z, o, f = (
                statistics.median(times[(fmt, who, case)]) for who in ("ztensor", "other", "floor")
            )
            print(
                f"{fmt:12} {case:10} {z * 1e3:8.0f}ms {o * 1e3:8.0f}ms {f * 1e3:8.0f}ms"
                f" {o / z:10.2f}x {f / z:10.2f}x  ({other})"
            )


if __name__ == "__main__":
    main()
