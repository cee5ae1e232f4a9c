"""Seed corpora for the structure-aware targets:
``seed_structured.py OUT`` for fuzz_foreign_structured: per kind, the real writer's
files in raw mode (first byte: kind index | 0x80) and drawn structure in generated
mode (first byte: kind index, then choice bytes);
``seed_structured.py OUT sharded`` / ``OUT remote``: choice bytes after the byte that
picks the door (sharded) or the mode (remote).  Choice bytes matter: libFuzzer starts
from short inputs, and a draw from an empty input takes the lowest choice each time
(an honest file), so without seeds the first minutes explore next to nothing."""
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
target = sys.argv[2] if len(sys.argv) > 2 else "foreign_structured"
os.makedirs(out, exist_ok=True)
rng = random.Random(0)
if target in ("sharded", "remote"):
    modes = 2 if target == "sharded" else 3
    for seed in range(12):
        with open(os.path.join(out, f"gen-{target}-{seed}"), "wb") as f:
            f.write(bytes([seed % modes]) + bytes(rng.randrange(256) for _ in range(512)))
    sys.exit(0)
ctx = hs.Ctx()
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
