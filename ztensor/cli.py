"""The ``ztensor`` command: look inside .zt files.

``ztensor ls FILE``    one row per object: name, format, shape, dtype/type, encoding, size
``ztensor info FILE``  version, attributes, counts and total sizes

Bad input files print one line (``ztensor: <file>: <problem>``) and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

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


COMMANDS = {"ls": (cmd_ls, "list the objects in a file"),
            "info": (cmd_info, "summarize a file: version, attributes, counts, sizes")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ztensor", description="Inspect zTensor (.zt) files.")
    parser.add_argument("--version", action="version", version=f"ztensor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("file")
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def main(argv=None, out=None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    handler = COMMANDS[args.command][0]
    try:
        with Reader(args.file) as reader:
            return handler(reader, args, out)
    except (ZTensorError, OSError) as exc:
        text = str(exc) if isinstance(exc, ZTensorError) else f"{args.file}: {exc.strerror or exc}"
        sys.stderr.write(f"ztensor: {text}\n")
        return 2
