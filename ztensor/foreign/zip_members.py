"""Zip archives (PyTorch checkpoints, ``.npz``): the one home of the rules a member obeys.

Every reader of a zip goes through :class:`ZipArchive`.  ``zipfile`` parses the central
directory only; a member's bytes are found and decoded here, so the rules below hold
for every member read, by every reader:

* **One archive, the whole file**: a second end record hidden in the zip comment
  (each closing the file), bytes after the end record, or bytes before the archive
  its directory describes (zipfile shifts offsets past them; torch and numpy do
  not) are a FormatError: readers differ on which archive they take
  (:func:`_end_records`, :func:`_declared_directory`).
* **Names**: two members under one name (zip allows it; which one wins depends on the
  reader) are a FormatError naming both (:class:`~ztensor.foreign.names.NameTable`).
* **Encryption**: a member flagged encrypted (ZipCrypto, strong encryption, a masked
  local header) in its directory entry or its local header is an UnsupportedError:
  its bytes are ciphertext, never tensor values.
* **Compression**: stored and deflated only (what ``torch.save``, ``numpy.savez`` and
  ``savez_compressed`` write); any other method is an UnsupportedError.
* **Placement**: the local header exists, agrees with the directory (name, method,
  flags), and the member's bytes lie before the central directory.  No two members
  share a byte (overlapping members let a few KB of deflate stand for gigabytes
  many times over: the "better zip bomb").
* **Sizes**: a stored member holds exactly its declared size; a deflated one declares
  no more than deflate can produce from its compressed bytes (1032:1), and decodes to
  exactly its declared size with a matching CRC-32.  Decoding is bounded by the
  declared size, and the declared sizes are held to the caller's
  :class:`~ztensor.spec.Limits` (``max_component_size`` each,
  ``max_total_decompressed`` together) before anything is decoded
  (:meth:`ZipArchive.check_decoded`).  Work and memory follow the bytes present.
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from typing import Dict, Iterable, Optional

from ztensor import spec
from ztensor.errors import ChecksumError, FormatError, LimitError, UnsupportedError
from ztensor.foreign.base import ZIP_ERRORS
from ztensor.foreign.names import NameTable
from ztensor.io.source import Source, open_local_input
from ztensor.spec import DEFAULT_LIMITS, Limits

# general-purpose flag bits that mean the bytes are not plain: 0 (encrypted, ZipCrypto),
# 6 (strong encryption), 13 (central directory encryption, masked local headers)
ENCRYPTED_FLAGS = 0x0001 | 0x0040 | 0x2000
# Deflate's densest code is a 258-byte match in two one-bit codes: 1032 bytes out per
# byte in, plus a block header's worth.  A declared size above that is a lie.
DEFLATE_MAX_RATIO = 1032
METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header, 30 bytes
_CHUNK = 1 << 20


# the end of central directory record's signature (an empty zip starts with it), 22 bytes
_END = spec.MAGIC_ZIP_EMPTY


def _end_records(f) -> list:
    """Where an end of central directory record lies whose comment ends exactly at the
    end of the file, in the last 64 KiB + 22 bytes (where a record may be).  A zip
    has one; a second, hidden in the first's comment, is an archive of its own:
    Python's zipfile takes the last, libzip and miniz may take the other, so one file
    would be two checkpoints (a torch.save file read as an empty ``.npz``)."""
    size = f.seek(0, os.SEEK_END)
    start = max(0, size - 22 - 0xFFFF)
    f.seek(start)
    tail = f.read(size - start)
    found = []
    at = tail.find(_END)
    while at != -1:
        if at + 22 <= len(tail):
            comment = int.from_bytes(tail[at + 20 : at + 22], "little")
            if at + 22 + comment == len(tail):
                found.append(start + at)
        at = tail.find(_END, at + 1)
    return found


def _declared_directory(f, end: int) -> int:
    """The central directory's offset as the end record at ``end`` declares it (the
    zip64 record's when the end record's is 0xFFFFFFFF)."""
    f.seek(end + 16)
    offset = int.from_bytes(f.read(4), "little")
    if offset != 0xFFFFFFFF or end < 20:
        return offset
    f.seek(end - 20)  # the zip64 end record locator: signature, disk, record offset
    locator = f.read(20)
    if locator[:4] != b"PK\x06\x07":
        return offset
    f.seek(int.from_bytes(locator[8:16], "little") + 48)
    return int.from_bytes(f.read(8), "little")


class Member:
    """One checked member: its directory entry and where its bytes lie."""

    __slots__ = ("name", "info", "start")

    def __init__(self, name: str, info: zipfile.ZipInfo, start: int) -> None:
        self.name = name
        self.info = info
        self.start = start  # first byte of its (compressed) data in the file

    @property
    def size(self) -> int:
        """The decoded size its directory entry declares (checked against its bytes)."""
        return self.info.file_size

    @property
    def present(self) -> int:
        """The bytes its data takes in the file (its compressed size; its size when
        stored): what it holds, whatever it decodes to."""
        return self.info.compress_size

    @property
    def compressed(self) -> bool:
        return self.info.compress_type != zipfile.ZIP_STORED


class ZipArchive:
    """A zip file whose every member has been checked (see the module doc).

    ``kind`` words the errors ("PyTorch checkpoint", ".npz archive").  ``members`` maps
    each name to its :class:`Member`, in directory order.
    """

    def __init__(
        self, path, limits: Limits = DEFAULT_LIMITS, kind: str = "zip archive", *, mmap: bool = True
    ):
        self.path = os.fspath(path)
        self.limits = limits
        self.kind = kind
        try:
            # the checked regular file, never a path opened again (a FIFO swapped in
            # would block)
            with open_local_input(self.path) as f, zipfile.ZipFile(f) as z:
                infos = z.infolist()
                directory = z.start_dir
                ends = _end_records(f)
                # zipfile shifts every offset by the bytes before the archive it
                # found; torch's and numpy's readers take offsets as written
                prefix = directory - _declared_directory(f, ends[0]) if len(ends) == 1 else 0
        except ZIP_ERRORS as exc:
            raise FormatError(
                f"not a readable {kind}: {type(exc).__name__}: {str(exc)[:200]}", path=self.path
            ) from None
        if len(ends) != 1:
            raise FormatError(
                f"two end-of-archive records (at bytes {ends[0]} and {ends[1]}), each "
                "closing the file: zip readers differ on which one is the archive"
                if ends
                else "no end-of-archive record closes the file (bytes after the archive)",
                path=self.path,
            )
        if prefix:
            raise FormatError(
                f"{prefix} bytes before the archive its directory describes (another "
                "archive or data with one appended): zip readers differ on which it is",
                path=self.path,
            )
        self.source = Source(self.path, mmap=mmap)
        try:
            self.members: Dict[str, Member] = {}
            names = NameTable(self.path, "zip member")
            for index, info in enumerate(infos):
                names.claim(info.filename, f"entry {index} of the zip directory")
                self.members[info.filename] = self._check(info, directory)
            self._check_overlaps()
        except BaseException:
            self.source.close()
            raise

    def close(self) -> None:
        self.source.close()

    def _error(self, message, member=None, cls=FormatError):
        return cls(
            f"zip member {member!r}: {message}" if member is not None else message, path=self.path
        )

    def _check(self, info: zipfile.ZipInfo, directory: int) -> Member:
        """The directory entry and local header of one member, before any byte of it
        is used."""
        name = info.filename
        if info.flag_bits & ENCRYPTED_FLAGS:
            raise self._error(
                "is encrypted: its bytes are ciphertext, not values", name, UnsupportedError
            )
        if info.compress_type not in METHODS:
            raise self._error(
                f"compression method {info.compress_type} is not supported "
                "(stored and deflated are)",
                name,
                UnsupportedError,
            )
        head = bytes(
            self.source.view(info.header_offset, _LOCAL.size, "zip local header", obj=name)
        )
        magic, _, flags, method, _, _, _, _, _, name_len, extra_len = _LOCAL.unpack(head)
        if magic != spec.MAGIC_ZIP:
            raise self._error("has no local header where its directory entry points", name)
        if flags & ENCRYPTED_FLAGS:
            raise self._error(
                "is encrypted (its local header says so): its bytes are ciphertext, not values",
                name,
                UnsupportedError,
            )
        if method != info.compress_type:
            raise self._error(
                f"its local header says compression method {method}, its "
                f"directory entry {info.compress_type}",
                name,
            )
        raw_name = bytes(
            self.source.view(
                info.header_offset + _LOCAL.size, name_len, "zip local header", obj=name
            )
        )
        try:
            local_name = raw_name.decode("utf-8" if info.flag_bits & 0x800 else "cp437")
        except UnicodeDecodeError:
            local_name = None
        if local_name != info.orig_filename:
            raise self._error(f"its local header names it {raw_name[:80]!r}", name)
        start = info.header_offset + _LOCAL.size + name_len + extra_len
        if start + info.compress_size > directory:
            raise self._error(
                f"its {info.compress_size} bytes at offset {start} run into the "
                f"central directory at {directory}",
                name,
            )
        if info.compress_type == zipfile.ZIP_STORED:
            if info.compress_size != info.file_size:
                raise self._error(
                    f"stored, but declares {info.file_size} bytes and holds {info.compress_size}",
                    name,
                )
        elif info.file_size > DEFLATE_MAX_RATIO * info.compress_size + DEFLATE_MAX_RATIO:
            raise self._error(
                f"declares {info.file_size} bytes, more than deflate can "
                f"produce from its {info.compress_size}",
                name,
            )
        return Member(name, info, start)

    def _check_overlaps(self) -> None:
        """No two members share a byte (local header through the end of the data)."""
        spans = sorted(
            (m.info.header_offset, m.start + m.info.compress_size, m.name)
            for m in self.members.values()
        )
        for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
            if begin < end:
                raise FormatError(
                    f"zip members {first!r} and {second!r} overlap (a zip bomb "
                    "reuses one member's bytes for many)",
                    path=self.path,
                )

    def check_decoded(self, names: Iterable[str], obj_of=None) -> None:
        """Hold what decoding ``names`` would produce to the limits, before any of it is
        decoded: each compressed member's declared size under ``max_component_size``,
        their sum under ``max_total_decompressed``.  Stored members are not decoded
        (they are read, or mapped, as they lie).  ``obj_of(name)`` names the object a
        member is read for, for the message."""
        total = 0
        for name in dict.fromkeys(names):
            member = self.members[name]
            if not member.compressed:
                continue
            obj = obj_of(name) if obj_of else None
            if member.size > self.limits.max_component_size:
                raise LimitError(
                    f"zip member {name!r} decompresses to {member.size} bytes, "
                    f"above max_component_size {self.limits.max_component_size}",
                    path=self.path,
                    obj=obj,
                )
            total += member.size
            if total > self.limits.max_total_decompressed:
                raise LimitError(
                    f"the members read decompress to more than "
                    f"max_total_decompressed {self.limits.max_total_decompressed}"
                    f" bytes (at {name!r})",
                    path=self.path,
                    obj=obj,
                )

    def read(self, name: str, obj: Optional[str] = None, limit: Optional[int] = None):
        """A member's bytes, read-only: a view of the mapped file when stored, else
        decoded (bounded by its declared size, which must be what it decodes to).
        ``limit``: decode no more than the first ``limit`` bytes (a header), unchecked
        against the rest.  A stored member's CRC is not computed: that would read every
        byte of a checkpoint whose tensors are otherwise views of the mapping."""
        member = self.members[name]
        want = member.size if limit is None else min(limit, member.size)
        if not member.compressed:
            return self.source.view(member.start, want, "zip member", obj=obj)
        if limit is None:
            self.check_decoded([name], lambda _: obj)
        try:
            return self._inflate(member, want, limit is None, obj)
        except MemoryError:
            raise LimitError(
                f"not enough memory to decompress zip member {name!r} ({member.size} bytes)",
                path=self.path,
                obj=obj,
            ) from None

    def _inflate(self, member: Member, want: int, whole: bool, obj):
        info = member.info
        data = self.source.view(member.start, info.compress_size, "zip member", obj=obj)
        inflater = zlib.decompressobj(-15)
        out = bytearray()
        pos = 0
        try:
            while len(out) < want + whole and not inflater.eof:
                if inflater.unconsumed_tail:
                    chunk = inflater.unconsumed_tail
                elif pos < len(data):
                    chunk = data[pos : pos + _CHUNK]
                    pos += len(chunk)
                else:
                    break
                # at most one byte past what is declared: enough to tell a lie
                out += inflater.decompress(chunk, want + whole - len(out))
        except zlib.error as exc:
            raise FormatError(
                f"zip member {member.name!r} is not valid deflate: {exc}", path=self.path, obj=obj
            ) from None
        if not whole:
            return memoryview(out[:want]).toreadonly()
        if len(out) != want:
            found = f"more than {want}" if len(out) > want else f"{len(out)}"
            raise FormatError(
                f"zip member {member.name!r} declares {want} bytes and decodes to {found}",
                path=self.path,
                obj=obj,
            )
        if not inflater.eof:
            raise FormatError(
                f"zip member {member.name!r}: its deflate stream is cut short",
                path=self.path,
                obj=obj,
            )
        if zlib.crc32(out) != info.CRC:
            raise ChecksumError(
                f"zip member {member.name!r}: CRC-32 does not match its bytes",
                path=self.path,
                obj=obj,
            )
        return memoryview(out).toreadonly()
