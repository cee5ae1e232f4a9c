"""zstd components as independent frames with a seek table: slices decode only the
frames they touch.

The layout is zstd's "seekable format" (contrib/seekable_format in the zstd
repository), so the bytes stay one valid zstd stream for every other reader:

* the data cut into frames of ``FRAME_BYTES`` decoded bytes, each an ordinary zstd
  frame that declares its content size;
* then a skippable frame (magic ``0x184D2A5E``, which every zstd decoder skips)
  holding the seek table: per frame its compressed and decompressed size (u32 LE
  each; no per-frame checksums: the component's digest covers the stored bytes),
  then the 9-byte footer: frame count (u32), descriptor byte (0), seekable magic
  ``0x8F92EAB1``.

A component of one frame or less is written as a plain single frame: there is
nothing to seek.  Writers compress full frames in parallel threads (zstandard
releases the GIL), in order.

Reading trusts nothing in the table: it must lie inside the component, its sizes
must add up to the component's stored length and to its ``uncompressed_length``,
and its length is bounded by the bytes present (8 bytes per frame), so parsing is
proportional to what the file holds.  Each decoded frame must yield exactly its
declared size (zstd_stream.zstd_decode).  A table that does not add up is a
FormatError naming the component; data written without one is decoded whole, once
per safe_open handle.
"""

from __future__ import annotations

import bisect
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import zstandard

from ztensor import kernels
from ztensor.errors import FormatError
from ztensor.io import zstd_stream

FRAME_BYTES = 1 << 20  # decoded bytes per frame
SKIPPABLE_MAGIC = 0x184D2A5E  # the seek table's skippable frame
SEEKABLE_MAGIC = 0x8F92EAB1  # the last 4 bytes of a seekable stream
_FOOTER = 9  # frame count u32, descriptor u8, magic u32
_ENTRY = 8  # compressed size u32, decompressed size u32
_CHECKSUM_FLAG = 0x80  # entries carry a 4-byte checksum (others' writers)


class FrameWriter:
    """Compresses bytes fed in order into independent frames; :meth:`finish`
    returns the last frame and the seek table.  Holds at most one frame of input."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.sizes: List[Tuple[int, int]] = []  # (compressed, decompressed) per frame
        self._pending = bytearray()
        self._threads = min(8, kernels.cpu_threads())

    def write(self, chunk) -> List[bytes]:
        """Frames completed by ``chunk``, in order."""
        view = memoryview(chunk).cast("B")
        out: List[bytes] = []
        if self._pending:
            take = min(FRAME_BYTES - len(self._pending), len(view))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < FRAME_BYTES:
                return out
            out.append(self._frame(self._pending))
            self._pending = bytearray()
        whole = len(view) - len(view) % FRAME_BYTES
        if whole:
            out.extend(self._frames(view[:whole]))
        self._pending += view[whole:]
        return out

    def finish(self) -> List[bytes]:
        """The last frame, then the seek table when there is more than one frame."""
        out = []
        if self._pending or not self.sizes:
            out.append(self._frame(self._pending))
            self._pending = bytearray()
        if len(self.sizes) > 1:
            out.append(seek_table(self.sizes))
        return out

    def _frame(self, data) -> bytes:
        frame = zstandard.ZstdCompressor(level=self.level).compress(data)
        self.sizes.append((len(frame), len(data)))
        return frame

    def _frames(self, view) -> List[bytes]:
        parts = [view[i : i + FRAME_BYTES] for i in range(0, len(view), FRAME_BYTES)]
        if len(parts) == 1 or self._threads == 1:
            return [self._frame(p) for p in parts]

        def compress(part):  # one compressor per call: they are not thread-safe
            return zstandard.ZstdCompressor(level=self.level).compress(part)

        with ThreadPoolExecutor(self._threads) as pool:
            frames = list(pool.map(compress, parts))
        self.sizes.extend((len(f), len(p)) for f, p in zip(frames, parts))
        return frames


def seek_table(sizes: List[Tuple[int, int]]) -> bytes:
    """The skippable frame holding the seek table for frames of ``sizes``."""
    body = b"".join(struct.pack("<II", c, d) for c, d in sizes)
    body += struct.pack("<IBI", len(sizes), 0, SEEKABLE_MAGIC)
    return struct.pack("<II", SKIPPABLE_MAGIC, len(body)) + body


class SeekTable:
    """Frame offsets of one component: ``starts[i]`` is frame i's first decoded
    byte, ``offsets[i]`` its first stored byte (relative to the component)."""

    def __init__(self, sizes: List[Tuple[int, int]]) -> None:
        self.sizes = sizes
        self.offsets, self.starts = [0], [0]
        for c, d in sizes:
            self.offsets.append(self.offsets[-1] + c)
            self.starts.append(self.starts[-1] + d)

    def frames_for(self, lo: int, hi: int) -> Tuple[int, int]:
        """[first, last) frames holding decoded bytes [lo, hi) (hi > lo)."""
        first = bisect.bisect_right(self.starts, lo) - 1
        last = bisect.bisect_left(self.starts, hi)
        return first, min(last, len(self.sizes))


def read_seek_table(source, comp, **where) -> Optional[SeekTable]:
    """The component's seek table, read from the end of its stored bytes (only the
    table is fetched), or None when its stream has none (written as one frame, or
    by a writer that makes none).  FormatError when a table is there and does not
    add up."""
    if comp.encoding != "zstd" or comp.uncompressed_length is None or comp.length < _FOOTER + 8:
        return None
    at = {"obj": where.get("obj"), "component": where.get("component")}
    end = comp.offset + comp.length
    footer = bytes(source.view(end - _FOOTER, _FOOTER, "zstd seek table", **at))
    size = _table_size(footer, comp, where)
    if size is None:
        return None
    table = bytes(source.view(end - size, size, "zstd seek table", **at))
    return _parse(table, comp, where)


def parse_seek_table(stored, comp, **where) -> Optional[SeekTable]:
    """:func:`read_seek_table` over the component's stored bytes in memory."""
    if comp.encoding != "zstd" or comp.uncompressed_length is None or len(stored) < _FOOTER + 8:
        return None
    view = memoryview(stored).cast("B")
    size = _table_size(bytes(view[-_FOOTER:]), comp, where)
    return None if size is None else _parse(bytes(view[-size:]), comp, where)


def _table_size(footer, comp, where):
    """Bytes of the skippable frame holding the table, from the 9-byte footer."""
    count, descriptor, magic = struct.unpack("<IBI", footer)
    if magic != SEEKABLE_MAGIC:
        return None
    entry = _ENTRY + (4 if descriptor & _CHECKSUM_FLAG else 0)
    size = 8 + count * entry + _FOOTER
    if descriptor & 0x7C or size > comp.length:
        raise FormatError(
            f"zstd seek table of {count} frames does not fit in the "
            f"component's {comp.length} bytes",
            **where,
        )
    return size


def _parse(table, comp, where):
    count, descriptor, _ = struct.unpack("<IBI", table[-_FOOTER:])
    entry = _ENTRY + (4 if descriptor & _CHECKSUM_FLAG else 0)
    head_magic, size = struct.unpack_from("<II", table)
    if head_magic != SKIPPABLE_MAGIC or size != len(table) - 8:
        raise FormatError("zstd seek table is not in a skippable frame of its size", **where)
    found = SeekTable([struct.unpack_from("<II", table, 8 + i * entry) for i in range(count)])
    frames_end = comp.length - len(table)
    if found.offsets[-1] != frames_end or found.starts[-1] != comp.uncompressed_length:
        raise FormatError(
            f"zstd seek table sums to {found.offsets[-1]} stored and "
            f"{found.starts[-1]} decoded bytes; the component holds "
            f"{frames_end} and {comp.uncompressed_length}",
            **where,
        )
    return found


def decode_whole(stored, comp, limits, out=None, threads=None, **where):
    """The whole component decoded frame by frame in parallel threads, each frame
    straight into its place (3x the single-stream decoder here, on 2 cores), or
    None where the stream has no table (the caller decodes it as one stream).

    The output is allocated at the declared size only when that is no more than
    the single-stream decoder's own first allocation would be (zstd_stream.py);
    beyond that the stream decoder's grow-as-bytes-arrive rule applies instead."""

    table = parse_seek_table(stored, comp, **where)
    if table is None or len(table.sizes) < 2:
        return None
    size = comp.uncompressed_length
    if out is None:
        if size > zstd_stream.first_allocation(len(stored)):
            return None
        out = zstd_stream.alloc(size, where)
    elif len(out) != size:
        raise ValueError(f"decode_whole: out must hold exactly {size} bytes")
    view = memoryview(stored).cast("B")
    target = memoryview(out).cast("B")

    def one(i):
        zstd_stream.zstd_decode(
            view[table.offsets[i] : table.offsets[i + 1]],
            table.sizes[i][1],
            limits,
            out=target[table.starts[i] : table.starts[i + 1]],
            **where,
        )

    workers = min(len(table.sizes), threads or kernels.cpu_threads())
    if workers <= 1:
        for i in range(len(table.sizes)):
            one(i)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(len(table.sizes))))
    return out


def decode_range(source, comp, table: SeekTable, lo: int, hi: int, limits, **where):
    """Decoded bytes [lo, hi) of a component with a seek table: only the frames
    that hold them are read and decoded.  Returns (buffer, offset of lo in it)."""

    first, last = table.frames_for(lo, hi)
    stored = source.view(
        comp.offset + table.offsets[first],
        table.offsets[last] - table.offsets[first],
        "component",
        obj=where.get("obj"),
        component=where.get("component"),
    )
    data = zstd_stream.zstd_decode(
        stored, table.starts[last] - table.starts[first], limits, **where
    )
    return data, lo - table.starts[first]


__all__ = ["FrameWriter", "SeekTable", "read_seek_table", "decode_range", "FRAME_BYTES"]
