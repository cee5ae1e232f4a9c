"""Seed corpus for fuzz_importers: one small valid file of each kind, prefixed with
the byte that selects its extension in fuzz_importers.py."""
import io
import json
import struct
import sys

from pathlib import Path

import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
arr = np.arange(6, dtype="<f4").reshape(2, 3)
header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                     "__metadata__": {"k": "v"}}).encode()
(out / "seed-safetensors").write_bytes(b"\x00" + struct.pack("<Q", len(header)) + header
                                       + arr.tobytes())
buf = io.BytesIO()
np.save(buf, arr)
(out / "seed-npy").write_bytes(b"\x01" + buf.getvalue())
buf = io.BytesIO()
np.savez(buf, a=arr, b=np.arange(3))
(out / "seed-npz").write_bytes(b"\x02" + buf.getvalue())
kv = struct.pack("<Q", 12) + b"general.name" + struct.pack("<I", 8) + struct.pack("<Q", 4) + b"tiny"
info = struct.pack("<Q", 1) + b"w" + struct.pack("<I", 2) + struct.pack("<QQ", 3, 2) \
    + struct.pack("<IQ", 0, 0)
head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + kv + info
head += bytes(-len(head) % 32)
(out / "seed-gguf").write_bytes(b"\x03" + head + arr.tobytes())
