"""Seed corpus for fuzz_foreign_structured: per kind, the real writer's files in raw
mode (first byte: kind index | 0x80) and drawn structure in generated mode (first
byte: kind index, then choice bytes)."""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests"))
import hostile_strategies as hs  # noqa: E402


class Quiet(hs.Draw):
    """Honest draws: the real writer's file, no mutation (each mutation count draws 0)."""

    def __init__(self, seed):
        self.r = random.Random(seed)

    def int(self, lo, hi):
        return lo if hi - lo <= 3 and lo == 0 else self.r.randint(lo, hi)

    def bytes(self, max_len):
        return b""


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
ctx = hs.Ctx()
rng = random.Random(0)
for k, kind in enumerate(hs.FOREIGN):
    for seed in range(3):
        try:
            case = hs.GENERATORS[kind](Quiet(seed), ctx)
        except Exception:   # an optional writer missing: no raw seed for it
            continue
        if kind != "hdf5":
            with open(os.path.join(out, f"raw-{kind}-{seed}"), "wb") as f:
                f.write(bytes([k | 0x80]) + case.files[case.main])
        with open(os.path.join(out, f"gen-{kind}-{seed}"), "wb") as f:
            f.write(bytes([k]) + bytes(rng.randrange(256) for _ in range(512)))
