"""Runs inside a subprocess with a reference ztensor first on PYTHONPATH.

    python ref_driver.py write '{"path": ..., "objects": [...]}'
    python ref_driver.py read  '{"path": ..., "out": ...npz}'

Arrays travel as .npy files; objects are {"name", "kind", "arrays", options...}.
"""
import json
import os
import sys

import numpy as np

import ztensor

VERSION = os.environ["ZTENSOR_REF_VERSION"]
# the reference, not this checkout's package, must be the one imported
assert f"ztensor-{VERSION}" in ztensor.__file__, ztensor.__file__


def load(arrays):
    out = {}
    for role, path in arrays.items():
        arr = np.load(path)
        if path.endswith(".bf16.npy"):
            import ml_dtypes
            arr = arr.view(ml_dtypes.bfloat16)
        out[role] = arr
    return out


V2_STORAGE = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64",
              "int32": "i32", "int16": "i16", "int8": "i8", "uint64": "u64", "uint32": "u32",
              "uint16": "u16", "uint8": "u8", "bool": "u8", "bfloat16": "bf16",
              "complex64": "f32", "complex128": "f64"}


def write_v2(spec):
    """PyPI ztensor 2.x: Writer.add for dense objects, add_object for the others."""
    with ztensor.Writer(spec["path"], canonical=spec.get("canonical", False)) as w:
        if spec.get("attributes"):
            w.set_attributes(spec["attributes"])
        for o in spec["objects"]:
            arrays = load(o["arrays"])
            if o["kind"] == "dense":
                arr = np.ascontiguousarray(arrays["data"])
                logical = o.get("type") or {"bool": "bool", "complex64": "complex64",
                                             "complex128": "complex128"}.get(arr.dtype.name)
                w.add(o["name"], arr.tobytes(), list(arr.shape), V2_STORAGE[arr.dtype.name],
                      logical=logical,
                      encoding="zt.zstd-seekable/1" if o.get("compress") else None)
            else:
                parts = {role: {"data": np.ascontiguousarray(a).tobytes(),
                                "dtype": V2_STORAGE[a.dtype.name]} for role, a in arrays.items()}
                w.add_object(o["name"], o["shape"], parts, layout=f"zt.{o['kind']}/1",
                             attributes=o.get("attributes"))
    return {"ok": True}


def write(spec):
    objects = spec["objects"]
    if VERSION.startswith("2."):
        return write_v2(spec)
    if VERSION.startswith("1.2"):
        with ztensor.Writer(spec["path"]) as w:
            for o in objects:
                arrays = load(o["arrays"])
                if o["kind"] == "dense" and "type" not in o and "shape" not in o:
                    w.write_numpy(o["name"], arrays["data"], compress=o.get("compress", False),
                                  checksum=o.get("checksum") or "none")
                else:
                    t = ztensor.Tensor(arrays, shape=o.get("shape"), format=o["kind"],
                                       type=o.get("type"), attributes=o.get("attributes"))
                    w.write(o["name"], t, compress=o.get("compress", False),
                            checksum=o.get("checksum") or "none")
    else:
        with ztensor.Writer(spec["path"]) as w:
            for o in objects:
                arrays = load(o["arrays"])
                if o["kind"] == "dense" and VERSION.startswith("0.1"):
                    w.add_tensor(o["name"], arrays["data"])
                elif o["kind"] == "dense":
                    w.add_tensor(o["name"], arrays["data"], compress=o.get("compress", False))
                elif o["kind"] == "sparse_csr":
                    w.add_sparse_csr(o["name"], arrays["values"], arrays["indices"],
                                     arrays["indptr"], tuple(o["shape"]))
                elif o["kind"] == "sparse_coo":
                    w.add_sparse_coo(o["name"], arrays["values"], arrays["coords"],
                                     tuple(o["shape"]))
    return {"ok": True}


def read(spec):
    out, meta = {}, {}
    if VERSION.startswith("1.2"):
        r = ztensor.Reader(spec["path"])
        for name in r.keys():
            t = r.read(name)
            meta[name] = {"format": t.format, "shape": list(t.shape)}
            for role, arr in t.components.items():
                if arr.dtype.name == "bfloat16":
                    arr = arr.view(np.uint16)
                out[f"{name}/{role}"] = np.ascontiguousarray(arr)
    else:
        r = ztensor.Reader(spec["path"])
        names = r.tensor_names if VERSION.startswith("1.1") else r.get_tensor_names()
        for name in names:
            if VERSION.startswith("1.1") and r.metadata(name).layout != "dense":
                continue  # 1.1.1 reads sparse objects only through scipy
            arr = r.read_tensor(name)
            meta[name] = {"format": "dense", "shape": list(arr.shape)}
            out[f"{name}/data"] = np.array(arr)
    np.savez(spec["out"], **out)
    return {"objects": meta}


if __name__ == "__main__":
    command, payload = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"write": write, "read": read}[command](payload)))
