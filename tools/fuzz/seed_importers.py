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

# a torch.save zip checkpoint, built by hand (no torch needed): the pickle of
# {"w": tensor} with its storage member, as torch 2.x writes it
import zipfile  # noqa: E402

# protocol 2: {"w": _rebuild_tensor_v2(storage('FloatStorage', '0', 'cpu', 6), 0, (2, 3),
# (3, 1), False, OrderedDict())}
pkl = (b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02"
       b"((X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05"
       b"X\x03\x00\x00\x00cpuq\x06K\x06tq\x07QK\x00K\x02K\x03\x86q\x08K\x03K\x01\x86q\t\x89"
       b"ccollections\nOrderedDict\nq\n)Rq\x0btq\x0cRq\rs.")
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    z.writestr("ckpt/data.pkl", pkl)
    z.writestr("ckpt/byteorder", "little")
    z.writestr("ckpt/data/0", arr.tobytes())
    z.writestr("ckpt/version", "3")
(out / "seed-torch").write_bytes(b"\x00" + buf.getvalue())
