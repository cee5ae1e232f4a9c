"""Hostile files built from their structure (issue 21): each kind of file ztensor reads
is first written by its real writer (torch.save, safetensors, numpy, gguf's GGUFWriter,
h5py, onnx.helper, ztensor.Writer), then structured fields are mutated: pickle opcodes,
zip headers, JSON header fields, npy header dicts, GGUF counts/types/offsets, HDF5
storage that points elsewhere, ONNX external data, a sharded index's shard names, an
HTTP server's answers.  Byte-level fuzzing rarely gets past a zip, pickle or HDF5
parser; these inputs are valid up to the one field that lies.

One generator per kind, written against a small :class:`Draw` interface, so the same
code serves two drivers:

* hypothesis (``tests/hostile/test_hostile_properties.py``): :func:`cases` is a strategy;
* atheris (``tools/fuzz/fuzz_foreign_structured.py``, ``fuzz_sharded.py``,
  ``fuzz_remote.py``): :class:`ProviderDraw` over a ``FuzzedDataProvider``.

Containment: a :class:`Ctx` puts "secret" files (``secret.bin``, ``secret.zt``,
``secret.h5``) in a directory *above* the one the case is written to, and the
generators aim every outward reference they can make (HDF5 external storage, virtual
datasets and external links, ONNX external data, symlinks, sharded shard names) at
them.  Their bytes are :data:`MARKER` repeated; :func:`leaked` finds any 8 of them in
an array.
"""
from __future__ import annotations

import io
import json
import os
import pickletools
import shutil
import struct
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

MARKER = b"ZT-SECRET-BYTES!"          # 16 distinct bytes; secrets repeat it
SECRET = MARKER * 256
_WINDOWS = {(MARKER * 2)[i:i + 8] for i in range(16)}


def leaked(arr: Any) -> bool:
    """True when ``arr``'s bytes hold 8 consecutive bytes of a secret file."""
    raw = np.ascontiguousarray(np.asarray(arr)).view(np.uint8).tobytes() \
        if np.asarray(arr).dtype.kind != "O" else b""
    return _holds_secret(raw)


def _holds_secret(raw: bytes) -> bool:
    return len(raw) >= 8 and any(w in raw for w in _WINDOWS)


# ----------------------------------------------------------------- drawing
class Draw:
    """Where a generator's choices come from.  Every method is total: ``int(lo, hi)``
    with ``hi <= lo`` is ``lo``, so a generator never fails on its own draws (the
    harness must never be what fails; ``test_generators_always_produce_an_input``)."""

    def int(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def bool(self) -> bool:
        return self.int(0, 1) == 1

    def pick(self, seq: Sequence[Any]) -> Any:
        return seq[self.int(0, len(seq) - 1)]

    def bytes(self, max_len: int) -> bytes:
        raise NotImplementedError

    def rare(self, one_in: int = 4) -> bool:
        """True about once in ``one_in`` draws (mutations stay the exception)."""
        return self.int(0, one_in - 1) == 0


class HypothesisDraw(Draw):
    def __init__(self, draw: Callable[[Any], Any]) -> None:
        from hypothesis import strategies as st
        self._draw, self._st = draw, st

    def int(self, lo, hi):
        # total like ProviderDraw: an empty range is its one bound, never an error
        return self._draw(self._st.integers(lo, hi)) if hi > lo else lo

    def bytes(self, max_len):
        return self._draw(self._st.binary(max_size=max_len))


class ProviderDraw(Draw):
    """Choices from an ``atheris.FuzzedDataProvider`` (0 once it runs dry)."""

    def __init__(self, fdp: Any) -> None:
        self._fdp = fdp

    def int(self, lo, hi):
        return self._fdp.ConsumeIntInRange(lo, hi) if hi > lo else lo

    def bytes(self, max_len):
        return self._fdp.ConsumeBytes(self._fdp.ConsumeIntInRange(0, max_len))


class CornerDraw(Draw):
    """One path of :func:`every_corner`: each ``pick`` takes every item in turn, each
    other ``int`` the corners of its range (both ends, one in from each, the
    middle), ``bytes`` nothing."""

    def __init__(self, path: List[int]) -> None:
        self.path, self.widths = path, []

    def _choose(self, options: Sequence[Any]) -> Any:
        at = len(self.widths)
        self.widths.append(len(options))
        return options[self.path[at] if at < len(self.path) else 0]

    def int(self, lo, hi):
        if hi <= lo:
            return lo
        return self._choose(sorted({lo, lo + 1, (lo + hi) // 2, hi - 1, hi}))

    def pick(self, seq):
        return self._choose(list(seq))

    def bytes(self, max_len):
        return b""


def every_corner(make: Callable[[Draw], Any], most: int = 100_000):
    """``make(draw)`` along every path of corner choices (:class:`CornerDraw`), in
    order, at most ``most`` paths: yields each path (the index of every choice
    taken) and what ``make`` returned (or raised)."""
    path: List[int] = []
    for _ in range(most):
        d = CornerDraw(path)
        try:
            out: Any = make(d)
        except Exception as exc:    # handed to the caller, who says what is wrong
            out = exc
        taken = (path + [0] * len(d.widths))[:len(d.widths)]
        yield list(taken), out
        # the next path: the last choice that has an option left takes it
        while taken and taken[-1] + 1 >= d.widths[len(taken) - 1]:
            taken.pop()
        if not taken:
            return
        taken[-1] += 1
        path = taken


# ----------------------------------------------------------------- the case
class Ctx:
    """A directory with the secrets in it and ``case/`` below it for the inputs."""

    def __init__(self, base: Optional[str] = None) -> None:
        self.base = Path(base or tempfile.mkdtemp(prefix="ztensor-hostile-"))
        self.case_dir = self.base / "case"
        self.scratch = self.base / "scratch"
        self.scratch.mkdir(exist_ok=True)
        self.secret_bin = self.base / "secret.bin"
        self.secret_bin.write_bytes(SECRET)
        self.secret_zt = self.base / "secret.zt"
        self.secret_h5 = self.base / "secret.h5"
        self.secret_st = self.base / "secret.safetensors"
        import ztensor
        with ztensor.Writer(self.secret_zt) as w:
            w.write_numpy("secret", np.frombuffer(SECRET[:1024], np.uint8).copy())
        from safetensors.numpy import save_file
        save_file({"secret": np.frombuffer(SECRET[:1024], np.uint8).copy()},
                  str(self.secret_st))
        try:
            import h5py
            with h5py.File(self.secret_h5, "w") as f:
                f["data"] = np.frombuffer(SECRET[:1024], np.uint8)
                f["floats"] = np.frombuffer(SECRET[:1024], "<f4")
        except ImportError:
            pass

    def fresh_case_dir(self) -> Path:
        shutil.rmtree(self.case_dir, ignore_errors=True)
        self.case_dir.mkdir()
        return self.case_dir

    def outward(self, secret: Path) -> List[str]:
        """Every way a file inside ``case/`` can name ``secret`` above it."""
        rel = "../" + secret.name
        return [str(secret), rel, "./" + rel, "sub/../" + rel, "..\\" + secret.name,
                "..%2f" + secret.name, "%2e%2e%2f" + secret.name, "%2e%2e/" + secret.name,
                "\uff0e\uff0e/" + secret.name, "\u2024\u2024/" + secret.name,
                "../" * 12 + str(secret).lstrip("/"), "file://" + str(secret)]


@dataclass
class Case:
    """Files to write into a case directory, and the one to open."""

    kind: str
    main: str
    files: Dict[str, bytes] = field(default_factory=dict)
    links: Dict[str, str] = field(default_factory=dict)   # name -> symlink target
    notes: List[str] = field(default_factory=list)         # what was done (for failures)
    # why every correct reader must refuse this input (a name given twice: nothing is
    # dropped or silently overwritten, ztensor/foreign/names.py), or "" when it may open
    must_refuse: str = ""

    def write(self, directory: Path) -> Path:
        for name, data in self.files.items():
            path = directory / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        for name, target in self.links.items():
            path = directory / name
            if not path.exists():
                os.symlink(target, path)
        return directory / self.main

    def __repr__(self) -> str:
        return (f"Case({self.kind}, main={self.main!r}, notes={self.notes!r}, "
                f"sizes={ {k: len(v) for k, v in self.files.items()} }, links={self.links!r})")


def values(d: Draw, dtype: Any, shape: Tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` whose bytes come from the draw (no secret in them)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    seed = d.int(0, 255)
    raw = ((np.arange(n, dtype=np.int64) * 37 + seed) % 251).astype(np.uint8)
    if dtype.kind == "b":
        raw &= 1
    arr = raw.view(dtype).reshape(shape)
    if dtype.kind in "fc":
        arr = np.nan_to_num(arr, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.array(arr, dtype=dtype)   # an ndarray even of rank 0


def shape(d: Draw, max_rank: int = 3, max_dim: int = 4) -> Tuple[int, ...]:
    return tuple(d.int(0, max_dim) for _ in range(d.int(0, max_rank)))


def name(d: Draw) -> str:
    return d.pick(["w", "b", "layer.0.weight", "a.b", "a", "x.y.z", "emb", "t0", "t1",
                   "\u00e9", "a/b", ".", "", "..", "0", "__metadata__", "w\x00x",
                   "\x1b[31mred", "data"])


# ----------------------------------------------------------------- zip
def zip_bytes(members: List[Tuple[str, bytes, int]]) -> bytes:
    """A zip of (name, data, compress_type) members, duplicates kept."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": that is the point
        with zipfile.ZipFile(buf, "w") as z:
            for member, data, method in members:
                info = zipfile.ZipInfo(member, date_time=(2024, 1, 1, 0, 0, 0))
                info.compress_type = method
                z.writestr(info, data)
    return buf.getvalue()


def _records(data: bytes, sig: bytes) -> List[int]:
    out, at = [], data.find(sig)
    while at >= 0 and len(out) < 64:
        out.append(at)
        at = data.find(sig, at + 1)
    return out


def _patch(data: bytearray, at: int, fmt: str, value: int) -> None:
    size = struct.calcsize(fmt)
    if 0 <= at and at + size <= len(data):
        data[at:at + size] = struct.pack(fmt, value & ((1 << (8 * size)) - 1))


def mutate_zip_headers(d: Draw, data: bytes, notes: List[str]) -> bytes:
    """Lie in one field of a local or central zip header, or around the archive."""
    out = bytearray(data)
    local, central = _records(data, b"PK\x03\x04"), _records(data, b"PK\x01\x02")
    what = d.pick(["encrypt", "method", "csize", "usize", "offset", "crc", "namelen",
                   "prefix", "suffix", "truncate", "eocd-count"])
    notes.append(f"zip:{what}")
    where_l = d.pick(local) if local else -1
    where_c = d.pick(central) if central else -1
    big = d.pick([0, 1, 7, 0xFFFFFFFF, 0x7FFFFFFF, len(data), len(data) * 1000, 1 << 30])
    if what == "encrypt":
        _patch(out, where_l + 6, "<H", 1)
        _patch(out, where_c + 8, "<H", 1)
    elif what == "method":
        m = d.pick([8, 12, 14, 99, 93, 1, 0xFFFF])
        _patch(out, where_l + 8, "<H", m)
        _patch(out, where_c + 10, "<H", m)
    elif what == "csize":
        _patch(out, where_c + 20, "<I", big)
        if d.bool():
            _patch(out, where_l + 18, "<I", big)
    elif what == "usize":
        _patch(out, where_c + 24, "<I", big)
        if d.bool():
            _patch(out, where_l + 22, "<I", big)
    elif what == "offset":
        _patch(out, where_c + 42, "<I", d.pick([0, 1, big, max(0, where_l - 1)]))
    elif what == "crc":
        _patch(out, where_c + 16, "<I", d.int(0, 0xFFFFFFFF))
    elif what == "namelen":
        _patch(out, where_l + 26, "<H", d.pick([0, 1, 0xFFFF, 200]))
    elif what == "prefix":
        out = bytearray(d.bytes(64) + b"PK\x03\x04" * d.int(0, 1)) + out
    elif what == "suffix":
        out += d.bytes(64)
    elif what == "truncate":
        del out[d.int(0, len(out)):]
    elif what == "eocd-count":
        eocd = data.rfind(b"PK\x05\x06")
        _patch(out, eocd + 8 + 2 * d.int(0, 1), "<H", d.pick([0, 1, 0xFFFF, 3]))
    return bytes(out)


# ----------------------------------------------------------------- PyTorch
_TORCH_DTYPES = ["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16",
                 "int8", "uint8", "bool", "complex64", "float8_e4m3fn", "float8_e5m2",
                 "uint16", "uint32", "uint64"]


def _torch_tensor(d: Draw, torch: Any) -> Any:
    dtype = getattr(torch, d.pick(_TORCH_DTYPES))
    nbytes = torch.empty((), dtype=dtype).element_size()
    raw = values(d, np.uint8, (d.int(0, 64),))
    raw = raw[:raw.size // nbytes * nbytes].copy()
    base = torch.from_numpy(raw).view(dtype) if raw.size else torch.empty(0, dtype=dtype)
    view = d.pick(["plain", "reshape", "slice", "step", "transpose", "expand", "strided",
                   "offset", "param"])
    t = base
    n = t.numel()
    if view == "reshape" and n % 2 == 0 and n:
        t = t.reshape(2, n // 2)
    elif view == "slice" and n > 1:
        t = t[d.int(0, n - 1):]
    elif view == "step" and n > 2:
        t = t[::d.int(2, 3)]
    elif view == "transpose" and n % 2 == 0 and n:
        t = t.reshape(2, n // 2).t()
    elif view == "expand" and n:
        t = t[:1].expand(d.int(1, 4), 1)
    elif view == "strided" and n >= 4:
        # (2, 2) elements at offset o, strides (1, s): the last is o + 1 + s, which
        # must lie in the n elements (or torch refuses to make the view)
        offset = d.int(0, 1)
        t = t.as_strided((2, 2), (1, d.int(0, min(2, n - 2 - offset))), offset)
    elif view == "offset" and n > 1:
        t = t[1:].reshape(-1)
    elif view == "param" and dtype.is_floating_point:
        t = torch.nn.Parameter(t, requires_grad=False)
    return t


def _torch_object(d: Draw, torch: Any, depth: int = 0) -> Any:
    kind = d.int(0, 5) if depth < 3 else 0
    if kind <= 1:
        return _torch_tensor(d, torch)
    if kind == 2:
        return {name(d): _torch_object(d, torch, depth + 1) for _ in range(d.int(0, 3))}
    if kind == 3:
        return [_torch_object(d, torch, depth + 1) for _ in range(d.int(0, 3))]
    if kind == 4:
        return d.pick([1, 2.5, "text", True, None, (1, 2)])
    from collections import OrderedDict
    return OrderedDict((name(d), _torch_object(d, torch, depth + 1)) for _ in range(2))


_GLOBALS = [(b"os", b"system"), (b"builtins", b"eval"), (b"builtins", b"getattr"),
            (b"torch._utils", b"_rebuild_tensor_v2"), (b"torch._utils", b"_rebuild_tensor_v3"),
            (b"torch._utils", b"_rebuild_parameter"), (b"collections", b"OrderedDict"),
            (b"torch", b"FloatStorage"), (b"torch", b"BFloat16Storage"),
            (b"torch", b"UntypedStorage"), (b"torch", b"float8_e4m3fn"), (b"torch", b"Tensor"),
            (b"torch", b"Size"), (b"torch._utils", b"_rebuild_qtensor"),
            (b"torch._tensor", b"_rebuild_from_type_v2"), (b"numpy.core.multiarray",
                                                           b"_reconstruct")]
_OPS = [b"b", b"s", b"R", b"}", b"]", b")", b"(", b"0", b"2", b"N", b"h\x00", b"h\x05",
        b"q\x00", b"Q", b"\x85", b"\x86", b"t", b"u", b"e", b"a", b"K\x05", b"J\xff\xff\xff\xff",
        b"X\x01\x00\x00\x000", b"\x88", b"\x89", b".", b"\x94", b"\x8c\x01x",
        b"ctorch._utils\n_rebuild_tensor_v2\n", b"(X\x07\x00\x00\x00storagectorch\n"
        b"FloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ"]


def _int_op(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    if -(1 << 31) <= value < 1 << 31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def mutate_pickle(d: Draw, pkl: bytes, notes: List[str]) -> bytes:
    """One opcode-level change: an inserted or deleted opcode, a swapped global, an
    integer (sizes, strides, offsets, numel) or a string (storage keys) replaced."""
    try:
        ops = [pos for _, _, pos in pickletools.genops(pkl)]
        kinds = [op.name for op, _, _ in pickletools.genops(pkl)]
    except Exception:
        return pkl
    bounds = ops + [len(pkl)]
    segs = [pkl[bounds[i]:bounds[i + 1]] for i in range(len(ops))]
    what = d.pick(["insert", "delete", "global", "int", "string", "truncate", "dup"])
    i = d.int(1, max(1, len(segs) - 1)) if len(segs) > 1 else 0
    if what in ("global", "int", "string"):
        want = {"global": ("GLOBAL",), "int": ("BININT1", "BININT2", "BININT", "LONG1"),
                "string": ("BINUNICODE", "SHORT_BINUNICODE")}[what]
        idx = [k for k, kind in enumerate(kinds) if kind in want]
        if not idx:
            what = "insert"
        else:
            i = d.pick(idx)
    notes.append(f"pickle:{what}@{i}")
    if what == "insert":
        segs.insert(i, d.pick(_OPS))
    elif what == "delete" and segs:
        del segs[i]
    elif what == "global":
        mod, nm = d.pick(_GLOBALS)
        segs[i] = b"c" + mod + b"\n" + nm + b"\n"
    elif what == "int":
        segs[i] = _int_op(d.pick([0, 1, 2, 3, 7, 255, 256, 65535, -1, -7, 1 << 31,
                                  (1 << 62) - 1, 1 << 62, 1 << 63, 1 << 64, 10 ** 12]))
    elif what == "string":
        s = d.pick(["0", "1", "99", "", "../0", "data/0", "../../secret.bin", "cpu", "cuda:0",
                    "storage", "\x00", "data.pkl", "byteorder"]).encode()
        segs[i] = b"X" + struct.pack("<I", len(s)) + s
    elif what == "truncate":
        segs = segs[:i]
    elif what == "dup":
        segs.insert(i, segs[i] if i < len(segs) else b".")
    return b"".join(segs)


def gen_pytorch(d: Draw, ctx: Ctx) -> Case:
    import torch
    obj = _torch_object(d, torch)
    if d.bool():
        obj = {"state_dict": obj, "epoch": d.int(0, 9)}
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    case = Case("pytorch", "model.pt")
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = [(i.filename, z.read(i), i.compress_type) for i in z.infolist()]
    changed = False
    for _ in range(d.int(0, 3)):
        step = d.pick(["pickle", "pickle", "member", "zip"])
        if step == "member" and not members:
            step = "zip"    # every member dropped already
        if step == "pickle":
            for k, (m, raw, method) in enumerate(members):
                if m.endswith("data.pkl"):
                    members[k] = (m, mutate_pickle(d, raw, case.notes), method)
            changed = True
        elif step == "member":
            changed = True
            k = d.int(0, len(members) - 1)
            m, raw, method = members[k]
            how = d.pick(["dup", "drop", "rename", "method", "resize", "byteorder",
                          "second-pkl"])
            case.notes.append(f"member:{how}:{m}")
            if how == "dup":
                members.insert(d.int(0, len(members)), (m, d.bytes(32) or raw, method))
            elif how == "drop":
                del members[k]
            elif how == "rename":
                members[k] = (d.pick([m + "/", "../" + m, m.replace("data/", "data/../data/"),
                                      m.upper(), "/" + m, m + "\x00"]), raw, method)
            elif how == "method":
                members[k] = (m, raw, d.pick([zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                                              zipfile.ZIP_LZMA]))
            elif how == "resize":
                members[k] = (m, raw[:d.int(0, len(raw))] if d.bool() else raw + d.bytes(16),
                              method)
            elif how == "byteorder":
                prefix = members[0][0].split("/")[0]
                members = [x for x in members if not x[0].endswith("/byteorder")]
                members.append((f"{prefix}/byteorder",
                                d.pick([b"big", b"little\n", b"middle", b"\xff", b""]),
                                zipfile.ZIP_STORED))
            elif how == "second-pkl":
                # a copy of the (perhaps already renamed or dropped) pickle, or any bytes
                pkl = next((x[1] for x in members if x[0].endswith("data.pkl")),
                           d.bytes(32))
                members.insert(0, ("other/data.pkl", pkl, zipfile.ZIP_STORED))
    if changed:
        data = zip_bytes(members)
    if d.rare():
        data = mutate_zip_headers(d, data, case.notes)
    case.files[case.main] = data
    return case


# ----------------------------------------------------------------- safetensors
_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
              "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4",
              "U64": "<u8", "BOOL": "?", "F8_E4M3": "u1", "F8_E5M2": "u1"}


def _json_object(items: List[Tuple[str, Any]]) -> str:
    """A JSON object that may repeat a key (json.dumps cannot)."""
    return "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in items) + "}"


def gen_safetensors(d: Draw, ctx: Ctx) -> Case:
    from safetensors.numpy import save
    tensors = {}
    for _ in range(d.int(0, 4)):
        dt = d.pick(["<f4", "<f2", "<f8", "<i8", "<i4", "<i2", "i1", "u1", "?", "<u2"])
        tensors[d.pick(["w", "b", "emb", "a.b", "x", "\u00e9"])] = values(d, dt, shape(d))
    metadata = {"format": "pt"} if d.bool() else None
    data = save(tensors, metadata=metadata)      # the real writer
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    body = data[8 + hlen:]
    items: List[Tuple[str, Any]] = list(header.items())
    case = Case("safetensors", "model.safetensors")
    for _ in range(d.int(0, 3)):
        what = d.pick(["dup", "offsets", "dtype", "shape", "metadata", "drop", "extra",
                       "body", "entry"])
        case.notes.append(f"header:{what}")
        tens = [k for k, (key, v) in enumerate(items)
                if key != "__metadata__" and isinstance(v, dict)]
        k = d.pick(tens) if tens else None
        if what == "dup" and k is not None:
            items.insert(d.int(0, len(items)), (items[k][0], dict(items[d.pick(tens)][1])))
            case.must_refuse = f"the header names {items[k][0]!r} twice"
        elif what == "offsets" and k is not None and \
                isinstance(items[k][1].get("data_offsets"), list) and \
                len(items[k][1]["data_offsets"]) == 2 and \
                all(type(o) is int for o in items[k][1]["data_offsets"]):
            begin, end = items[k][1]["data_offsets"]
            items[k][1]["data_offsets"] = d.pick([
                [end, begin], [begin, end + 1], [begin - 1, end - 1], [0, end - begin],
                [begin, 2 ** 64], [-1, end], [begin + 0.0, end], [str(begin), end], [begin],
                [True, end], [0, len(body) + d.int(0, 64)], None])
        elif what == "dtype" and k is not None:
            items[k][1]["dtype"] = d.pick(list(_ST_DTYPES) + ["f32", "F128", "", None, 3,
                                                              "C64", "F4", "U1"])
        elif what == "shape" and k is not None:
            items[k][1]["shape"] = d.pick([[-1], [2 ** 63], [2 ** 40, 2 ** 40], [], [0],
                                           [1.0], [[2]], "2", None, [True], [1] * 65,
                                           [2 ** 31, 2 ** 31, 4]])
        elif what == "metadata":
            meta = d.pick([{"k": 1}, [], "x", {"k": {"n": 1}}, None, {"k": "v" * 1000},
                           {"": ""}, {"\x00": "\x1b[2J"}])
            items = [x for x in items if x[0] != "__metadata__"] + [("__metadata__", meta)]
        elif what == "drop" and k is not None:
            items[k][1].pop(d.pick(["dtype", "shape", "data_offsets"]), None)
        elif what == "extra" and k is not None:
            items[k][1][d.pick(["extra", "dtype "])] = d.pick([1, "x", None])
        elif what == "body":
            body = body[:d.int(0, len(body))] if d.bool() else body + d.bytes(32)
        elif what == "entry":
            items.append((name(d), d.pick([1, "x", [], {}, None])))
    text = _json_object(items).encode()
    if d.rare():
        text += b" " * d.int(0, 8)
    declared = len(text)
    if d.rare(8):
        declared = d.pick([0, 1, len(text) - 1, len(text) + 1, 2 ** 63, 2 ** 64 - 1,
                           len(text) + len(body)])
        case.notes.append(f"header-length:{declared}")
    case.files[case.main] = struct.pack("<Q", declared & (2 ** 64 - 1)) + text + body
    return case


# ----------------------------------------------------------------- npy / npz
def _npy_header(descr: str, fortran: str, shp: str, extra: str = "") -> str:
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, %s}" % (descr, fortran, shp, extra)


def npy_bytes(d: Draw, notes: List[str]) -> bytes:
    """A ``.npy`` written by numpy, perhaps with its header dict rewritten."""
    dt = d.pick(["<f4", ">f4", "<f2", "<i8", ">i2", "u1", "?", "<c8", ">f8", "<u4"])
    arr = values(d, dt, shape(d))
    if d.bool() and arr.ndim == 2:
        arr = np.asfortranarray(arr)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    raw = buf.getvalue()
    if not d.rare(2):
        return raw
    hlen = struct.unpack("<H", raw[8:10])[0]
    data = raw[10 + hlen:]
    descr, fortran, shp = repr(arr.dtype.str), repr(bool(np.isfortran(arr))), repr(arr.shape)
    extra = ""
    what = d.pick(["descr", "fortran", "shape", "extra", "missing", "version", "len",
                   "data", "garbage"])
    notes.append(f"npy:{what}")
    if what == "descr":
        descr = d.pick(["'|O'", "'<U5'", "'V8'", "'<f16'", "'m8[s]'", "'<M8[D]'",
                        "[('a', '<i4'), ('b', '<f8')]", "'>c16'", "'S3'", "'x'", "1",
                        "[('a', '|O')]", "'<f4' * 3", "__import__('os')", "'b1'", "'<e'"])
    elif what == "fortran":
        fortran = d.pick(["1", "None", "'x'", "True", "0"])
    elif what == "shape":
        shp = d.pick(["(-1,)", "(2 ** 62, 2 ** 62)", "(%d, %d)" % (2 ** 31, 2 ** 31),
                      "(1.5,)", "[2, 3]", "()", "(0,)", "(10 ** 100,)", "(True,)",
                      "(%d,)" % (1 << 26), "(" + "1, " * 70 + ")", "((2,),)"])
    elif what == "extra":
        extra = d.pick(["'x': 1, ", "'descr': '<i8', ", "'shape': (), "])
    elif what == "missing":
        shp = "(1,)"
        descr = "'<f4'"
        header = "{'descr': '<f4', }" if d.bool() else "{}"
        return _npy_frame(d, header, data, notes)
    elif what == "garbage":
        return _npy_frame(d, d.pick(["(", "{'descr': '<f4', 'fortran_order': False, "
                                          "'shape': (3,", "[1, 2]", "'\\x00'", "{" * 500]),
                          data, notes)
    elif what == "data":
        data = data[:d.int(0, len(data))] if d.bool() else data + d.bytes(16)
    version, minor = 1, 0
    if what in ("version", "len"):
        version = d.pick([1, 1, 2, 3, 0, 9])
        minor = d.pick([0, 0, 1, 44]) if what == "version" else 0
    return _npy_frame(d, _npy_header(descr, fortran, shp, extra), data, notes,
                      version=version, minor=minor, bad_len=what == "len")


def _npy_frame(d: Draw, header: str, data: bytes, notes: List[str], version: int = 1,
               bad_len: bool = False, minor: int = 0) -> bytes:
    text = header.encode("latin1", "replace")
    pad = -(10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    length = len(text)
    if bad_len:   # a v2/v3 header length is 4 bytes: up to 4 GiB declared in a tiny file
        length = d.pick([0, 1, length - 1, length + 1, 65535, 1 << 31, 0xFFFFFFFF])
        notes.append(f"npy:header-length:{length}")
    if (version, minor) == (1, 0):
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", length & 0xFFFF) + text + data
    return b"\x93NUMPY" + bytes([version, minor]) + struct.pack("<I", length) + text + data


def gen_npy(d: Draw, ctx: Ctx) -> Case:
    case = Case("npy", "array.npy")
    case.files[case.main] = npy_bytes(d, case.notes)
    return case


def gen_npz(d: Draw, ctx: Ctx) -> Case:
    members = []
    for _ in range(d.int(0, 4)):
        member = d.pick(["a.npy", "b.npy", "a", "w.npy", "../x.npy", "a/b.npy", "/abs.npy",
                         "a.b.npy", "\u00e9.npy", ".npy", "x\x00.npy", "a.npy.npy",
                         "data.pkl", "A.NPY"])
        members.append((member, npy_bytes(d, []), d.pick([zipfile.ZIP_STORED,
                                                          zipfile.ZIP_DEFLATED])))
    case = Case("npz", "arrays.npz", notes=[m for m, _, _ in members])
    if members and d.rare():
        k = d.int(0, len(members) - 1)
        members[k] = (members[k][0], npy_bytes(d, case.notes), members[k][2])
    if not members or d.bool():   # numpy's own writer
        buf = io.BytesIO()
        arrays = {f"m{i}": values(d, d.pick(["<f4", "<i2", "u1"]), shape(d))
                  for i in range(d.int(1, 3))}
        (np.savez_compressed if d.bool() else np.savez)(buf, **arrays)
        data = buf.getvalue()
        if members:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                members = [(i.filename, z.read(i), i.compress_type) for i in z.infolist()] \
                    + members
            data = zip_bytes(members)
    else:
        data = zip_bytes(members)
    if d.rare():
        data = mutate_zip_headers(d, data, case.notes)
    case.files[case.main] = data
    return case


# ----------------------------------------------------------------- GGUF
def gguf_fields(data: bytes) -> Dict[str, List[Tuple[int, str]]]:
    """Where each structural field of a (valid) little-endian GGUF file lies:
    name -> [(offset, struct format)], from a walk of its own layout."""
    out: Dict[str, List[Tuple[int, str]]] = {k: [] for k in (
        "version", "n_tensors", "n_kv", "key_len", "kv_type", "kv_value", "array_type",
        "array_count", "name_len", "n_dims", "dim", "ggml_type", "offset")}
    out["version"].append((4, "<I"))
    out["n_tensors"].append((8, "<Q"))
    out["n_kv"].append((16, "<Q"))
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    at = 24
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}

    def value(t, at):
        if t in scalar:
            out["kv_value"].append((at, scalar[t]))
            return at + struct.calcsize(scalar[t])
        if t == 8:
            out["key_len"].append((at, "<Q"))
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        if t == 9:
            out["array_type"].append((at, "<I"))
            out["array_count"].append((at + 4, "<Q"))
            et, count = struct.unpack_from("<IQ", data, at)
            at += 12
            for _ in range(min(count, 1 << 16)):
                at = value(et, at)
            return at
        raise ValueError(t)

    for _ in range(n_kv):
        out["key_len"].append((at, "<Q"))
        at += 8 + struct.unpack_from("<Q", data, at)[0]
        out["kv_type"].append((at, "<I"))
        t = struct.unpack_from("<I", data, at)[0]
        at = value(t, at + 4)
    for _ in range(n_tensors):
        out["name_len"].append((at, "<Q"))
        at += 8 + struct.unpack_from("<Q", data, at)[0]
        out["n_dims"].append((at, "<I"))
        nd = struct.unpack_from("<I", data, at)[0]
        at += 4
        for _ in range(nd):
            out["dim"].append((at, "<Q"))
            at += 8
        out["ggml_type"].append((at, "<I"))
        out["offset"].append((at + 4, "<Q"))
        at += 12
    return out


def gen_gguf(d: Draw, ctx: Ctx) -> Case:
    import gguf
    path = ctx.scratch / "w.gguf"
    w = gguf.GGUFWriter(str(path), d.pick(["llama", "gpt2", "x"]))
    w.add_name(d.pick(["tiny", "\u00e9", ""]))
    if d.bool():
        w.add_custom_alignment(d.pick([8, 16, 32, 64]))
    for i in range(d.int(0, 2)):
        w.add_array(f"k.arr{i}", [d.int(0, 9) for _ in range(d.int(0, 3))])
    w.add_uint32("k.u32", d.int(0, 1 << 20))
    for i in range(d.int(0, 3)):
        dt = d.pick([np.float32, np.float16, np.int8, np.int16, np.int32, np.float64,
                     np.int64])
        shp = tuple(d.int(1, 4) for _ in range(d.int(1, 3)))
        w.add_tensor(f"t{i}.w", values(d, dt, shp).copy())   # names of one length
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = bytearray(path.read_bytes())
    case = Case("gguf", "model.gguf")
    fields = gguf_fields(bytes(data))
    for _ in range(d.int(0, 3)):
        what = d.pick(["field", "field", "field", "dup-name", "dup-key", "truncate", "tail"])
        # fields found in the writer's file; a truncation may have cut some off
        present = {k: [(at, fmt) for at, fmt in v if at + struct.calcsize(fmt) <= len(data)]
                   for k, v in fields.items()}
        present = {k: v for k, v in present.items() if v}
        if what == "field" and not present:
            what = "tail"
        if what == "field":
            kind = d.pick(sorted(present))
            at, fmt = d.pick(present[kind])
            size = struct.calcsize(fmt)
            old = struct.unpack_from(fmt, data, at)[0]
            new = d.pick([0, 1, 2, 3, 7, 9, 13, 30, 31, 39, 100, 255, 1 << 31, (1 << 32) - 1,
                          1 << 40, (1 << 63) - 1, (1 << 64) - 1, len(data), 32, 64,
                          int(old) + 1 if isinstance(old, int) else 1,
                          int(old) - 1 if isinstance(old, int) else 0])
            case.notes.append(f"gguf:{kind}@{at}:{old}->{new}")
            if fmt in ("<f", "<d"):
                struct.pack_into(fmt, data, at, float(new))
            elif fmt == "<?":
                data[at] = new & 0xFF
            else:
                data[at:at + size] = (new & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        elif what == "dup-name":
            case.notes.append("gguf:dup-name")
            if b"t1.w" in data:
                data = bytearray(bytes(data).replace(b"t1.w", b"t0.w", 1))
                case.must_refuse = "two tensors named 't0.w'"
        elif what == "dup-key":
            case.notes.append("gguf:dup-key")
            data = bytearray(bytes(data).replace(b"k.arr1", b"k.arr0", 1))
        elif what == "truncate":
            case.notes.append("gguf:truncate")
            del data[d.int(0, len(data)):]
        else:
            data += d.bytes(64)
    if any(n not in ("gguf:dup-name", "gguf:dup-key") for n in case.notes):
        # a truncation or a changed field (a smaller count, a name's length) may leave
        # the repeated name unread: the file may then open, honestly
        case.must_refuse = ""
    case.files[case.main] = bytes(data)
    return case


# ----------------------------------------------------------------- HDF5
_H5_DTYPES = ["<f4", ">f4", "<f2", "<f8", "<i8", ">i4", "i1", "u1", "<u2", "?", "<c8",
              "<c16", "S4", "compound", "enum", "vlen-str"]


def _h5_dtype(d: Draw, h5py: Any) -> Any:
    dt = d.pick(_H5_DTYPES)
    if dt == "compound":
        return np.dtype([("a", "<i4"), ("b", "<f8")])
    if dt == "enum":
        return h5py.enum_dtype({"A": 0, "B": 1}, basetype="u1")
    if dt == "vlen-str":
        return h5py.string_dtype()
    return np.dtype(dt)


def gen_hdf5(d: Draw, ctx: Ctx) -> Case:
    import h5py
    path = ctx.scratch / "w.h5"
    case = Case("hdf5", "model.h5")
    secret_h5 = d.pick(ctx.outward(ctx.secret_h5)[:4])
    secret_bin = d.pick([str(ctx.secret_bin), "../secret.bin", "secret.bin"])
    with h5py.File(path, "w") as f:
        for i in range(d.int(0, 4)):
            nm = d.pick(["w", "a.b", "a/b", "g/h/w", "layer.0/weight", "layer/0.weight",
                         "x y", "\u00e9", "a", "b"]) + ("" if d.bool() else str(i))
            if nm in f or any(nm.startswith(k + "/") for k in f):
                continue
            how = d.pick(["plain", "plain", "chunked", "gzip", "scalar", "empty", "huge",
                          "external", "virtual", "extlink", "softlink", "hardlink",
                          "fill", "resizable"])
            case.notes.append(f"h5:{how}:{nm}")
            try:
                if how == "plain":
                    dt = _h5_dtype(d, h5py)
                    shp = shape(d)
                    f.create_dataset(nm, shape=shp, dtype=dt)
                    if dt.kind in "biufc" and not dt.fields:
                        f[nm][...] = values(d, dt, shp)
                elif how in ("chunked", "gzip", "resizable"):
                    shp = tuple(d.int(1, 6) for _ in range(d.int(1, 2)))
                    kw = {"chunks": True}
                    if how == "gzip":
                        kw.update(compression="gzip", shuffle=d.bool())
                    if how == "resizable":
                        kw["maxshape"] = (None,) * len(shp)
                    f.create_dataset(nm, data=values(d, "<f4", shp), **kw)
                elif how == "scalar":
                    f[nm] = values(d, d.pick(["<f8", "<i4"]), ())
                elif how == "empty":
                    f.create_dataset(nm, data=h5py.Empty("f4"))
                elif how == "huge":
                    # a few KB of file declaring up to 64 MiB (nothing written)
                    n = d.pick([1 << 20, 1 << 23, (1 << 26) // 4])
                    f.create_dataset(nm, shape=(n,), dtype="<f4", chunks=(1024,),
                                     compression=d.pick([None, "gzip"]),
                                     fillvalue=d.pick([0.0, 1.5]))
                elif how == "fill":
                    f.create_dataset(nm, shape=(d.int(1, 64),), dtype="<i4", fillvalue=7)
                elif how == "external":
                    n = d.pick([64, 256, 1024])
                    f.create_dataset(nm, shape=(n,), dtype="u1",
                                     external=[(secret_bin, d.int(0, 16), n)])
                elif how == "virtual":
                    layout = h5py.VirtualLayout(shape=(256,), dtype="u1")
                    layout[:] = h5py.VirtualSource(secret_h5, "data", shape=(1024,))[:256]
                    f.create_virtual_dataset(nm, layout, fillvalue=0)
                elif how == "extlink":
                    f[nm] = h5py.ExternalLink(secret_h5, d.pick(["data", "/floats"]))
                elif how == "softlink" and len(f):
                    f[nm] = h5py.SoftLink("/" + d.pick(sorted(f.keys())))
                elif how == "hardlink" and len(f):
                    target = f[d.pick(sorted(f.keys()))]
                    f[nm] = target
            except (ValueError, TypeError, KeyError, OSError, RuntimeError):
                continue  # h5py would not write it: no case
        if d.bool():
            f.attrs[d.pick(["k", "a.b", "\u00e9"])] = d.pick([1, "v", 2.5, b"\xff",
                                                             np.arange(3)])
    case.files[case.main] = path.read_bytes()
    return case


# ----------------------------------------------------------------- ONNX
def gen_onnx(d: Draw, ctx: Ctx) -> Case:
    import onnx
    from onnx import TensorProto, helper
    case = Case("onnx", "model.onnx")
    inits = []
    for i in range(d.int(0, 4)):
        nm = d.pick(["w", "b", "w", "a.b", "", "\u00e9", f"t{i}"])
        how = d.pick(["raw", "typed", "external", "external", "mismatch", "dtype", "huge"])
        case.notes.append(f"onnx:{how}:{nm}")
        if how == "raw":
            arr = values(d, "<f4", shape(d))
            t = helper.make_tensor(nm, TensorProto.FLOAT, arr.shape, arr.tobytes(), raw=True)
        elif how == "typed":
            arr = values(d, "<i8", shape(d))
            t = helper.make_tensor(nm, TensorProto.INT64, arr.shape, arr.ravel().tolist())
        elif how == "mismatch":
            # dims that the data does not fill (helper.make_tensor would refuse)
            t = TensorProto(name=nm, data_type=TensorProto.FLOAT,
                            dims=d.pick([[2, 3], [1 << 20], [0], [1 << 40, 1 << 40], [-1]]),
                            raw_data=values(d, "<f4", (d.int(0, 4),)).tobytes())
        elif how == "dtype":
            dtype = d.pick([TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT8E4M3FN,
                            TensorProto.BOOL, TensorProto.UINT8, TensorProto.COMPLEX64,
                            TensorProto.STRING, TensorProto.INT4, TensorProto.UINT64, 999])
            t = TensorProto(name=nm, data_type=dtype, dims=[2],
                            raw_data=values(d, "u1", (d.int(0, 16),)).tobytes())
        else:
            dims = [d.pick([16, 64, 256])] if how == "external" else [1 << 24]
            t = TensorProto(name=nm, data_type=d.pick([TensorProto.UINT8, TensorProto.FLOAT]),
                            dims=dims)
            t.data_location = TensorProto.EXTERNAL
            location = d.pick(ctx.outward(ctx.secret_bin) + ["beside.bin", "link.bin",
                                                             "missing.bin", "", "/dev/zero",
                                                             "sub/../beside.bin", "."])
            for key, value in (("location", location),
                               ("offset", str(d.pick([0, 1, 16, 4096, -1, 1 << 40]))),
                               ("length", str(d.pick([16, 64, 256, 0, 1 << 40, -5])))):
                if key == "location" or d.bool():
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
            case.notes.append(f"location={location!r}")
        inits.append(t)
    # some as Constant nodes: read, checked and contained as initializers are
    # (onnx_file._constant_tensor)
    where = [d.bool() for _ in inits]
    nodes = [helper.make_node("Constant", [], [t.name], value=t)
             for t, const in zip(inits, where) if const]
    inits = [t for t, const in zip(inits, where) if not const]
    case.notes.append(f"onnx:constants={sum(where)}")
    graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
    model = helper.make_model(graph, producer_name=d.pick(["x", "\x1b[2J"]))
    case.files[case.main] = model.SerializeToString()
    case.files["beside.bin"] = values(d, "u1", (512,)).tobytes()
    case.links["link.bin"] = str(ctx.secret_bin)
    return case


# ----------------------------------------------------------------- sharded
_WRITER_SCRATCH: List[Path] = []


def _written_by_ztensor(fill: Callable[[Any], None]) -> bytes:
    """The bytes of a .zt file ztensor.Writer makes (``fill(writer)`` writes the
    objects), through one scratch file reused by every call: no directory made and
    removed per file (the sharded and remote targets make thousands)."""
    import ztensor
    if not _WRITER_SCRATCH or not _WRITER_SCRATCH[0].parent.is_dir():
        _WRITER_SCRATCH[:] = [Path(tempfile.mkdtemp(prefix="zt-writer-")) / "w.zt"]
    path = _WRITER_SCRATCH[0]
    with ztensor.Writer(path) as w:
        fill(w)
    return path.read_bytes()


def _zt_shard(d: Draw, names: List[str]) -> bytes:
    def fill(w):
        for nm in names:
            w.write_numpy(nm, values(d, d.pick(["<f4", "u1", "<i2"]), shape(d)))
    return _written_by_ztensor(fill)


def gen_sharded(d: Draw, ctx: Ctx) -> Case:
    """A directory of shards and an index whose weight_map may name hostile files."""
    from safetensors.numpy import save
    n_shards = d.int(1, 3)
    names = [f"layer.{i}.weight" for i in range(d.int(1, 4))]
    st = d.bool()
    ext = ".safetensors" if st else ".zt"
    shard_files = [f"model-{i + 1:05d}-of-{n_shards:05d}{ext}" for i in range(n_shards)]
    where = {nm: shard_files[i % n_shards] for i, nm in enumerate(names)}
    case = Case("sharded", f"model{ext}.index.json")
    for file in shard_files:
        held = [nm for nm, f in where.items() if f == file]
        if st:
            case.files[file] = save({nm: values(d, "<f4", shape(d)) for nm in held})
        else:
            case.files[file] = _zt_shard(d, held)
    weight_map: List[Tuple[str, Any]] = list(where.items())
    secret = ctx.secret_st if st else ctx.secret_zt
    hostile = ctx.outward(secret) + [secret.name, ".", "..", "", "/", shard_files[0] + "/",
                                     "./" + shard_files[0], shard_files[0] + "\x00",
                                     shard_files[0] + "\n", "\x00", "a\x00b" + ext,
                                     shard_files[0].upper(), "\ud800" + ext, "~/x" + ext,
                                     "CON", "nul" + ext, "\\\\host\\share\\x" + ext]
    meta: Any = {"total_size": sum(len(v) for v in case.files.values())}
    for _ in range(d.int(0, 3)):
        what = d.pick(["hostile", "hostile", "missing-name", "wrong-shard", "dup", "meta",
                       "value-type", "symlink-shard", "truncate-shard"])
        case.notes.append(f"index:{what}")
        if what == "hostile":
            weight_map.append(("secret", d.pick(hostile)))
        elif what == "missing-name":
            weight_map.append(("nowhere", shard_files[0]))
        elif what == "wrong-shard" and len(weight_map) > 1:
            weight_map[0] = (weight_map[0][0], weight_map[-1][1])
        elif what == "dup":
            weight_map.append((weight_map[0][0], d.pick(hostile + shard_files)))
            case.must_refuse = f"the weight_map names {weight_map[0][0]!r} twice"
        elif what == "meta":
            meta = d.pick([[], "x", {"total_size": "1e999"}, {"total_size": -1},
                           {"k": {"deep": [1, 2]}}, None, {"total_size": 1 << 70}])
        elif what == "value-type":
            weight_map.append(("odd", d.pick([1, None, [], {"f": shard_files[0]}, True])))
        elif what == "symlink-shard":
            # a shard that is a link out: followed like any file (HF caches link
            # shards to blobs), so the secret file is not a containment case here
            case.links["linked" + ext] = str(ctx.secret_bin)
            weight_map.append(("linked", "linked" + ext))
        elif what == "truncate-shard":
            f0 = shard_files[0]
            case.files[f0] = case.files[f0][:d.int(0, len(case.files[f0]))]
    index = "{" + f'"metadata":{json.dumps(meta)},"weight_map":' + \
        _json_object(weight_map) + "}"
    if d.rare(8):
        index = d.pick(["[]", "{", '{"weight_map":[]}', "\ufeff" + index, "[" * 10000,
                        '{"weight_map":{"a":"b"}}' + "x"])
    case.files[case.main] = index.encode("utf-8", "surrogatepass")
    return case


# ----------------------------------------------------------------- HTTP
@dataclass
class Answer:
    """How the fake server (tests/http_servers.HostileHTTP) answers one request
    (honest where a field says so)."""

    status: int = 0            # 0: what an honest server sends (200 or 206)
    content_range: str = "right"   # right, absent, wrong-start, wrong-total, garbage, star
    length: str = "right"          # right, absent, short, long
    body: str = "right"            # right, truncated, extra, empty, flipped, whole
    accept_ranges: bool = True

    def honest_body(self) -> bool:
        return self.body == "right" and self.status in (0, 200, 206)


def http_answers(d: Draw, n: int = 8) -> List[Answer]:
    out = []
    for _ in range(n):
        if not d.rare(3):
            out.append(Answer())
            continue
        out.append(Answer(
            status=d.pick([0, 200, 206, 404, 416, 500, 503, 302, 204, 403, 999]),
            content_range=d.pick(["right", "absent", "wrong-start", "wrong-total", "garbage",
                                  "star", "huge"]),
            length=d.pick(["right", "absent", "short", "long", "huge", "negative"]),
            body=d.pick(["right", "truncated", "extra", "empty", "flipped", "whole"]),
            accept_ranges=d.bool()))
    return out


def zt_file(d: Draw) -> Tuple[bytes, Dict[str, np.ndarray]]:
    """A .zt file (ztensor.Writer) with checksums, and what it holds."""
    tensors = {f"t{i}": values(d, d.pick(["<f4", "u1", "<i8"]), shape(d, 2, 40))
               for i in range(d.int(1, 3))}

    def fill(w):
        for nm, arr in tensors.items():
            w.write_numpy(nm, arr, checksum="crc32c", compress=d.rare())
    return _written_by_ztensor(fill), tensors


GENERATORS: Dict[str, Callable[[Draw, Ctx], Case]] = {
    "pytorch": gen_pytorch, "safetensors": gen_safetensors, "npy": gen_npy, "npz": gen_npz,
    "gguf": gen_gguf, "hdf5": gen_hdf5, "onnx": gen_onnx, "sharded": gen_sharded,
}
FOREIGN = ["pytorch", "safetensors", "npy", "npz", "gguf", "hdf5", "onnx"]


def cases(kind: str, ctx: Ctx):
    """A hypothesis strategy of :class:`Case` for ``kind``."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        return GENERATORS[kind](HypothesisDraw(draw), ctx)
    return build()


def answers():
    """A hypothesis strategy of HTTP answer plans."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw):
        return http_answers(HypothesisDraw(draw))
    return build()


# ----------------------------------------------------------------- the properties' checks
class Breach(AssertionError):
    """A property broken by an input: not a clean error, and not a clean result."""


def small_limits():
    """Limits small enough that a declared size beyond them is a bug to see, not RAM
    to spend (as tools/fuzz/common.py)."""
    import ztensor
    return ztensor.Limits(max_component_size=1 << 22, max_total_decompressed=1 << 24,
                          max_manifest_size=1 << 22)


def present_bytes(directory: Path) -> int:
    """The bytes of the regular files in the case directory (links not followed)."""
    total = 0
    for root, _, files in os.walk(directory):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def budget(directory: Path, limits: Any) -> int:
    """What one tensor may cost: the component limit, or what the input's bytes can
    honestly expand to (deflate's ceiling is 1032:1)."""
    return max(limits.max_component_size, 1032 * present_bytes(directory))


def _owner(arr: np.ndarray) -> Any:
    """The object at the end of ``arr``'s chain of bases: the buffer its elements
    live in (an ndarray that owns its data, bytes, a bytearray, a file mapping)."""
    obj: Any = arr
    for _ in range(64):
        nxt = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
        if nxt is None:
            break
        obj = nxt
    return obj


def allocated(arr: np.ndarray) -> int:
    """The memory ``arr`` holds: the size of the buffer its elements live in, and
    nothing for a view of a file mapping (the input's own bytes, or a file outside
    it, which :func:`leaked` catches).  A zero-copy view costs what its buffer
    costs, however many elements it shows (stride 0: ``torch.zeros(1).expand(n)``
    read as a broadcast view is its one element); ``read_numpy(copy=True)`` of it
    owns all n."""
    import mmap
    owner = _owner(arr)
    if isinstance(owner, mmap.mmap):
        try:
            owner.size()        # a file behind it (an anonymous map has none)
            return 0
        except (OSError, ValueError):
            return len(owner)
    if isinstance(owner, np.ndarray):
        return owner.nbytes     # owns its data (it ends the chain)
    try:
        return memoryview(owner).nbytes
    except TypeError:
        return arr.nbytes       # a buffer we cannot see: as if arr owned it all


def _distinct(arr: np.ndarray) -> np.ndarray:
    """``arr`` with every stride-0 axis cut to two: each distinct element, and each
    pair of elements that meet in ``arr``'s bytes (a secret cut in two by a
    repeat), without the repeats."""
    return arr[tuple(slice(0, 2) if s == 0 else slice(None)
                     for s in arr.strides)]


def _span_bytes(arr: np.ndarray) -> bytes:
    """Every byte of memory ``arr`` can reach (its lowest to its highest address)."""
    import ctypes
    from numpy.lib.array_utils import byte_bounds
    lo, hi = byte_bounds(arr)
    return ctypes.string_at(lo, hi - lo) if hi > lo else b""


def check_array(arr: Any, most: int, where: str) -> None:
    """An array handed out: the memory it holds (:func:`allocated`) within ``most``,
    every element read, and free of any secret byte.

    Reading costs what the array can reach, not what its shape multiplies out to:
    the distinct elements (stride-0 axes cut to two) are copied when they fit in
    ``most``; a view whose non-zero strides overlap past that (``as_strided`` over a
    small storage) is read as the span of memory it covers, which must fit too."""
    a = np.asarray(arr)
    if a.dtype.kind == "O":
        raise Breach(f"{where}: an object array")
    held = allocated(a)
    if held > most:
        raise Breach(f"{where}: holds {held} bytes ({a.shape} {a.dtype}, strides "
                     f"{a.strides}) from an input allowing {most}")
    if a.size == 0:
        return
    distinct = _distinct(a)
    if distinct.nbytes <= most:
        raw = np.ascontiguousarray(distinct).view(np.uint8).tobytes()  # every element
    else:
        raw = _span_bytes(a)
        if len(raw) > most:
            raise Breach(f"{where}: reaches {len(raw)} bytes of memory ({a.shape} "
                         f"{a.dtype}, strides {a.strides}) from an input allowing {most}")
    if _holds_secret(raw):
        raise Breach(f"{where}: holds bytes of a file outside the input")


def check_attributes(attributes: Any, where: str) -> None:
    text = repr(attributes).encode("utf-8", "replace")
    if any(w in text for w in _WINDOWS):
        raise Breach(f"{where}: attributes hold bytes of a file outside the input")


def read_through_reader(path: Path, limits: Any, most: int) -> int:
    """Open with ztensor.Reader and read every tensor every way; the number read.
    A copy (``copy=True``: it owns every element, a stride-0 view's repeats
    included) is held to ``limits.max_component_size``, views to ``most``."""
    import ztensor
    n = 0
    with ztensor.Reader(path, limits=limits) as r:
        check_attributes(r.attributes, "Reader.attributes")
        for nm in r.keys():
            r.metadata(nm)
            check_array(r.read_numpy(nm), most, f"read_numpy({nm!r})")
            check_array(r.read_numpy(nm, copy=True), limits.max_component_size,
                        f"read_numpy({nm!r}, copy=True)")
            for role, arr in r.read(nm).components.items():
                check_array(arr, most, f"read({nm!r}).{role}")
            n += 1
    return n


def read_through_open_any(path: Path, most: int) -> int:
    """ztensor convert's path: convert_inputs.open_any, every tensor pulled through."""
    from ztensor.tools import convert_inputs
    n = 0
    attributes, tensors = convert_inputs.open_any(path)
    check_attributes(attributes, "open_any attributes")
    for nm, tensor in tensors:
        for role, arr in tensor.components.items():
            check_array(arr, most, f"open_any {nm!r}.{role}")
        n += 1
    return n


def read_through_sharded(path: Path, most: int) -> int:
    """open_sharded (the index file, or its directory), every tensor every way."""
    import ztensor
    n = 0
    with ztensor.open_sharded(path) as r:
        check_attributes(r.attributes, "ShardedReader.attributes")
        for nm in r.keys():
            check_array(r.read_numpy(nm), most, f"sharded read_numpy({nm!r})")
            for role, arr in r.read(nm).components.items():
                check_array(arr, most, f"sharded read({nm!r}).{role}")
            n += 1
        for nm, arr in r.read_all().items():
            check_array(arr, most, f"sharded read_all {nm!r}")
        r.verify()
    return n


class address_space_cap:
    """RLIMIT_AS at what the process maps now plus ``extra``: an allocation a file
    merely declares becomes a MemoryError here instead of swapping a shared machine."""

    def __init__(self, extra: int = 2 << 30) -> None:
        self.extra = extra

    def __enter__(self):
        import resource
        self.old = resource.getrlimit(resource.RLIMIT_AS)
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        cap = used + self.extra
        if self.old[1] != resource.RLIM_INFINITY:
            cap = min(cap, self.old[1])
        resource.setrlimit(resource.RLIMIT_AS, (cap, self.old[1]))
        return self

    def __exit__(self, *exc):
        import resource
        resource.setrlimit(resource.RLIMIT_AS, self.old)
        return False


# ---------------------------------------------------------------- exports
EXPORTS = [".zt", ".safetensors", ".npz", ".gguf"]


def _same_elements(want: np.ndarray, got: np.ndarray) -> bool:
    """Whether an export holds the input's elements: shape, dtype and bytes (a bool's
    truth: a reader's bool array may hold bytes other than 1, exports write 0 or 1)."""
    # in native byte order: a big-endian input (an .npy '>f4') is exported as its values
    want, got = (a.astype(a.dtype.newbyteorder("="), copy=False) for a in (want, got))
    if want.shape != got.shape or want.dtype != got.dtype:
        return False
    want, got = np.ascontiguousarray(want), np.ascontiguousarray(got)
    if want.dtype == np.bool_:
        return bool(((want.view(np.uint8) != 0) == (got.view(np.uint8) != 0)).all())
    return want.tobytes() == got.tobytes()


def export_round_trips_or_writes_nothing(path: Path, directory: Path, suffix: str,
                                         limits: Any, most: int) -> str:
    """``ztensor.convert(path, directory/"exported"+suffix)``: refused with a
    ZTensorError and nothing left in ``directory`` that was not there, or written,
    and every tensor of the input (as ``Reader`` reads it) read back from the output
    with the same name, shape, dtype and bytes.  Inputs whose tensors show more than
    ``most`` bytes are not exported (a run measures bugs, not the disk).  Returns
    what happened ("skipped", "refused", "written")."""
    import ztensor
    try:
        with ztensor.Reader(path, limits=limits) as r:
            if sum(c.decoded_length for n in r.keys()
                   for c in r.metadata(n).components.values()) > most:
                return "skipped"
    except ztensor.ZTensorError:
        return "skipped"  # the readers' own properties cover what does not open
    before = sorted(os.listdir(directory))
    out = directory / ("exported" + suffix)
    try:
        ztensor.convert(str(path), str(out))
    except ztensor.ZTensorError:
        left = sorted(os.listdir(directory))
        if left != before:
            raise Breach(f"a refused export left {sorted(set(left) - set(before))}")
        return "refused"
    with ztensor.Reader(path, limits=limits) as src, ztensor.Reader(out) as dst:
        if sorted(src.keys()) != sorted(dst.keys()):
            raise Breach(f"exported names {sorted(dst.keys())} != {sorted(src.keys())}")
        for name in src.keys():
            if src.metadata(name).format != "dense":
                continue  # another format (GGUF's blocks) goes as its format says
            if not _same_elements(src.read_numpy(name), dst.read_numpy(name)):
                raise Breach(f"{name!r} exported to {suffix} reads back otherwise")
    return "written"
