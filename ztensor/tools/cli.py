"""The ``ztensor`` command.

``ztensor ls FILE``               one row per object: name, format, shape, dtype, encoding, size
``ztensor info FILE``             version, attributes, counts and total sizes
``ztensor verify FILE``           structure, every object decoded, every digest checked
``ztensor convert IN OUT``        any tensor file -> .zt v1.2 / .safetensors / .npz / .gguf;
                                 a checkpoint directory or index -> one such file (merged),
                                 or a directory of .zt (``--format safetensors``: HF) shards
                                 + index + the checkpoint's other files
``ztensor dequantize IN OUT``     quantized_group objects -> dense, others copied
``ztensor diff A B``              objects added, removed, changed; value differences
``ztensor stats FILE [NAME...]``  min/max/mean/std, NaN/Inf counts and a histogram per tensor

Bad input files print one line (``ztensor: <file>: <problem>``) and exit 2, never a
traceback.  ``verify`` and ``diff`` exit 1 when the file is broken / the files differ.
Output lost to a closed pipe is never success (``_status``: 141, or the 1 or 2 found).
Long work shows progress on a terminal (stderr), unless ``--quiet``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import signal
import struct
import sys
import time
import warnings
from typing import Callable, Dict, List, Tuple

import numpy as np

from ztensor import spec
from ztensor._native.contract import GGML_BLOCKS
from ztensor._version import __version__
from ztensor.container.reader import Reader
from ztensor.container.writer import Writer
from ztensor.errors import (
    LimitError,
    UnsupportedError,
    WriteError,
    ZTensorError,
    url_without_secrets,
    without_secrets,
)
from ztensor.foreign.export import FORMATS, data_bytes
from ztensor.formats.quantized import dequantize_read
from ztensor.sharded import is_checkpoint, open_sharded
from ztensor.tensor import Tensor
from ztensor.tools import convert_inputs
from ztensor.tools.convert import checkpoint_as_one, convert, require_room_for_zt
from ztensor.tools.stats import (
    DEFAULT_MAX_ELEMENTS,
    MAX_BINS,
    SUMMARISED_FORMATS,
    chunks,
    sparkline,
    tensor_stats,
)


def _printable(text) -> str:
    """A name from a file, safe to print: control characters and other
    non-printables (terminal escape sequences) are shown as escapes, never sent; a
    URL's credentials are shown as ``***`` (errors.without_secrets)."""
    text = without_secrets(str(text))
    if text.isprintable():
        return text
    return "".join(
        c
        if c.isprintable()
        else repr(c)[1:-1]
        if ord(c) > 0xFF or c in "\n\t\r"
        else f"\\x{ord(c):02x}"
        for c in text
    )


def _jsonable(value, depth=0):
    """Attribute values as valid JSON: bytes as hex strings, non-string keys as
    strings, NaN and infinities as strings, integers too long to print as a note."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 4000 else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value[:4096]).hex(), "length": len(value)}
    if depth > 80:
        return "<too deep>"
    if isinstance(value, dict):
        return {_json_key(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    return repr(value)


def _json_key(key):
    return key if isinstance(key, str) else str(_jsonable(key))


def _dump_json(value, out):
    json.dump(_jsonable(value), out, indent=1, allow_nan=False)
    out.write("\n")


def _type_label(obj) -> str:
    return f"{obj.storage_dtype}/{obj.type}" if obj.type else str(obj.storage_dtype)


def _encoding_label(obj) -> str:
    return ",".join(sorted({c.encoding for c in obj.components.values()})) or "-"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def cmd_ls(reader, args, out):
    sharded = reader.format == "sharded"  # a checkpoint: which shard holds each tensor
    rows = []
    for name in reader.keys():
        obj = reader.metadata(name)
        rows.append(
            {
                "name": name,
                "format": obj.format,
                "shape": list(obj.shape),
                "dtype": _type_label(obj),
                "encoding": _encoding_label(obj),
                "stored_bytes": obj.stored_size,
            }
        )
        if sharded:
            rows[-1]["shard"] = reader.file_of(name)
    if args.json:
        _dump_json(rows, out)
        return 0
    table = [
        ("NAME", "FORMAT", "SHAPE", "DTYPE", "ENCODING", "SIZE") + (("SHARD",) if sharded else ())
    ]
    table += [
        (
            _printable(r["name"]),
            _printable(r["format"]),
            "[" + ", ".join(map(str, r["shape"])) + "]",
            r["dtype"],
            r["encoding"],
            _human(r["stored_bytes"]),
        )
        + ((_printable(r["shard"]),) if sharded else ())
        for r in rows
    ]
    _write_table(table, out)
    return 0


def cmd_info(reader, args, out):
    formats, stored, decoded, digests = {}, 0, 0, 0
    undeclared = 0  # v0.1/v1.1 zstd parts of non-dense objects: no size, and not decoded
    for name in reader.keys():
        obj = reader.metadata(name)
        formats[obj.format] = formats.get(obj.format, 0) + 1
        for comp in obj.components.values():
            stored += comp.length
            if comp.decoded_length is None:
                undeclared += 1
            else:
                decoded += comp.decoded_length
            digests += comp.digest is not None
    info = {
        "file": url_without_secrets(reader.path),  # one URL whole: a space is its own
        "version": getattr(reader, "version", None),
        "format": reader.format,
        "objects": len(reader),
        "formats": formats,
        "stored_bytes": stored,
        # null when a part declares no size: the sum of the others would understate it
        "decoded_bytes": None if undeclared else decoded,
        "decoded_bytes_declared": decoded,
        "components_without_decoded_size": undeclared,
        "digests": digests,
        "attributes": reader.attributes,
    }
    if args.json:
        _dump_json(info, out)
        return 0
    # every line passes _printable whole: any field may come from the file (a
    # format name counted in "objects" printed its escape sequences raw)
    lines = [f"file:        {info['file']}", f"format:      {info['format']}"]
    if info["version"] is not None:
        lines.append(f"version:     {info['version']}")
    lines.append(
        f"objects:     {info['objects']}"
        + "".join(f"  {k}={v}" for k, v in sorted(formats.items()))
    )
    lines.append(f"stored:      {_human(stored)} ({stored} bytes)")
    if undeclared:
        lines.append(
            f"decoded:     not declared for {undeclared} zstd "
            f"component{'s' if undeclared > 1 else ''} (the others: {_human(decoded)}, "
            f"{decoded} bytes)"
        )
    else:
        lines.append(f"decoded:     {_human(decoded)} ({decoded} bytes)")
    lines.append(f"digests:     {digests}")
    lines.append("attributes:" + ("  (none)" if not reader.attributes else ""))
    for key, value in reader.attributes.items():
        text = json.dumps(_jsonable(value), allow_nan=False)
        if len(text) > 200:
            text = text[:197] + "..."
        lines.append(f"  {key}: {text}")
    for line in lines:
        out.write(_printable(line) + "\n")
    return 0


class Progress:
    """Progress of long work on stderr, only when it is a terminal and not ``--quiet``:
    a tqdm bar when tqdm is installed (``pip install ztensor[cli]``), else one plain
    line (``done / total, rate, time left``)."""

    def __init__(self, total, quiet, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done, self.start = max(total, 1), 0, time.monotonic()
        self.enabled = not quiet and self.stream.isatty()
        self.last = 0.0
        self.bar = None
        if self.enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(
                    total=self.total,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    file=self.stream,
                    leave=False,
                    dynamic_ncols=True,
                )

    def update(self, done, total):
        """The progress(bytes done, bytes total) callback the library calls."""
        self.total = max(total, 1)
        if self.bar is not None:
            self.bar.total = self.total
        self.add(done - self.done)

    def add(self, nbytes):
        self.done += nbytes
        if self.bar is not None:
            self.bar.update(nbytes)
            return
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.1:
            return
        self.last = now
        rate = self.done / max(now - self.start, 1e-9)
        left = (self.total - self.done) / rate if rate else 0
        self.stream.write(
            f"\r  {100 * self.done / self.total:5.1f}%  {_human(self.done)} / "
            f"{_human(self.total)}  {_human(rate)}/s  {left:5.0f} s left "
        )
        self.stream.flush()

    def finish(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self.stream.write("\r" + " " * 70 + "\r")


def _nbytes(tensor) -> int:
    return sum(getattr(a, "nbytes", 0) for a in tensor.components.values())


def _is_sharded(path):
    return is_checkpoint(path)


def _open_any(path):
    """A Reader, or a ShardedReader for a checkpoint directory or index file.  An
    OSError naming no file (``EIO`` reading ``/proc/self/mem``) is given ``path``:
    ``diff`` has two inputs, and its line must say which one failed."""
    try:
        if _is_sharded(path):
            return open_sharded(path)
        return Reader(path)
    except OSError as exc:
        if not exc.filename and not isinstance(exc, ZTensorError):
            exc.filename = path
        raise


def cmd_verify(args, out):
    """Every problem one line (``FAILED ...``), then a summary; exit 1 when there is
    any.  A file (or index) that cannot be opened at all is an error: exit 2.  The
    checks are the library's own: Reader.verify / ShardedReader.verify."""
    problems = []
    if _is_sharded(args.file):  # every shard, and the index against the shards
        with open_sharded(args.file) as shards:
            objects, version = len(shards), None
            where = f" in {len(shards.shards)} shards"
            progress = Progress(0, args.quiet)
            digests = shards.verify(progress.update, errors=problems)
            progress.finish()
            path = shards.path
    else:
        with Reader(args.file) as reader:
            objects, version, path = len(reader), reader.version, reader.path
            where = ""
            progress = Progress(0, args.quiet)
            digests = reader.verify(progress.update, errors=problems)
            progress.finish()
    lines = [str(exc) for exc in problems]
    if args.json:
        _dump_json(
            {
                "file": url_without_secrets(path),
                "version": version,
                "objects": objects,
                "digests_checked": digests,
                "problems": lines,
                "ok": not lines,
            },
            out,
        )
    else:
        for line in lines:
            out.write(f"FAILED {_printable(line)}\n")
        status = "OK" if not lines else f"FAILED ({len(lines)} problems)"
        out.write(
            f"{_printable(url_without_secrets(args.file))}: {objects} objects{where}, "
            f"{digests} digests checked: {status}\n"
        )
    return 0 if not lines else 1


def cmd_stats(reader, args, out):

    names = args.names or reader.keys()
    # asked by name, an object of another format is an error; over the whole file it
    # is skipped and said (a valid file holding one exited 2)
    skipped = [] if args.names else _without_statistics(reader, names)
    left_out = {s["name"] for s in skipped}  # once: per name it was quadratic
    rows = []
    for name in names:
        if name in left_out:
            continue
        try:
            rows.append(tensor_stats(reader, name, bins=args.bins, max_elements=args.max_elements))
        except UnsupportedError:
            # a valid object this version cannot decode (a GGUF type kept as raw
            # blocks, a quantized_group of another convention): over the whole file,
            # skipped and said as the formats above are; asked by name, an error
            if args.names:
                raise
            skipped.append({"name": name, "format": reader.metadata(name).format})
    flagged = [r["name"] for r in rows if r["nan"] or r["posinf"] or r["neginf"]]
    if args.json:
        _dump_json({"tensors": rows, "with_nan_or_inf": flagged, "skipped": skipped}, out)
    else:

        def num(v):
            return "-" if v is None else f"{v:.4g}"

        table = [("NAME", "MIN", "MAX", "MEAN", "STD", "NAN", "INF", "HISTOGRAM")]
        table += [
            (
                _printable(r["name"]),
                num(r["min"]),
                num(r["max"]),
                num(r["mean"]),
                num(r["std"]),
                str(r["nan"]),
                str(r["posinf"] + r["neginf"]),
                sparkline(r["histogram"]),
            )
            for r in rows
        ]
        _write_table(table, out)
        if not args.quiet:
            out.write(f"{len(rows)} tensors, {len(flagged)} with NaN or Inf\n")
            if skipped:
                shown = ", ".join(
                    f"{_printable(s['name'])} ({_printable(s['format'])})" for s in skipped[:5]
                )
                more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
                out.write(
                    f"skipped {len(skipped)} objects without statistics here: {shown}{more}\n"
                )
    return 1 if args.check and flagged else 0


def _without_statistics(reader, names):
    """[{name, format}] of the objects no statistics are taken of (their format is
    not in stats.SUMMARISED_FORMATS)."""
    found = []
    for name in names:
        fmt = reader.metadata(name).format
        if fmt not in SUMMARISED_FORMATS:
            found.append({"name": name, "format": fmt})
    return found


def _write_table(table, out):
    """Rows of cells, columns padded.  On a terminal too narrow for them, the first
    column (names, the longest as a rule) is shortened to fit, down to 12 characters,
    by :func:`shorten_distinct`, so distinct names never print alike; piped output
    is never cut.  Every cell is made printable here, the one place a table reaches
    the terminal: any cell may come from the file (a name, a format, a component's
    ``type``, which is an open set)."""
    table = [tuple(_printable(cell) for cell in row) for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        import shutil

        room = shutil.get_terminal_size().columns - sum(widths[1:]) - 2 * (len(widths) - 1)
        if room < widths[0]:
            names = shorten_distinct([row[0] for row in table[1:]], max(12, room))
            table = [table[0]] + [(name,) + tuple(row[1:]) for name, row in zip(names, table[1:])]
            widths[0] = max(len(row[0]) for row in table)
    for row in table:
        out.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


ELLIPSIS = "\u2026"


def shorten_distinct(texts, width):
    """``texts`` (names as printed) shortened to at most ``width`` characters each,
    an ellipsis standing for each hidden stretch, such that texts that differ stay
    different: the one rule for every table of names (``ls``, ``stats``).

    Each text longer than ``width`` tries, in turn: the middle elided (the plain
    form); the parts that tell it from its nearest names kept (the first character
    where it differs from its closest name by prefix, the last where it differs
    from its closest name by suffix, each with what surrounds it, and its end).  A
    form is taken only when no other text still choosing has it and none has been
    given out.  What is left (and a text printed twice: two names that print alike)
    gets its kept-parts form with a counter, ``#2``, the first that is free.
    Texts that fit are printed whole."""
    width = max(width, 4)
    out = [None] * len(texts)
    taken = set()
    seen_whole = set()
    pending = []
    for i, text in enumerate(texts):
        if len(text) <= width and text not in seen_whole:
            out[i] = text
            seen_whole.add(text)
            taken.add(text)
        else:
            pending.append(i)
    if not pending:
        return out
    keys = _key_positions(texts)
    for form in (lambda i: _middle(texts[i], width), lambda i: _keep(texts[i], width, keys[i])):
        if not pending:
            break
        cands = {i: form(i) for i in pending}
        counts = {}
        for c in cands.values():
            counts[c] = counts.get(c, 0) + 1
        left = []
        for i in pending:
            c = cands[i]
            if c is not None and counts[c] == 1 and c not in taken:
                out[i] = c
                taken.add(c)
            else:
                left.append(i)
        pending = left
    # the first free counter per (kept form, mark length): every smaller counter of
    # that form was found taken by the text that chose the last one (``taken`` only
    # grows), so the search starts there.  Trying from 2 each time made names sharing
    # a form quadratic: 1,000 such names held `ls` on a terminal for 38 s.
    counters: Dict[Tuple[str, int], int] = {}
    for i in pending:
        n = 2
        while True:
            size = len(f"#{n}")
            base = _keep(texts[i], max(width - size, 2), keys[i])
            n = max(n, counters.get((base, size), 2))
            if len(f"#{n}") != size:
                continue  # the jump reached longer marks: their own kept form
            while len(f"#{n}") == size and base + f"#{n}" in taken:
                n += 1
            if len(f"#{n}") == size:
                break
        c = base + f"#{n}"
        counters[(base, size)] = n + 1
        out[i] = c
        taken.add(c)
    return out


def _middle(text, width):
    """The plain form: the middle elided (None when the text is no longer than
    ``width``: a text printed twice gets no plain form)."""
    if len(text) <= width:
        return None
    keep = width - 1
    return text[: keep - keep // 2] + ELLIPSIS + text[len(text) - keep // 2 :]


def _key_positions(texts):
    """Per text, the positions that tell it from the others: the first character
    where it differs from its closest text by prefix (its neighbours in sorted
    order: no other text shares a longer prefix), and the last where it differs
    from its closest text by suffix (neighbours in order of the reversed texts)."""

    def closest(order, key):
        found = [0] * len(texts)
        for j, i in enumerate(order):
            best = 0
            for k in (j - 1, j + 1):
                if 0 <= k < len(order):
                    a, b = key(i), key(order[k])
                    n = 0
                    limit = min(len(a), len(b))
                    while n < limit and a[n] == b[n]:
                        n += 1
                    best = max(best, n)
            found[i] = best
        return found

    by_prefix = closest(sorted(range(len(texts)), key=lambda i: texts[i]), lambda i: texts[i])
    by_suffix = closest(
        sorted(range(len(texts)), key=lambda i: texts[i][::-1]), lambda i: texts[i][::-1]
    )
    out = []
    for i, text in enumerate(texts):
        last = max(len(text) - 1, 0)
        out.append((min(by_prefix[i], last), max(min(last - by_suffix[i], last), 0)))
    return out


def _keep(text, width, keys):
    """``text`` in at most ``width`` characters keeping the ``keys`` positions and as
    much as fits around them and at its end; each hidden stretch is one ellipsis."""
    n = len(text)
    if n <= width:
        return text
    shown = [False] * n
    length = 1  # one hidden stretch: the whole text

    def order():
        yield from keys
        # the end (".weight" / ".bias") and the surroundings of each key in turn,
        # then the start: a name's head is what its neighbours share most often
        tail = iter(range(n - 1, -1, -1))
        streams = [tail] + [_outward(k, n) for k in keys]
        while streams:
            for stream in list(streams):
                item = next(stream, None)
                if item is None:
                    streams.remove(stream)
                else:
                    yield item
        yield from range(n)

    for i in order():
        if shown[i]:
            continue
        left = i > 0 and not shown[i - 1]
        right = i < n - 1 and not shown[i + 1]
        delta = 1 + (1 if left and right else -1 if not left and not right else 0)
        if length + delta <= width:
            shown[i] = True
            length += delta
    parts, hidden = [], False
    for i, c in enumerate(text):
        if shown[i]:
            parts.append(c)
            hidden = False
        elif not hidden:
            parts.append(ELLIPSIS)
            hidden = True
    return "".join(parts)


def _outward(k, n):
    for d in range(1, n):
        if k + d < n:
            yield k + d
        if k - d >= 0:
            yield k - d


def _refuse_overwrite(path, force):
    if os.path.exists(path) and not force:
        raise ZTensorError("exists; pass --force to replace it", path=path)


def cmd_convert(args, out):

    progress = Progress(0, args.quiet)
    count = convert(
        args.input,
        args.output,
        compress=args.compress,
        checksum=args.checksum,
        force=args.force,
        progress=progress.update,
        format=args.format,
        drop_attributes=args.drop_attributes,
    )
    progress.finish()
    _report(args, out, {"input": args.input, "output": args.output, "objects": count})
    return 0


def cmd_dequantize(args, out):

    # it wrote a .zt file under any name (out.safetensors began with ZTEN1000)
    if FORMATS.get(os.path.splitext(args.output)[1].lower()) != "zt":
        raise UnsupportedError(
            "dequantize writes a .zt file: name the output *.zt, then "
            "`ztensor convert` it to another format",
            path=args.output,
        )
    _refuse_overwrite(args.output, args.force)
    dtype = {"float16": np.float16, "float32": np.float32, "bfloat16": "bfloat16"}[args.dtype]
    converted = 0
    # digests checked as it reads; a checkpoint's shards are merged into the output
    if is_checkpoint(args.input):
        opened = checkpoint_as_one(args.input, args.output)
    else:
        opened = convert_inputs.input_reader(args.input)
    with opened as reader:
        require_room_for_zt(reader, args.output, False, _dequantized_bytes(reader, dtype))
        with Writer(args.output, attributes=reader.attributes) as writer:
            converted = _dequantize_into(writer, reader, args, dtype)
    _report(args, out, {"input": args.input, "output": args.output, "dequantized": converted})
    return 0


def _dequantized_bytes(reader, dtype):
    """What dequantize writes of ``reader``: each object it decodes as ``dtype``
    elements of its shape, every other one as the bytes it holds decoded."""
    size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
    total = 0
    for name in reader.keys():
        spec = reader.metadata(name)
        decoded = spec.format == "quantized_group" or (
            spec.format == "gguf_blocks" and spec.attributes.get("ggml_type_id") in GGML_BLOCKS
        )
        total += math.prod(spec.shape) * size if decoded else data_bytes(reader, [name])
    return total


def _dequantize_into(writer, reader, args, dtype):
    """Every object of ``reader`` into ``writer``, the quantized ones decoded as
    ``dtype``; returns how many were decoded."""
    converted = 0
    progress = Progress(sum(reader.metadata(n).stored_size for n in reader.keys()), args.quiet)
    for name in reader.keys():
        obj = reader.read(name)
        if obj.format == "quantized_group" or (obj.format == "gguf_blocks" and _decodable(obj)):
            weight = dequantize_read(obj, args.input, name, dtype=dtype)
            types = {"data": "bf16"} if weight.dtype == np.uint16 else None
            obj = Tensor({"data": weight}, attributes=obj.attributes, types=types)
            converted += 1
        writer.write(name, obj)
        progress.add(reader.metadata(name).stored_size)
    progress.finish()
    return converted


def _decodable(obj):
    return obj.attributes.get("ggml_type_id") in GGML_BLOCKS


def cmd_diff(args, out):
    # a checkpoint directory or index on either side, as ls, info, stats and verify
    # take one (it was "open a checkpoint directory with ztensor.open_sharded")
    with _open_any(args.a) as a, _open_any(args.b) as b:
        names_a, names_b = set(a.keys()), set(b.keys())
        changes = [{"name": n, "change": "removed"} for n in sorted(names_a - names_b)]
        changes += [{"name": n, "change": "added"} for n in sorted(names_b - names_a)]
        for name in sorted(names_a & names_b):
            change = _compare(a, b, name, args.max_elements)
            if change:
                changes.append({"name": name, "change": "changed", **change})
        if not _same(a.attributes, b.attributes):
            changes.insert(
                0,
                {
                    "name": "(file attributes)",
                    "change": "changed",
                    "attributes": _attribute_difference(a.attributes, b.attributes),
                },
            )
    if args.json:
        _dump_json(
            {
                "a": url_without_secrets(args.a),
                "b": url_without_secrets(args.b),
                "identical": not changes,
                "changes": changes,
            },
            out,
        )
    else:
        for c in changes:
            mark = {"removed": "-", "added": "+", "changed": "~"}[c["change"]]
            detail = "; ".join(f"{k}: {v}" for k, v in c.items() if k not in ("name", "change"))
            out.write(
                f"{mark} {_printable(c['name'])}"
                + (f"  ({_printable(detail)})" if detail else "")
                + "\n"
            )
        out.write("identical\n" if not changes else f"{len(changes)} differences\n")
    return 0 if not changes else 1


def _compare(a, b, name, max_elements):
    ma, mb = a.metadata(name), b.metadata(name)
    for field in ("format", "shape", "dtype", "type"):
        if getattr(ma, field) != getattr(mb, field):
            return {field: f"{_plain(getattr(ma, field))} -> {_plain(getattr(mb, field))}"}
    if not _same(ma.attributes, mb.attributes):  # quantization parameters live here
        return {"attributes": _attribute_difference(ma.attributes, mb.attributes)}
    ta, tb = a.read(name), b.read(name)
    for role in sorted(set(ta.components) | set(tb.components)):
        if role not in ta.components or role not in tb.components:
            return {"components": f"{sorted(ta.components)} -> {sorted(tb.components)}"}
        x, y = np.asarray(ta.components[role]), np.asarray(tb.components[role])
        if x.shape != y.shape or x.dtype != y.dtype:
            return {role: f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}"}
        difference = _value_difference(x, y, max_elements, name, a.path)
        if difference:
            return {role: difference}
    return None


def _same(x, y) -> bool:
    """Whether two attribute values are the same stored value: ``==`` said a NaN
    differs from itself (``ztensor diff f.zt f.zt`` reported a file holding a NaN
    attribute as changed), and that ``True`` is ``1`` and ``1`` is ``1.0``, which a
    file stores as different values.  Floats are the same when their bits are (a
    NaN is its own, ``-0.0`` is not ``0.0``)."""
    if type(x) is not type(y):
        kinds = (bool, int, float, str, bytes, list, dict)
        if not any(isinstance(x, k) and isinstance(y, k) for k in kinds) or (
            isinstance(x, bool) != isinstance(y, bool)
        ):
            return False
    if isinstance(x, float):
        return struct.pack("<d", x) == struct.pack("<d", y) or (x != x and y != y)
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x == y


def _attribute_difference(x, y):
    keys = sorted(set(x) | set(y), key=str)
    changed = [k for k in keys if k not in x or k not in y or not _same(x[k], y[k])]
    return (
        "changed keys: "
        + ", ".join(_printable(k) for k in changed[:10])
        + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
    )


_DIFF_CHUNK = 1 << 18  # elements per step: a few MiB of scratch whatever the size


def _value_difference(x, y, max_elements, name, path):
    """None when the stored elements are identical bit for bit, else a summary.
    Walks both arrays in chunks: peak memory is a few chunks, not copies of both.
    Axes that repeat one element in both (stride 0: torch's expand) are compared
    once; more than ``max_elements`` distinct elements is a LimitError (stats.py)
    naming ``path`` (the first file) and the object: it named the object alone."""

    total = x.size
    repeat = 1
    index = []
    for size, sx, sy in zip(x.shape, x.strides, y.strides):
        both = sx == 0 and sy == 0 and size > 1
        repeat *= size if both else 1
        index.append(slice(0, 1) if both else slice(None))
    x, y = x[tuple(index)], y[tuple(index)]
    if x.size > max_elements:
        raise LimitError(
            f"{x.size} elements to compare, more than the limit of "
            f"{max_elements}: raise it with --max-elements N",
            path=path,
            obj=name,
        )
    floating = x.dtype.kind in "fc" or x.dtype.name in ("bfloat16",) or "float8" in x.dtype.name
    differ, worst = 0, 0.0
    for xs, ys in zip(chunks(x, _DIFF_CHUNK), chunks(y, _DIFF_CHUNK)):
        if (
            xs.view(np.uint8).tobytes() == ys.view(np.uint8).tobytes()
            if xs.dtype.itemsize
            else True
        ):
            continue
        if floating:
            xf, yf = (
                xs.astype(np.complex128 if x.dtype.kind == "c" else np.float64),
                ys.astype(np.complex128 if x.dtype.kind == "c" else np.float64),
            )
            with np.errstate(invalid="ignore", over="ignore"):
                bad = ~((xf == yf) | (np.isnan(xf) & np.isnan(yf)))
                if bad.any():
                    worst = max(worst, float(np.nanmax(np.abs(xf[bad] - yf[bad]))))
        else:
            bad = xs != ys
        differ += int(np.count_nonzero(bad)) * repeat
    if not differ:
        return None
    if floating:
        return f"{differ} of {total} values differ, max |difference| {worst:.6g}"
    return f"{differ} of {total} values differ"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _report(args, out, summary):
    # its paths are the caller's, each one URL whole (a space in a query is its own)
    summary = {k: url_without_secrets(v) if isinstance(v, str) else v for k, v in summary.items()}
    if args.json:
        _dump_json(summary, out)
    elif not args.quiet:
        # paths are input too (a downloaded folder, a glob): never a raw escape
        out.write(", ".join(f"{k}: {_printable(v)}" for k, v in summary.items()) + "\n")


def _compress_level(text):
    """A zstd level for ``--compress=LEVEL`` / ``--level``: the Writer's range
    (``spec.MIN_ZSTD_LEVEL`` to ``spec.MAX_ZSTD_LEVEL``), never 0, which the Writer
    takes as "raw" (zstd as "its default"): an out-of-range level printed the
    Writer's ``ValueError`` after the output file was begun."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value == 0 or not spec.MIN_ZSTD_LEVEL <= value <= spec.MAX_ZSTD_LEVEL:
        # argparse names --level, where --compress=LEVEL is sent: both are said
        raise argparse.ArgumentTypeError(
            f"the zstd level (--level LEVEL or --compress=LEVEL) is an integer from "
            f"{spec.MIN_ZSTD_LEVEL} to {spec.MAX_ZSTD_LEVEL} other than 0 (1 to 19 as a "
            f"rule; the default is {spec.DEFAULT_ZSTD_LEVEL}), got {text!r}"
        )
    return value


# name -> (handler returning the exit code, help, positional arguments)
COMMANDS: Dict[str, Tuple[Callable[..., int], str, List[str]]] = {
    "ls": (cmd_ls, "list the objects in a file", ["file"]),
    "info": (cmd_info, "summarize a file: version, attributes, counts, sizes", ["file"]),
    "verify": (cmd_verify, "check structure, decode every object, check every digest", ["file"]),
    "convert": (
        cmd_convert,
        "convert any tensor file to the format OUT's name says "
        "(.zt v1.2, .safetensors, .npz, .gguf)",
        ["input", "output"],
    ),
    "dequantize": (
        cmd_dequantize,
        "write quantized_group objects as dense weights",
        ["input", "output"],
    ),
    "diff": (cmd_diff, "compare two files: objects added, removed, changed", ["a", "b"]),
    "stats": (
        cmd_stats,
        "value statistics per tensor: min/max/mean/std, NaN/Inf, histogram",
        ["file"],
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its usage errors one line as every other error is
    (``ztensor convert: error: argument --level: ...``, pointing at ``--help``),
    not the usage block and then the line; what the user typed in it is shown with
    escapes (``_printable``): an unrecognized argument was echoed raw."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_printable(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ztensor", description="Inspect and convert zTensor (.zt) files.")
    parser.add_argument(
        "--version",
        action="version",
        version=f"ztensor {__version__} (writes zTensor {spec.WRITE_VERSION}; "
        "reads v2, v1.2, v1.1, v0.1)",
    )
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
            p.add_argument(
                "--drop-attributes",
                action="store_true",
                help="write .safetensors/.npz/.gguf without the attributes they cannot hold "
                "(refused otherwise)",
            )
            p.add_argument(
                "--compress",
                action="store_true",
                help="zstd-compress every component (level 3, or --level)",
            )
            p.add_argument(
                "--level",
                type=_compress_level,
                default=None,
                metavar="LEVEL",
                help="the zstd level for --compress (also --compress=LEVEL)",
            )
            p.add_argument("--checksum", choices=["crc32c", "sha256"])
            p.add_argument(
                "--format",
                choices=["zt", "safetensors"],
                default=None,
                help="the shard format of a checkpoint converted into a "
                "directory (default zt; safetensors: Hugging Face's names and "
                "index); a file output's name says its format",
            )
        if name in ("stats", "diff"):
            p.add_argument(
                "--max-elements",
                type=_count,
                default=DEFAULT_MAX_ELEMENTS,
                metavar="N",
                help="refuse a tensor with more than N distinct "
                f"elements to walk (default {DEFAULT_MAX_ELEMENTS}; elements a "
                "stride-0 view repeats count once)",
            )
        if name == "stats":
            p.add_argument("names", nargs="*", metavar="NAME", help="tensors (default: all)")
            p.add_argument("--bins", type=_positive, default=10, help="histogram bins (default 10)")
            p.add_argument(
                "--check", action="store_true", help="exit 1 when any tensor holds NaN or Inf"
            )
        if name == "dequantize":
            p.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16")
    return parser


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BINS:  # stats.check_bins's rule, said as argparse says it
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {MAX_BINS}, got {text!r}"
        )
    return value


def _count(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def _split_compress_level(argv):
    """``--compress=5`` -> ``--compress --level 5``: a bare ``--compress`` takes no
    value, so ``convert --compress IN OUT`` never mistakes IN for a level."""
    out = []
    for arg in argv:
        if arg.startswith("--compress="):
            out += ["--compress", "--level", arg.split("=", 1)[1]]
        else:
            out.append(arg)
    return out


def main(argv=None, out=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(_split_compress_level(argv))
    if getattr(args, "level", None) is not None:  # a level implies --compress
        args.compress = args.level
    output = _Output(sys.stdout if out is None else out)
    # Python's warnings (a GGUF type this version does not know, numpy's) are never
    # printed as they come, file:line and source over three lines: an error prints
    # its one line alone; a success folds them into one "warning:" line, which
    # --quiet drops too (docs/cli.md)
    with warnings.catch_warnings(record=True) as caught, _terminate_as_interrupt():
        code = _run(args, output)
    if output.failed and output.stream is sys.stdout:
        # what the closed stdout still buffers would be written again at exit, and
        # Python would print "Exception ignored ... BrokenPipeError" and exit 120
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if caught and code != 2 and not args.quiet:
        first = str(caught[0].message)
        more = f" (and {len(caught) - 1} more)" if len(caught) > 1 else ""
        _say(f"warning: {_printable(first[:500])}{more}")
    return _status(code, output.lost)


# the status of a command whose reader closed the pipe before it had all the output
# (``ztensor ls f.zt | head -1``): 128 + SIGPIPE, what a shell reports for a tool
# the signal ended (``cat``, ``ls``, GNU ``diff``: 141 under ``set -o pipefail``)
CLOSED_PIPE_STATUS = 128 + 13


def _status(code: int, lost: bool) -> int:
    """The exit status of a command that returned ``code``, ``lost`` when the pipe
    it wrote to closed before all its output was written: output lost is never
    success, so 0 becomes ``CLOSED_PIPE_STATUS``; an answer the command had already
    found (1: ``diff``'s "they differ", ``verify``'s "broken", ``stats --check``'s
    NaN) or an error (2) is kept, so a script still learns it.  The one rule for
    every subcommand (``ls``, ``info``, ``stats``, ``diff``, ``verify``, the
    summaries of ``convert`` and ``dequantize``).  ``ztensor diff A B | head -1``
    exited 0 for files that differ."""
    return CLOSED_PIPE_STATUS if lost and code == 0 else code


def _say(line: str) -> None:
    """``ztensor: <line>`` on stderr; a stderr that is closed too (``2>&1 | head``)
    takes nothing, quietly: the status says the rest."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(f"ztensor: {line}\n")
        sys.stderr.flush()


class _Output:
    """What every command writes its output through, ``stream`` (stdout) behind it.

    * A closed pipe (``ztensor diff A B | head -1``: ``BrokenPipeError``) sets
      ``lost``, and what follows is dropped: the command finishes its answer (its
      work is done before it writes) and ``_status`` turns it into the exit status.
    * Any other failure to write (``> /dev/full``: no space; stdout closed, ``>&-``)
      is a :class:`WriteError` naming ``<stdout>``: one line, exit 2, never the
      silent "Exception ignored" Python prints at exit.
    * Only what the stream's encoding holds is written: a character it cannot (the
      histogram's blocks, the ellipsis of a shortened name, a name's CJK, on an
      ASCII or cp1252 stream: ``PYTHONIOENCODING``, a Windows redirect) is written
      as its backslash escape.  Without it ``stats`` printed its header, then
      stopped on ``UnicodeEncodeError``, exit 2."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self._encoding = getattr(stream, "encoding", None)
        self.lost = False  # the reader closed the pipe: output was dropped
        self.failed = False  # any write or flush failed (lost, or an error raised)

    def write(self, text: str) -> int:
        if self.lost:
            return len(text)
        if self._encoding:
            try:
                text.encode(self._encoding)
            except UnicodeEncodeError:
                text = text.encode(self._encoding, "backslashreplace").decode(self._encoding)
            except LookupError:  # an encoding Python does not know: the stream's to say
                pass
        self._call("write", text)
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            self._call("flush")

    def _call(self, method, *args):
        try:
            if self.stream is None:  # Python's sys.stdout when fd 1 was closed
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            getattr(self.stream, method)(*args)
        except BrokenPipeError:
            self.lost = self.failed = True
        except OSError as exc:
            self.failed = True
            raise WriteError(
                f"cannot write the output: {exc.strerror or exc}", errno=exc.errno, path="<stdout>"
            ) from None
        except ValueError as exc:  # a stream already closed
            self.failed = True
            raise WriteError(f"cannot write the output: {exc}", path="<stdout>") from None

    def isatty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        try:
            return bool(isatty is not None and isatty())
        except (OSError, ValueError):
            return False


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``kill``, a job scheduler) or SIGHUP (the terminal or
    ssh session closed) raised in the main thread: a BaseException, as Ctrl-C's, so
    every writer's cleanup runs (atomic.py removes its temporary file) and no
    ``except Exception`` on the way swallows it.  ``signum`` is the signal's."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# the signals that end a command as Ctrl-C does -> the one line it prints
_ENDING_SIGNALS = {"SIGTERM": "terminated", "SIGHUP": "hung up"}


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a command runs, SIGTERM and SIGHUP end it the way Ctrl-C does, cleaning
    up; by default Python dies at once and leaves a convert's temporary file behind
    (gigabytes, for a large model).  A signal the caller ignores (``nohup`` ignores
    SIGHUP) stays ignored."""

    def terminated(signum, frame):
        raise _Terminated(signum)

    previous = {}
    try:
        for name in _ENDING_SIGNALS:
            number = getattr(signal, name, None)
            if number is None or signal.getsignal(number) == signal.SIG_IGN:
                continue
            previous[number] = signal.signal(number, terminated)
    except (ValueError, OSError):  # not the main thread
        pass
    try:
        yield
    finally:
        for number, handler in previous.items():
            # None: a handler installed outside Python, which cannot be put back;
            # the default is the nearest thing Python can restore
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def _run(args, out) -> int:
    handler = COMMANDS[args.command][0]
    try:
        if args.command in ("ls", "info", "stats"):
            with _open_any(args.file) as reader:
                code = handler(reader, args, out)
        else:
            code = handler(args, out)
        out.flush()  # a write error of what is still buffered is this command's too
        return code
    except _Terminated as exc:
        word = _ENDING_SIGNALS.get(signal.Signals(exc.signum).name, "terminated")
        _say(word)  # after a hangup the terminal may be gone: the status says it all
        return 128 + exc.signum  # the shell's status: 143 for SIGTERM, 129 for SIGHUP
    except KeyboardInterrupt:
        # Ctrl-C: one line and the shell's status for SIGINT (128 + 2), no traceback;
        # convert and every writer have already removed what they had begun
        _say("interrupted")
        return 130
    except (ZTensorError, OSError) as exc:
        if isinstance(exc, ZTensorError):
            text = str(exc)
        else:
            # the OS names no file for some failures (an EIO while reading, an empty
            # name): a command of one input names that input, so the line says which
            # (convert and dequantize too: what they write fails as a WriteError
            # naming the output)
            name = exc.filename
            if not name:  # None or '' (diff's own '' is kept: it names the file)
                name = getattr(args, "file", getattr(args, "input", name))
            label = "" if name is None else os.fsdecode(name) or "''"
            text = f"{label}: {exc.strerror or exc}".lstrip(": ")
        _say(_printable(text))
        return 2
    except (
        ValueError,
        TypeError,
        RecursionError,
        MemoryError,
        UnicodeError,
        ArithmeticError,
        LookupError,
    ) as exc:
        # never a traceback: a problem no check above named still gets one line
        _say(f"{_printable(type(exc).__name__)}: {_printable(str(exc)[:500])}")
        return 2
