"""The ``ztensor`` command.

``ztensor ls FILE``               one row per object: name, format, shape, dtype, encoding, size
``ztensor info FILE``             version, attributes, counts and total sizes
``ztensor verify FILE``           structure, every object decoded, every digest checked
``ztensor convert IN OUT``        .safetensors / .npy / .npz / .zt (any version) -> .zt v1.2
``ztensor dequantize IN OUT``     quantized_group objects -> dense, others copied
``ztensor diff A B``              objects added, removed, changed; value differences

Bad input files print one line (``ztensor: <file>: <problem>``) and exit 2, never a
traceback.  ``verify`` and ``diff`` exit 1 when the file is broken / the files differ.
Long work shows progress on a terminal (stderr), unless ``--quiet``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ztensor._version import __version__
from ztensor.errors import ZTensorError
from ztensor.reader import Reader


def _type_label(obj) -> str:
    return f"{obj.dtype}/{obj.type}" if obj.type else str(obj.dtype)


def _encoding_label(obj) -> str:
    return ",".join(sorted({c.encoding for c in obj.components.values()})) or "-"


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def cmd_ls(reader, args, out):
    rows = []
    for name in reader.keys():
        obj = reader.metadata(name)
        rows.append({"name": name, "format": obj.format, "shape": list(obj.shape),
                     "dtype": _type_label(obj), "encoding": _encoding_label(obj),
                     "stored_bytes": obj.stored_size})
    if args.json:
        json.dump(rows, out, indent=1)
        out.write("\n")
        return 0
    table = [("NAME", "FORMAT", "SHAPE", "DTYPE", "ENCODING", "SIZE")]
    table += [(r["name"], r["format"], "[" + ", ".join(map(str, r["shape"])) + "]", r["dtype"],
               r["encoding"], _human(r["stored_bytes"])) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")
    return 0


def cmd_info(reader, args, out):
    formats, stored, decoded, digests = {}, 0, 0, 0
    for name in reader.keys():
        obj = reader.metadata(name)
        formats[obj.format] = formats.get(obj.format, 0) + 1
        for comp in obj.components.values():
            stored += comp.length
            decoded += comp.decoded_length or 0
            digests += comp.digest is not None
    info = {"file": reader.path, "version": reader.version, "objects": len(reader),
            "formats": formats, "stored_bytes": stored, "decoded_bytes": decoded,
            "digests": digests, "attributes": reader.attributes}
    if args.json:
        json.dump(info, out, indent=1, default=repr)
        out.write("\n")
        return 0
    out.write(f"file:        {info['file']}\n")
    out.write(f"version:     {info['version']}\n")
    out.write(f"objects:     {info['objects']}"
              + "".join(f"  {k}={v}" for k, v in sorted(formats.items())) + "\n")
    out.write(f"stored:      {_human(stored)} ({stored} bytes)\n")
    out.write(f"decoded:     {_human(decoded)} ({decoded} bytes)\n")
    out.write(f"digests:     {digests}\n")
    out.write("attributes:" + ("  (none)\n" if not reader.attributes else "\n"))
    for key, value in reader.attributes.items():
        out.write(f"  {key}: {value!r}\n")
    return 0


class Progress:
    """``done / total, rate, time left`` on one stderr line, only on a terminal."""

    def __init__(self, total, quiet):
        self.total, self.done, self.start = max(total, 1), 0, time.monotonic()
        self.enabled = not quiet and sys.stderr.isatty()
        self.last = 0.0

    def add(self, nbytes):
        self.done += nbytes
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.1:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate else 0
        sys.stderr.write(f"\r  {100 * self.done / self.total:5.1f}%  {_human(self.done)} / "
                         f"{_human(self.total)}  {_human(rate)}/s  {left:5.0f} s left ")
        sys.stderr.flush()

    def finish(self):
        if self.enabled:
            sys.stderr.write("\r" + " " * 70 + "\r")


def _nbytes(tensor) -> int:
    return sum(getattr(a, "nbytes", 0) for a in tensor.components.values())


def cmd_verify(args, out):
    problems, digests, objects = [], 0, 0
    with Reader(args.file, verify=True) as reader:
        progress = Progress(sum(reader.metadata(n).stored_size for n in reader), args.quiet)
        for name in reader.keys():
            meta = reader.metadata(name)
            objects += 1
            try:
                reader.read(name)             # decodes, checks sizes and digests
                digests += sum(c.digest is not None for c in meta.components.values())
            except ZTensorError as exc:
                problems.append(str(exc))
            progress.add(meta.stored_size)
        progress.finish()
        result = {"file": reader.path, "version": reader.version, "objects": objects,
                  "digests_checked": digests, "problems": problems, "ok": not problems}
    if args.json:
        json.dump(result, out, indent=1)
        out.write("\n")
    else:
        for line in problems:
            out.write(f"FAILED {line}\n")
        status = "OK" if not problems else f"FAILED ({len(problems)} problems)"
        out.write(f"{args.file}: {objects} objects, {digests} digests checked: {status}\n")
    return 0 if not problems else 1


def _refuse_overwrite(path, force):
    if os.path.exists(path) and not force:
        raise ZTensorError("exists; pass --force to replace it", path=path)


def cmd_convert(args, out):
    from ztensor import importers
    from ztensor.writer import Writer

    _refuse_overwrite(args.output, args.force)
    attributes, tensors = importers.open_any(args.input)
    progress = Progress(os.path.getsize(args.input), args.quiet)
    count = 0
    with Writer(args.output, attributes=attributes) as writer:
        for name, tensor in tensors:
            writer.write(name, tensor, compress=args.compress, checksum=args.checksum)
            progress.add(_nbytes(tensor))
            count += 1
    progress.finish()
    _report(args, out, {"input": args.input, "output": args.output, "objects": count})
    return 0


def cmd_dequantize(args, out):
    from ztensor.formats.quantized import dequantize
    from ztensor.tensor import Tensor
    from ztensor.writer import Writer

    _refuse_overwrite(args.output, args.force)
    dtype = {"float16": np.float16, "float32": np.float32, "bfloat16": "bfloat16"}[args.dtype]
    converted = 0
    with Reader(args.input) as reader, Writer(args.output,
                                              attributes=reader.attributes) as writer:
        progress = Progress(sum(reader.metadata(n).stored_size for n in reader), args.quiet)
        for name in reader.keys():
            obj = reader.read(name)
            if obj.format == "quantized_group":
                weight = dequantize(obj, dtype=dtype)
                types = {"data": "bf16"} if weight.dtype == np.uint16 else None
                obj = Tensor({"data": weight}, attributes=obj.attributes, types=types)
                converted += 1
            writer.write(name, obj)
            progress.add(reader.metadata(name).stored_size)
        progress.finish()
    _report(args, out, {"input": args.input, "output": args.output, "dequantized": converted})
    return 0


def cmd_diff(args, out):
    with Reader(args.a) as a, Reader(args.b) as b:
        names_a, names_b = set(a.keys()), set(b.keys())
        changes = [{"name": n, "change": "removed"} for n in sorted(names_a - names_b)]
        changes += [{"name": n, "change": "added"} for n in sorted(names_b - names_a)]
        for name in sorted(names_a & names_b):
            change = _compare(a, b, name)
            if change:
                changes.append({"name": name, "change": "changed", **change})
    if args.json:
        json.dump({"a": args.a, "b": args.b, "identical": not changes, "changes": changes},
                  out, indent=1)
        out.write("\n")
    else:
        for c in changes:
            mark = {"removed": "-", "added": "+", "changed": "~"}[c["change"]]
            detail = "; ".join(f"{k}: {v}" for k, v in c.items() if k not in ("name", "change"))
            out.write(f"{mark} {c['name']}" + (f"  ({detail})" if detail else "") + "\n")
        out.write("identical\n" if not changes else f"{len(changes)} differences\n")
    return 0 if not changes else 1


def _compare(a, b, name):
    ma, mb = a.metadata(name), b.metadata(name)
    for field in ("format", "shape", "dtype", "type"):
        if getattr(ma, field) != getattr(mb, field):
            return {field: f"{_plain(getattr(ma, field))} -> {_plain(getattr(mb, field))}"}
    ta, tb = a.read(name), b.read(name)
    for role in sorted(set(ta.components) | set(tb.components)):
        if role not in ta.components or role not in tb.components:
            return {"components": f"{sorted(ta.components)} -> {sorted(tb.components)}"}
        x, y = np.asarray(ta.components[role]), np.asarray(tb.components[role])
        if x.shape != y.shape or x.tobytes() != y.tobytes():
            return {role: _value_difference(x, y)}
    return None


def _value_difference(x, y):
    if x.shape != y.shape:
        return f"{x.size} -> {y.size} elements"
    if x.dtype.kind in "fc" and y.dtype.kind in "fc":
        with np.errstate(invalid="ignore"):
            differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
            worst = float(np.nanmax(np.abs(x.astype(np.complex128) - y))) if differ.any() else 0.0
        return f"{int(differ.sum())} of {x.size} values differ, max |difference| {worst:.6g}"
    return f"{int((x != y).sum())} of {x.size} values differ"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _report(args, out, summary):
    if args.json:
        json.dump(summary, out, indent=1)
        out.write("\n")
    elif not args.quiet:
        out.write(", ".join(f"{k}: {v}" for k, v in summary.items()) + "\n")


def _compress_level(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--compress takes a zstd level, not {text!r}") from None


COMMANDS = {
    "ls": (cmd_ls, "list the objects in a file", ["file"]),
    "info": (cmd_info, "summarize a file: version, attributes, counts, sizes", ["file"]),
    "verify": (cmd_verify, "check structure, decode every object, check every digest",
               ["file"]),
    "convert": (cmd_convert, "convert .safetensors/.npy/.npz/.zt to a .zt v1.2 file",
                ["input", "output"]),
    "dequantize": (cmd_dequantize, "write quantized_group objects as dense weights",
                   ["input", "output"]),
    "diff": (cmd_diff, "compare two files: objects added, removed, changed", ["a", "b"]),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ztensor", description="Inspect and convert zTensor "
                                     "(.zt) files.")
    parser.add_argument("--version", action="version", version=f"ztensor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text, positionals) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for positional in positionals:
            p.add_argument(positional)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--quiet", "-q", action="store_true", help="no progress, no summary")
        if name in ("convert", "dequantize"):
            p.add_argument("--force", action="store_true", help="replace an existing output")
        if name == "convert":
            p.add_argument("--compress", nargs="?", const=True, default=False,
                           type=_compress_level, metavar="LEVEL",
                           help="zstd-compress every component (default level 3)")
            p.add_argument("--checksum", choices=["crc32c", "sha256"])
        if name == "dequantize":
            p.add_argument("--dtype", choices=["float16", "float32", "bfloat16"],
                           default="float16")
    return parser


def main(argv=None, out=None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    handler = COMMANDS[args.command][0]
    try:
        if args.command in ("ls", "info"):
            with Reader(args.file) as reader:
                return handler(reader, args, out)
        return handler(args, out)
    except (ZTensorError, OSError) as exc:
        if isinstance(exc, ZTensorError):
            text = str(exc)
        else:
            text = f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")
        sys.stderr.write(f"ztensor: {text}\n")
        return 2
