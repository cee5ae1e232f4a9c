"""Remote and sharded reads, with baselines measured in the same run.

    python bench/bench_remote.py [--repeat 3] [--size-mb 256]

* Remote: one tensor of a file served by nginx on loopback (the test suite's
  configuration; needs nginx), read through ``Reader(url)``: bytes served (from nginx's
  access log) and time, against downloading the whole file with fsspec.  Also many
  tensors at once (``read_numpy(list, copy=True)``: coalesced, concurrent ranges).
* Sharded: a state dict of --size-mb in 4 shards, loaded whole: ztensor's
  ``open_sharded(dir).read_all()`` against safetensors' ``load_file`` on each of its own
  shards.  Files are in the page cache (written, then read once, before timing).
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


from bench_kernels import median  # noqa: E402 - this folder is first on sys.path


def batch_vs_serial(url, names, repeat):
    """Times of read_numpy(names, copy=True) in one batch, and name by name."""
    import ztensor

    def batch():
        with ztensor.Reader(url) as r:
            r.read_numpy(names, copy=True)

    def serial():
        with ztensor.Reader(url) as r:
            for name in names:
                r.read_numpy(name, copy=True)
    return median(batch, repeat), median(serial, repeat)


def nginx(folder):
    sys.path.insert(0, str(HERE.parent / "tests"))
    from test_remote import CONF, NGINX  # one configuration for tests and bench

    if NGINX is None:
        return None, None
    (folder / "www").mkdir()
    (folder / "tmp").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = folder / "nginx.conf"
    conf.write_text(CONF.format(dir=folder, port=port,
                                user="user root;" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def served(folder):
    time.sleep(0.2)  # nginx writes its log after the response
    log = folder / "access.log"
    return sum(int(line.split()[3]) for line in log.read_text().splitlines()) \
        if log.exists() else 0


def bench_remote(folder, size_mb, repeat):
    import fsspec

    import ztensor

    proc, url = nginx(folder)
    if proc is None:
        print("  (nginx not installed: remote rows skipped)")
        return
    try:
        n = max(8, size_mb // 4)
        with ztensor.Writer(folder / "www" / "m.zt") as w:
            for i in range(n):
                w.write_numpy(f"t{i}", np.full(1 << 20, i, np.float32))  # 4 MiB each
        size = os.path.getsize(folder / "www" / "m.zt")
        full = median(lambda: fsspec.open(f"{url}/m.zt", "rb").open().read(), repeat)

        def one():
            with ztensor.Reader(f"{url}/m.zt") as r:
                r.read_numpy(f"t{n // 2}", copy=True)
        before = served(folder)
        one()
        one_bytes = served(folder) - before
        t_one = median(one, repeat)
        names = [f"t{i}" for i in range(n // 4, n // 2)]
        t_many, t_serial = batch_vs_serial(f"{url}/m.zt", names, repeat)
        print(f"  file {size / 2**20:.0f} MiB over HTTP (nginx, loopback): full download "
              f"{full * 1e3:.1f} ms")
        print(f"  one 4 MiB tensor: {one_bytes / 2**20:.3f} MiB served "
              f"({one_bytes / size:.2%} of the file), {t_one * 1e3:.1f} ms "
              f"-> {full / t_one:.1f}x faster than the download")
        print(f"  {len(names)} tensors ({len(names) * 4} MiB): one batch {t_many * 1e3:.1f} ms, "
              f"one by one {t_serial * 1e3:.1f} ms -> {t_serial / t_many:.2f}x")
        with ztensor.Writer(folder / "www" / "small.zt") as w:
            for i in range(400):
                w.write_numpy(f"s{i}", np.full(10_000, i, np.float32))  # 40 KB each
        small = [f"s{i}" for i in range(100, 300)]
        t_batch, t_each = batch_vs_serial(f"{url}/small.zt", small, repeat)
        print(f"  {len(small)} tensors of 40 KB: one batch {t_batch * 1e3:.1f} ms, one by one "
              f"{t_each * 1e3:.1f} ms -> {t_each / t_batch:.2f}x")
    finally:
        proc.terminate()
        proc.wait()


def bench_sharded(folder, size_mb, repeat):
    from safetensors.numpy import load_file, save_file

    import ztensor

    rng = np.random.default_rng(0)
    per = size_mb * (1 << 20) // 16 // 4
    tensors = {f"layers.{i}.w": rng.standard_normal(per, np.float32) for i in range(16)}
    ztensor.save_sharded(tensors, folder / "zt", max_shard_size=size_mb * (1 << 20) // 4)
    os.makedirs(folder / "st")
    names = list(tensors)
    for s in range(4):
        save_file({n: tensors[n] for n in names[s * 4:(s + 1) * 4]},
                  str(folder / "st" / f"model-{s + 1:05d}-of-00004.safetensors"))
    del tensors

    def ours():
        with ztensor.open_sharded(folder / "zt") as ckpt:
            return ckpt.read_all()

    def theirs():
        out = {}
        for f in sorted(os.listdir(folder / "st")):
            out.update(load_file(str(folder / "st" / f)))
        return out
    ours(), theirs()  # page cache
    t_ours, t_theirs = median(ours, repeat), median(theirs, repeat)
    total = size_mb * 2**20
    print(f"  sharded load, {size_mb} MiB in 4 shards: ztensor {total / t_ours / 1e9:.2f} GB/s "
          f"| safetensors {total / t_theirs / 1e9:.2f} GB/s -> ours {t_theirs / t_ours:.2f}x")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        print("== remote")
        os.makedirs(Path(tmp) / "remote")
        bench_remote(Path(tmp) / "remote", args.size_mb, args.repeat)
        print("== sharded")
        os.makedirs(Path(tmp) / "sharded")
        bench_sharded(Path(tmp) / "sharded", args.size_mb * 4, args.repeat)
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
