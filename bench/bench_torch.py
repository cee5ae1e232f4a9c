"""The torch path against safetensors: state dicts and models, one file and shards.

    python bench/bench_torch.py [--size-mb 320] [--repeat 7] [--rows 1,2,3,4,5]

An LLM-shaped state dict (embeddings, attention and MLP weights of several layers,
norms, an untied lm_head; float16 with float32 norms) is written by safetensors as one
file and as four Hugging Face shards with ``model.safetensors.index.json``; the
``.zt`` files are made from those by ``ztensor convert``, as a user would.  Rows:

  1  ``load_file`` of the single file
  2  ``load_model`` of the single file
  3  the whole state dict of the 4-shard checkpoint (safetensors: a loop of
     ``load_file``; ztensor: ``ztensor.torch.load_file(DIR)``)
  4  ``load_model`` from the checkpoint directory (safetensors: the loop plus
     ``load_state_dict``)
  5  the ``.safetensors`` file through ``ztensor.torch.load_file``

Every result is touched inside the timer (one byte per 4 KiB page of every tensor),
so a lazy result pays for its pages.  The two libraries alternate within each
repetition; figures are medians, and the ratio is safetensors' time over ours
(above 1: we are faster).  Files are in the page cache (read once before timing).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import safetensors.torch as st

import ztensor.torch as zt

PAGE = 4096


def state_dict(size_mb: int) -> dict:
    """~size_mb of LLM-shaped tensors: 12 layers, an untied head."""
    g = torch.Generator().manual_seed(0)
    d, ff, layers = 512, 1376, 12
    per_layer = (4 * d * d + 3 * d * ff) * 2 + 2 * d * 4
    vocab = max(1000, (size_mb * (1 << 20) - layers * per_layer) // (2 * d * 2))
    out = {"model.embed_tokens.weight": torch.randn(vocab, d, generator=g).half()}
    for i in range(layers):
        p = f"model.layers.{i}."
        for proj in ("q", "k", "v", "o"):
            out[p + f"self_attn.{proj}_proj.weight"] = torch.randn(d, d, generator=g).half()
        out[p + "mlp.gate_proj.weight"] = torch.randn(ff, d, generator=g).half()
        out[p + "mlp.up_proj.weight"] = torch.randn(ff, d, generator=g).half()
        out[p + "mlp.down_proj.weight"] = torch.randn(d, ff, generator=g).half()
        out[p + "input_layernorm.weight"] = torch.ones(d)
        out[p + "post_attention_layernorm.weight"] = torch.ones(d)
    out["model.norm.weight"] = torch.ones(d)
    out["lm_head.weight"] = torch.randn(vocab, d, generator=g).half()
    return out


class Model(torch.nn.Module):
    """A module tree whose state dict is exactly ``sd``'s names and shapes (a
    submodule per dotted prefix, a parameter at each leaf), loading through
    nn.Module's own ``load_state_dict``, as a transformers model does."""

    def __init__(self, sd: dict) -> None:
        super().__init__()
        for name, t in sd.items():
            *path, leaf = name.split(".")
            module: torch.nn.Module = self
            for part in path:
                if not hasattr(module, part):
                    module.add_module(part, torch.nn.Module())
                module = getattr(module, part)
            module.register_parameter(
                leaf, torch.nn.Parameter(torch.zeros_like(t), requires_grad=False))


def touch(tensors) -> int:
    """One byte per page of every tensor (read, so lazily mapped pages are paid)."""
    total = 0
    for t in tensors:
        flat = t.detach().reshape(-1).view(torch.uint8)
        total += int(flat[::PAGE].sum()) if flat.numel() else 0
    return total


def write_files(sd: dict, root: Path) -> dict:
    single = root / "model.safetensors"
    st.save_file(sd, single)
    shards = root / "st-shards"
    shards.mkdir()
    names = list(sd)
    parts = np.array_split(np.arange(len(names)), 4)
    weight_map = {}
    for i, idx in enumerate(parts):
        file = f"model-{i + 1:05d}-of-00004.safetensors"
        st.save_file({names[j]: sd[names[j]] for j in idx}, shards / file)
        weight_map.update({names[j]: file for j in idx})
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(t.nbytes for t in sd.values())},
         "weight_map": weight_map}))
    cli = [sys.executable, "-m", "ztensor", "convert"]
    subprocess.run(cli + [str(single), str(root / "model.zt")], check=True)
    subprocess.run(cli + [str(shards), str(root / "zt-shards")], check=True)
    for path in root.rglob("*"):  # into the page cache
        if path.is_file():
            path.read_bytes()
    return {"st": single, "zt": root / "model.zt", "st_dir": shards,
            "zt_dir": root / "zt-shards"}


def st_shards(directory: Path) -> dict:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(st.load_file(directory / file))
    return out


def rows(files: dict, sd: dict):
    model = Model(sd)

    def st_model(path):
        def run():
            model.load_state_dict(st.load_file(path) if path.is_file() else st_shards(path))
            return model.state_dict().values()
        return run

    def zt_model(path):
        def run():
            zt.load_model(model, path, strict=False)
            return model.state_dict().values()
        return run

    def zt_dir(path):
        def run():
            try:
                return zt.load_file(path).values()
            except (IsADirectoryError, ValueError, OSError):  # before DIR support landed
                out = {}
                for shard in sorted(path.glob("*.zt")):
                    out.update(zt.load_file(shard))
                return out.values()
        return run

    yield 1, "load_file, single file", lambda: st.load_file(files["st"]).values(), \
        lambda: zt.load_file(files["zt"]).values()
    yield 2, "load_model, single file", st_model(files["st"]), zt_model(files["zt"])
    yield 3, "state dict of 4 shards", lambda: st_shards(files["st_dir"]).values(), \
        zt_dir(files["zt_dir"])
    yield 4, "load_model, 4 shards", st_model(files["st_dir"]), zt_model(files["zt_dir"])
    yield 5, ".safetensors via ztensor", lambda: st.load_file(files["st"]).values(), \
        lambda: zt.load_file(files["st"]).values()


def timed(fn) -> float:
    """Seconds to load and touch; the result is freed after the timer stops (unmapping
    is the caller's whenever it drops the tensors, and not part of loading)."""
    gc.collect()
    start = time.perf_counter()
    result = fn()
    touch(result)
    elapsed = time.perf_counter() - start
    del result
    gc.collect()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=320)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--rows", default="1,2,3,4,5")
    args = ap.parse_args()
    wanted = {int(r) for r in args.rows.split(",") if r}
    sd = state_dict(args.size_mb)
    nbytes = sum(t.nbytes for t in sd.values())
    print(f"torch {torch.__version__}; {len(sd)} tensors, {nbytes / 1e6:.0f} MB; "
          f"medians of {args.repeat}, touch inside the timer")
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        files = write_files(sd, Path(tmp))
        print(f"{'row':<32} {'safetensors':>12} {'ztensor':>12} {'ratio':>7}")
        for number, label, ours_base, ours in rows(files, sd):
            if number not in wanted:
                continue
            base, mine = [], []
            timed(ours_base), timed(ours)  # warm-up: first calls import and map
            for _ in range(args.repeat):
                base.append(timed(ours_base))
                mine.append(timed(ours))
            b, m = statistics.median(base), statistics.median(mine)
            print(f"{number} {label:<30} {b * 1e3:>9.1f} ms {m * 1e3:>9.1f} ms "
                  f"{b / m:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
