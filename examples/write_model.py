"""Write a small model file: the README's first command runs this.

    python examples/write_model.py model.zt && ztensor ls model.zt
"""
import sys

import numpy as np

import ztensor


def main(path="model.zt"):
    rng = np.random.default_rng(0)
    with ztensor.Writer(path, attributes={"framework": "numpy", "model": "tiny-mlp"}) as w:
        w.write_numpy("embed.weight", rng.standard_normal((1000, 64), np.float32))
        for i in range(2):
            w.write_numpy(f"layers.{i}.weight", rng.standard_normal((64, 64)).astype(np.float16),
                          checksum="crc32c")
            w.write_numpy(f"layers.{i}.bias", np.zeros(64, np.float32), compress=True)
        w.write_numpy("head.step", np.array(1200, np.int64), attributes={"note": "scalar"})
    with ztensor.Reader(path, verify=True) as r:
        print(f"wrote {path}: {len(r)} objects, {r.verify()} digests verified")


if __name__ == "__main__":
    main(*sys.argv[1:])
