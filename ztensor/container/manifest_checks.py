"""The rules every manifest object obeys, and the validated result.

:class:`Checker` holds every per-object rule (types, shapes, dtypes, offsets,
lengths, digests): the general path (manifest.py: cbor2, then Checker), the fast
path over columns (manifest_table.py, which may only decline) and the writer all
apply this one class, so a rule written here holds on every path.
:class:`Manifest` is what a decoded manifest becomes, whichever path read it.
"""

from __future__ import annotations

import contextlib
import gc
import re

from ztensor import attributes as attrs
from ztensor import dtypes, formats, spec
from ztensor.attributes import show as _show
from ztensor.container.legacy import BYTEORDER, LEGACY, UNALIGNED
from ztensor.errors import FormatError, LimitError
from ztensor.objects import ComponentSpec, ObjectSpec

# the file-wide totals rule lives below every reader (spec.check_file_totals), where the
# foreign readers reach it too; the .zt reader and writer import it from here
from ztensor.spec import check_file_totals as check_file_totals

_U64 = 1 << 64
_MAX_DIM = 1 << 63
# root map > objects > object > attributes > 64 attribute levels, with room to spare
MAX_CBOR_DEPTH = 4 + attrs.MAX_DEPTH + 4
# the digests a read verifies (io/digests.py), each in its one well-formed spelling;
# matched whole (fullmatch: ``$`` would take a trailing newline, which the
# comparison then reads as a mismatch, or for crc32c, through int(), as a match)
_DIGEST = re.compile(r"sha256:[0-9a-fA-F]{64}|crc32c:0[xX][0-9a-fA-F]{1,8}|xxh3:[0-9a-fA-F]{16}")
_VERIFIED = ("sha256", "crc32c", "xxh3")


class Manifest:
    """A validated manifest.

    Attributes
    ----------
    version : str
        The file's version string (``"0.1.0"`` for legacy files).
    attributes : dict
        File-level attributes.
    specs : dict or manifest_table.TableSpecs
        name -> ObjectSpec, in manifest order.  The Reader reads through it directly
        (and hands it to batch.py in ReaderInternals): the tables' own ``get``,
        ``view_table`` and columns, without a call through this class.
    """

    def __init__(self, version, attributes, specs):
        self.version = version
        self.attributes = attributes
        self.specs = specs

    def names(self):
        return list(self.specs)

    def __contains__(self, name):
        return name in self.specs

    def __len__(self):
        return len(self.specs)

    def get(self, name):
        """The ObjectSpec of ``name``, or None.  (Reader.metadata, the hot call, asks
        ``specs.get`` directly: a dict's, or the tables' own.)"""
        return self.specs.get(name)

    def format_of(self, name):
        """The ``format`` of object ``name`` (without building its spec when the
        manifest came through the tables), or None."""
        of = getattr(self.specs, "format_of", None)
        if of is not None:
            return of(name)
        found = self.specs.get(name)
        return None if found is None else found.format


@contextlib.contextmanager
def gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_ITEMSIZE = {name: st.itemsize for name, st in dtypes.STORAGE.items()}


class Checker:
    """Turns raw manifest entries into specs, checking every field on the way:
    types, sizes, alignment, bounds and limits.  Runs once per object at open (and
    in the writer on every object before its bytes are written), so it is written
    for speed: one pass, no intermediate structures."""

    def __init__(self, path, info, data_end, limits, decoded_text=True):
        self.path = path
        self.info = info
        self.data_end = data_end
        self.limits = limits
        self.total_decoded = 0
        # strings cbor2 decoded (strict UTF-8) cannot hold lone surrogates: at open
        # only their type is checked; the writer's strings come from callers
        self.check_name = _name_is_text if decoded_text else attrs.check_name

    def fail(self, message, name=None, role=None, cls=FormatError):
        raise cls(message, path=self.path, obj=name, component=role)

    def object_spec(self, name, obj) -> ObjectSpec:
        self.check_name(name, "object names", path=self.path)
        if type(obj) is not dict:
            self.fail(f"object must be a map, got {kind_of(obj)}", name)
        shape = obj.get("shape")
        if type(shape) is not list:
            self.fail(f"'shape' must be an array of integers, got {kind_of(shape)}", name)
        if len(shape) > self.limits.max_rank:
            self.fail(
                f"rank {len(shape)} exceeds the limit of {self.limits.max_rank}",
                name,
                cls=LimitError,
            )
        for dim in shape:
            if type(dim) is not int or dim < 0 or dim >= _MAX_DIM:
                self.fail(f"'shape' entries must be integers in [0, 2**63), got {_show(dim)}", name)
        fmt = obj.get("format")
        if type(fmt) is not str or not fmt:
            self.fail(f"'format' must be a non-empty string, got {_show(fmt)}", name)
        self.check_name(fmt, "'format'", path=self.path, obj=name)
        attributes = attrs.check_optional_map(
            obj.get("attributes"), "attributes", path=self.path, obj=name
        )
        raw_components = obj.get("components")
        if type(raw_components) is not dict:
            self.fail(f"'components' must be a map, got {kind_of(raw_components)}", name)
        comps = {role: self.component_spec(name, role, c) for role, c in raw_components.items()}
        # the format's own rules (formats/<format>.py): e.g. only a dense object must
        # fit in memory; sparse ones may describe shapes far larger than memory
        formats.handler(fmt).check_entry(self, name, shape, comps)
        return ObjectSpec(name, shape, fmt, attributes, comps, obj.get(LEGACY))

    def component_spec(self, name, role, c) -> ComponentSpec:
        self.check_name(role, "component names", path=self.path, obj=name)
        if type(c) is not dict:
            self.fail(f"component must be a map, got {kind_of(c)}", name, role)
        dtype, ltype = c.get("dtype"), c.get("type")
        itemsize = _ITEMSIZE.get(dtype) if type(dtype) is str else None
        if itemsize is None:
            dtype, ltype = self.lift_dtype(name, role, dtype, ltype)
            itemsize = _ITEMSIZE[dtype]
        if ltype is not None:
            ltype = self.check_type(name, role, dtype, ltype)
            # a compound type (complex: 2 floats per element) needs whole elements too
            itemsize *= dtypes.element_ratio(dtype, ltype)
        offset, length = c.get("offset"), c.get("length")
        if type(offset) is not int or offset < 0 or offset >= _U64:
            self.fail(
                f"'offset' must be an unsigned 64-bit integer, got {_show(offset)}", name, role
            )
        if type(length) is not int or length < 0 or length >= _U64:
            self.fail(
                f"'length' must be an unsigned 64-bit integer, got {_show(length)}", name, role
            )
        unaligned = c.get(UNALIGNED, False)
        if offset % spec.ALIGNMENT and not unaligned:
            self.fail(f"offset {offset} is not a multiple of {spec.ALIGNMENT}", name, role)
        if offset < spec.MAGIC_SIZE:
            self.fail(f"offset {offset} points into the file header", name, role)
        if offset + length > self.data_end:
            self.fail(
                f"bytes {offset}..{offset + length} run past the end of the data region "
                f"({self.data_end})",
                name,
                role,
            )
        encoding = c.get("encoding", "raw")
        ulen = c.get("uncompressed_length")
        if ulen is not None and (type(ulen) is not int or ulen < 0 or ulen >= _U64):
            self.fail(
                f"'uncompressed_length' must be an unsigned 64-bit integer, got {_show(ulen)}",
                name,
                role,
            )
        if encoding == "raw":
            if ulen is not None and ulen != length:
                self.fail(
                    f"raw component has uncompressed_length {ulen} != length {length}", name, role
                )
            ulen = None
            if length % itemsize:
                self.fail(
                    f"length {length} is not a whole number of {ltype or dtype} elements",
                    name,
                    role,
                )
        elif encoding == "zstd":
            self.check_zstd_size(name, role, ulen, itemsize, ltype or dtype, length)
        else:
            self.fail(f"unknown encoding {_show(encoding)} (expected 'raw' or 'zstd')", name, role)
        digest = c.get("digest")
        if digest is not None:
            self.check_digest(name, role, digest)
        return ComponentSpec(
            role,
            dtype,
            ltype,
            offset,
            length,
            encoding,
            ulen,
            digest,
            c.get(BYTEORDER, "<"),
            not unaligned,
        )

    def lift_dtype(self, name, role, dtype, ltype):
        """v1.1 dtypes that are really logical types -> (storage, type)."""
        alias = dtypes.V11_DTYPE_ALIASES.get(dtype) if type(dtype) is str else None
        if alias is None:
            if type(dtype) is not str:
                self.fail(f"'dtype' must be a string, got {kind_of(dtype)}", name, role)
            self.fail(f"unknown dtype {_show(dtype)}", name, role)
        return alias[0], ltype or alias[1]

    def check_type(self, name, role, dtype, ltype):
        if type(ltype) is not str:
            self.fail(f"'type' must be a string, got {kind_of(ltype)}", name, role)
        ltype = dtypes.TYPE_ALIASES.get(ltype, ltype)
        known = dtypes.LOGICAL.get(ltype)
        if known is not None and known.storage != dtype:
            self.fail(
                f"type {_show(ltype)} needs dtype {known.storage!r}, not {_show(dtype)}", name, role
            )
        return ltype

    def check_zstd_size(self, name, role, ulen, itemsize, dtype, length):
        """The size rules of a zstd component of ``length`` stored bytes declaring
        ``ulen`` decoded ones (None: v0.1/v1.1, undeclared).  Used by every .zt
        version's open (v0.1-v1.2 here, v2 through container/v2.py) and by the
        Writer before it writes."""
        if length == 0:
            # zstd data is one or more frames, and the smallest frame (an empty input's:
            # header and an empty last block) is 9 bytes; no writer, ours or the
            # reference's, stores none, and zstandard reads b"" as an empty stream
            self.fail(
                "zstd component stores 0 bytes, which is no zstd frame (an empty "
                "tensor compresses to a 9-byte frame)",
                name,
                role,
            )
        if ulen is None:
            if self.info.requires_uncompressed_length:
                self.fail(
                    "zstd component lacks 'uncompressed_length' (required since 1.2)", name, role
                )
            return  # v0.1/v1.1: dense objects derive it from the shape (formats/dense.py)
        if ulen > self.limits.max_component_size:
            self.fail(
                f"uncompressed_length {ulen} exceeds the per-component limit of "
                f"{self.limits.max_component_size}",
                name,
                role,
                cls=LimitError,
            )
        self.total_decoded += ulen
        if self.total_decoded > self.limits.max_total_decompressed:
            self.fail(
                f"total uncompressed size {self.total_decoded} exceeds the per-file "
                f"limit of {self.limits.max_total_decompressed}",
                name,
                role,
                cls=LimitError,
            )
        if ulen > spec.zstd_max_output(length):
            self.fail(
                f"uncompressed_length {ulen} is more than {length} bytes of zstd data "
                f"can produce (at most {spec.ZSTD_MAX_RATIO}x)",
                name,
                role,
            )
        if ulen % itemsize:
            self.fail(
                f"uncompressed_length {ulen} is not a whole number of {dtype} elements", name, role
            )

    def check_digest(self, name, role, digest):
        if type(digest) is not str or ":" not in digest:
            self.fail(f"'digest' must be a string 'algorithm:hex', got {_show(digest)}", name, role)
        algorithm = digest.split(":", 1)[0].lower()
        if algorithm in _VERIFIED and not _DIGEST.fullmatch(algorithm + digest[len(algorithm) :]):
            self.fail(f"malformed {algorithm} digest {_show(digest)}", name, role)


def _name_is_text(name, what, **where):
    if type(name) is not str or not name:
        raise FormatError(f"{what} must be non-empty strings, got {_show(name)}", **where)
    return name


def refuse_repeated_keys(value, raw, items, path, obj=None) -> None:
    """THE rule that no map of a manifest holds one key twice: cbor2 keeps the last
    entry silently, so an object (or component, or attribute) written first under a
    repeated name was dropped, and another reader may keep the first.  ``value`` is
    what ``raw`` decoded to and ``items`` the data items ``kernels.cbor_scan``
    counted in it: the decoded tree has as many unless a map lost entries (or the
    bytes hold tags or chunked strings, which the scan counts and decoding folds),
    so only then are the bytes walked key by key.  Used by every manifest decode
    (manifest._cbor_loads; manifest_table._attributes)."""
    if _decoded_items(value) == items:
        return
    key = _repeated_key(bytes(raw))
    if key is not None:
        raise FormatError(
            f"manifest holds the key {_show(key)} twice in one map "
            "(a CBOR decoder keeps one of them silently)",
            path=path,
            obj=obj,
        )


def _decoded_items(value) -> int:
    """Data items a plain CBOR encoding of ``value`` has (each map key and value
    one, a container one plus its members)."""
    count, todo = 0, [value]
    while todo:
        item = todo.pop()
        count += 1
        if type(item) is dict:
            count += len(item)  # the keys: text strings, one item each
            todo.extend(item.values())
        elif type(item) is list:
            todo.extend(item)
    return count


def _head(buf, pos):
    """(major type, additional info, argument, position after the head)."""
    ib = buf[pos]
    major, info = ib >> 5, ib & 31
    pos += 1
    if 24 <= info <= 27:
        size = 1 << (info - 24)
        return major, info, int.from_bytes(buf[pos : pos + size], "big"), pos + size
    return major, info, info if info < 24 else 0, pos


def _repeated_key(buf):
    """The first map key found twice in one map of the well-formed CBOR ``buf``
    (kernels.cbor_scan has proven it so: map keys are text strings), else None."""
    pos = 0
    stack = [[1, False, None, 0]]  # items left (None: until a break), is a map, keys, seen
    while stack:
        frame = stack[-1]
        if frame[0] == 0:
            stack.pop()
            continue
        if buf[pos] == 0xFF:  # the break ending an indefinite-length container
            pos += 1
            stack.pop()
            continue
        if frame[0] is not None:
            frame[0] -= 1
        is_key = frame[1] and frame[3] % 2 == 0
        frame[3] += 1
        major, info, arg, pos = _head(buf, pos)
        if major in (2, 3):
            if info == 31:  # chunks until a break
                parts = []
                while buf[pos] != 0xFF:
                    _, _, size, pos = _head(buf, pos)
                    parts.append(buf[pos : pos + size])
                    pos += size
                pos += 1
                data = b"".join(parts)
            else:
                data = buf[pos : pos + arg]
                pos += arg
            if is_key:
                if data in frame[2]:
                    return data.decode("utf-8", "replace")
                frame[2].add(data)
        elif major in (4, 5):
            left = None if info == 31 else arg * (2 if major == 5 else 1)
            stack.append([left, major == 5, set() if major == 5 else None, 0])
        elif major == 6:  # a tag wraps one item
            stack.append([1, False, None, 0])
    return None


def kind_of(value) -> str:
    """How a message names a value's type (``nothing`` for None)."""
    return "nothing" if value is None else type(value).__name__
