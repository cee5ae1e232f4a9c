"""Kernel throughput, single thread and all threads, with in-run baselines.

    python bench/bench_kernels.py [--repeat 5]

* FP8 e4m3fn -> f32, 64 Mi values: ztensor vs ml_dtypes ``astype``, a numpy
  256-entry table lookup, and memcpy of the output size.
* GPTQ int4 4096x4096 group 128 -> f32 and -> f16: ztensor.dequantize vs a
  vectorized numpy reference (the AutoGPTQ formula) and memcpy of the output size.
* Byte swap of 256 MiB (4-byte elements) vs memcpy of the same size.
* Copy of 256 MiB (``kernels.copy``: glibc's memcpy, or its own streaming loop under
  other C libraries; the portable build's memcpy) vs memcpy (numpy ``copyto``)
  and torch's ``copy_`` (what ``load_model`` used before), when torch is installed.

GB/s counts output bytes.  Output buffers are pre-touched for every contender
(the kernels write into a preallocated array), so page faults do not decide.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import ztensor
from ztensor import kernels
from ztensor._native import fallback as _fallback


def median(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def row(label, nbytes, results, baselines):
    ours = results["ztensor"]
    cells = [f"ztensor {nbytes / ours / 1e9:6.2f} GB/s"]
    for name, t in {**{k: v for k, v in results.items() if k != "ztensor"}, **baselines}.items():
        cells.append(f"{name} {nbytes / t / 1e9:6.2f} GB/s (ours {t / ours:5.2f}x)")
    print(f"  {label:28s} " + " | ".join(cells))


def bench_fp8(repeat):
    import ml_dtypes

    n = 64 << 20
    codes = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    out = np.zeros(n, np.float32)
    src_touched = np.ones(n, np.float32)
    table = _fallback.fp8_table("f8_e4m3fn")
    res = {"ztensor": median(lambda: kernels.fp8_decode(codes, out.view(np.uint8), 0, 0), repeat),
           "ml_dtypes": median(lambda: codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32),
                               max(1, repeat // 2)),
           "numpy table": median(lambda: np.take(table, codes, out=out), repeat)}
    base = {"memcpy": median(lambda: np.copyto(out, src_touched), repeat)}
    row("fp8 e4m3fn -> f32 (64 Mi)", out.nbytes, res, base)


def numpy_gptq(qweight, qzeros, scales, bits=4, out_dtype=np.float32):
    """The AutoGPTQ formula, vectorized numpy: the baseline to beat."""
    wf = np.arange(0, 32, bits, dtype=np.uint32)
    zeros = ((qzeros.view(np.uint32)[:, :, None] >> wf) & 15) + 1
    zeros = (zeros & 15).reshape(scales.shape).astype(np.float32)
    w = (qweight.view(np.uint32)[:, None, :] >> wf[None, :, None]) & 15
    w = w.reshape(-1, w.shape[2])
    g = np.arange(w.shape[0]) // 128
    out = (w.astype(np.float32) - zeros[g]) * scales.astype(np.float32)[g]
    return out.T.astype(out_dtype)


def bench_gptq(repeat, threads):
    rng = np.random.default_rng(0)
    N = K = 4096
    q = {"qweight": rng.integers(0, 2**32, (K // 8, N), dtype=np.uint64).astype(np.uint32)
         .view(np.int32),
         "qzeros": rng.integers(0, 2**32, (K // 128, N // 8), dtype=np.uint64).astype(np.uint32)
         .view(np.int32),
         "scales": (rng.random((K // 128, N)) * 0.01).astype(np.float16)}
    for dtype in (np.float32, np.float16):
        size = N * K * np.dtype(dtype).itemsize
        touched = np.ones(N * K, dtype)
        dst = np.zeros(N * K, dtype)
        base = {"memcpy": median(lambda: np.copyto(dst, touched), repeat)}
        out = np.zeros((N, K), dtype)
        for t in threads:
            res = {"ztensor": median(lambda: ztensor.dequantize(
                q, bits=4, group_size=128, checkpoint_format="gptq", dtype=dtype, threads=t,
                out=out), repeat)}
            if t == 1:
                # the output's fresh pages paid too, as a caller without out= pays them
                fresh = median(lambda: ztensor.dequantize(
                    q, bits=4, group_size=128, checkpoint_format="gptq", dtype=dtype,
                    threads=t), repeat)
                res["numpy"] = median(lambda: numpy_gptq(q["qweight"], q["qzeros"], q["scales"],
                                                         out_dtype=dtype), max(1, repeat // 2))
                res["portable loop"] = portable(lambda: median(lambda: ztensor.dequantize(
                    q, bits=4, group_size=128, checkpoint_format="gptq", dtype=dtype,
                    threads=t, out=out), repeat))
            row(f"gptq int4 -> {np.dtype(dtype).name} ({t} thr)", size, res, base)
            if t == 1:
                row("  same, into a new array", size, {"ztensor": fresh, "numpy": res["numpy"]},
                    {})


def portable(measure):
    """``measure()`` with the hand-written AVX2 paths off (kernels.set_simd)."""
    old = kernels.set_simd(False)
    try:
        return measure()
    finally:
        kernels.set_simd(old)


def bench_bswap(repeat):
    n = 256 << 20
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, np.uint8)
    res = {"ztensor": median(lambda: kernels.bswap(src, dst, 4), repeat),
           "portable loop": portable(lambda: median(lambda: kernels.bswap(src, dst, 4), repeat)),
           "numpy byteswap": median(lambda: np.copyto(dst.view("<u4"), src.view("<u4").byteswap()),
                                    repeat)}
    base = {"memcpy": median(lambda: np.copyto(dst, src), repeat)}
    row("byte swap u32 (256 MiB)", n, res, base)


def bench_copy(repeat):
    n = 256 << 20
    src = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, np.uint8)
    res = {"ztensor": median(lambda: kernels.copy(src, dst), repeat),
           "portable loop": portable(lambda: median(lambda: kernels.copy(src, dst), repeat))}
    base = {"memcpy": median(lambda: np.copyto(dst, src), repeat)}
    try:
        import torch
    except ImportError:
        pass
    else:
        s, d = torch.from_numpy(src), torch.from_numpy(dst)
        base["torch copy_"] = median(lambda: d.copy_(s), repeat)
    row("copy (256 MiB)", n, res, base)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    threads = sorted({1, os.cpu_count() or 1})
    print(f"ztensor {ztensor.__version__} backend={ztensor.backend}; medians of {args.repeat}; "
          f"threads {threads}; AVX2 paths {'on' if kernels.avx2_active() else 'off'}")
    bench_fp8(args.repeat)
    bench_gptq(args.repeat, threads)
    bench_bswap(args.repeat)
    bench_copy(args.repeat)


if __name__ == "__main__":
    main()
