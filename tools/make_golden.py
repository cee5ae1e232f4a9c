"""Write tests/data/canonical/golden.zt: the bytes ``ztensor.numpy.save_file`` must
give for ``golden_tensors()`` and ``GOLDEN_METADATA`` of tests/test_canonical_order.py
on every host (test_golden_bytes compares them, the s390x job included).

    python tools/make_golden.py          # rewrite the file
    python tools/make_golden.py --check  # exit 1 if what it would write differs

Run it only when the format's layout changes on purpose: a difference from the
committed file is otherwise a bug (the same tensors must give the same bytes).
"""
import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "tests" / "data" / "canonical" / "golden.zt"


def _definitions():
    # the test holds the definition, so the file and its check cannot drift apart
    spec = importlib.util.spec_from_file_location("_golden_defs",
                                                  ROOT / "tests" / "test_canonical_order.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.golden_tensors(), module.GOLDEN_METADATA


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # this checkout's ztensor, installed or not
    import ztensor.numpy as znp

    tensors, metadata = _definitions()
    data = znp.save(tensors, metadata=metadata)  # raw, no zstd: its bytes vary by version
    if args.check:
        same = TARGET.exists() and TARGET.read_bytes() == data
        print(f"{TARGET}: {'matches' if same else 'DIFFERS'} ({len(data)} bytes)")
        return 0 if same else 1
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_bytes(data)
    print(f"wrote {TARGET} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
