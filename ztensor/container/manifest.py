"""READ 2 / WRITE 2: the CBOR manifest <-> validated :class:`ObjectSpec` entries.

Decoding treats the bytes as hostile.  Every manifest that is decoded is one
plain CBOR item (well-formed, at most MAX_CBOR_DEPTH levels deep, text map keys,
no tags but bignums: so no value sharing and no arithmetic tags, and decoding
costs what the bytes are); trailing bytes are an error.  Then:

* the fast path (``manifest_table.py``): the manifest shape every known writer
  produces is read by C into flat tables, checked over columns, and an object's
  spec is built when first asked for.  Its scanner is at least as strict as the
  plain-CBOR scan, so it proves the above itself;
* the general path (here): anything else, and every manifest the fast path would
  refuse, is first proven plain by a C scan (csrc/cbor_scan.c), then decoded by
  cbor2 and every field is type-checked before use (a
  ``bool`` is not an integer) by :class:`Checker`, which names the first problem.

The writer runs the same :class:`Checker` on every object it is given, except on
its plain-dense fast path (``Writer._write_plain``: a C-contiguous little-endian
array stored raw, for which every rule Checker checks holds by construction, and
a test holds it to the general path's bytes), so it cannot write what this module
refuses.  v0.1 and v1.1 manifests are lifted to v1.2 terms here; what still
depends on the version after this module is the version string
(``Manifest.version``, ``Reader.version``) and a v0.1 object's ``legacy`` marks
(its byte order and unaligned blobs, legacy.py), which the readers honour.
"""
from __future__ import annotations

import contextlib
import gc
import io
import re

import cbor2

from ztensor import attributes as attrs
from ztensor import dtypes, formats, kernels, spec
from ztensor.container import legacy
from ztensor.container import manifest_table
from ztensor.container.legacy import BYTEORDER, LEGACY, UNALIGNED
from ztensor.attributes import show as _show
from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.objects import ComponentSpec, ObjectSpec

_U64 = 1 << 64
_MAX_DIM = 1 << 63
# root map > objects > object > attributes > 64 attribute levels, with room to spare
MAX_CBOR_DEPTH = 4 + attrs.MAX_DEPTH + 4
_DIGEST = re.compile(r"^(sha256:[0-9a-fA-F]{64}|crc32c:0[xX][0-9a-fA-F]{1,8})$")


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


# ------------------------------------------------------------------ decoding
def decode_manifest(raw, footer, *, path, limits) -> Manifest:
    """Decode and validate the manifest bytes located by ``footer``."""
    # A manifest decodes to ~15 container objects per tensor and holds no cycles that
    # matter; cyclic GC passes over them while they are being built cost a third of
    # the decoding time, so the collector waits until the manifest is checked.
    with gc_paused():
        return _decode(raw, footer, path, limits)


@contextlib.contextmanager
def gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _decode(raw, footer, path, limits) -> Manifest:
    # the tables' scanner takes only CBOR that cbor_scan accepts too
    # (csrc/manifest_scan.h), so only a manifest it declines is scanned again
    fast = manifest_table.decode(raw, footer, path, limits, MAX_CBOR_DEPTH)
    if fast is not None:
        return fast
    _check_plain(raw, path)
    data = _cbor_loads(raw, path)
    if footer.family == 0:
        version, attributes, objects = "0.1.0", {}, legacy.lift_v01(data, path)
        info = spec.VERSIONS["0.1"]
    else:
        version, attributes, objects, info = _root_v1(data, path)
    if len(objects) > limits.max_objects:
        raise LimitError(f"{len(objects)} objects exceed the limit of {limits.max_objects}",
                         path=path)
    # The specs are built now, while the collector is paused, and the decoded CBOR
    # containers go: the specs are a fifth as many objects for it to track later.
    checker = Checker(path, info, footer.manifest_offset, limits)
    specs = {name: checker.object_spec(name, obj) for name, obj in objects.items()}
    _check_disjoint(specs, path)
    return Manifest(version, attributes, specs)


def _check_disjoint(specs, path):
    """No two components may share a byte: a reader handing out writable views
    (torch) would otherwise alias one tensor's memory with another's, and no
    writer produces overlaps (safetensors refuses them too).  Empty components
    occupy nothing."""
    spans = sorted((c.offset, c.offset + c.length, name, c.role)
                   for name, obj in specs.items() for c in obj.components.values()
                   if c.length and c.aligned)
    for (_, end, name, role), (start, _, other, other_role) in zip(spans, spans[1:]):
        if start < end:
            raise FormatError(f"component {_show(role)} overlaps component "
                              f"{_show(other_role)} of object {_show(other)}", path=path,
                              obj=name)


def _check_plain(raw, path):
    end, _, _ = kernels.cbor_scan(raw, MAX_CBOR_DEPTH, path)
    if end != len(raw):
        raise FormatError(f"manifest has {len(raw) - end} bytes after its CBOR item",
                          path=path)


def _cbor_loads(raw, path):
    stream = io.BytesIO(raw)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except Exception as exc:  # cbor2 raises CBORDecodeError, ValueError, OverflowError...
        raise FormatError(f"manifest is not valid CBOR: {exc}", path=path) from None
    if stream.tell() != len(raw):
        raise FormatError(f"manifest has {len(raw) - stream.tell()} bytes after its CBOR item",
                          path=path)
    return value


def _root_v1(root, path):
    if type(root) is not dict:
        raise FormatError(f"manifest root must be a map, got {_kind(root)}", path=path)
    version = root.get("version")
    parsed = spec.parse_version(version)
    if parsed is None:
        raise FormatError(f"manifest 'version' must be a string like \"1.2.0\", got {_show(version)}",
                          path=path)
    if parsed[0] != 1:
        raise UnsupportedError(f"format version {version} is not supported (this reader "
                               "reads 0.1, 1.1 and 1.2)", path=path)
    attributes = attrs.check_optional_map(root.get("attributes"), "file attributes",
                                          path=path)
    objects = root.get("objects")
    if type(objects) is not dict:
        raise FormatError(f"manifest 'objects' must be a map, got {_kind(objects)}", path=path)
    return version, attributes, objects, spec.version_info(*parsed)


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
            self.fail(f"object must be a map, got {_kind(obj)}", name)
        shape = obj.get("shape")
        if type(shape) is not list:
            self.fail(f"'shape' must be an array of integers, got {_kind(shape)}", name)
        if len(shape) > self.limits.max_rank:
            self.fail(f"rank {len(shape)} exceeds the limit of {self.limits.max_rank}", name,
                      cls=LimitError)
        for dim in shape:
            if type(dim) is not int or dim < 0 or dim >= _MAX_DIM:
                self.fail(f"'shape' entries must be integers in [0, 2**63), got {_show(dim)}",
                          name)
        fmt = obj.get("format")
        if type(fmt) is not str or not fmt:
            self.fail(f"'format' must be a non-empty string, got {_show(fmt)}", name)
        self.check_name(fmt, "'format'", path=self.path, obj=name)
        attributes = attrs.check_optional_map(obj.get("attributes"), "attributes",
                                              path=self.path, obj=name)
        raw_components = obj.get("components")
        if type(raw_components) is not dict:
            self.fail(f"'components' must be a map, got {_kind(raw_components)}", name)
        comps = {role: self.component_spec(name, role, c) for role, c in raw_components.items()}
        # the format's own rules (formats/<format>.py): e.g. only a dense object must
        # fit in memory; sparse ones may describe shapes far larger than memory
        formats.handler(fmt).check_entry(self, name, shape, comps)
        return ObjectSpec(name, shape, fmt, attributes, comps, obj.get(LEGACY))

    def component_spec(self, name, role, c) -> ComponentSpec:
        self.check_name(role, "component names", path=self.path, obj=name)
        if type(c) is not dict:
            self.fail(f"component must be a map, got {_kind(c)}", name, role)
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
            self.fail(f"'offset' must be an unsigned 64-bit integer, got {_show(offset)}",
                      name, role)
        if type(length) is not int or length < 0 or length >= _U64:
            self.fail(f"'length' must be an unsigned 64-bit integer, got {_show(length)}",
                      name, role)
        unaligned = c.get(UNALIGNED, False)
        if offset % spec.ALIGNMENT and not unaligned:
            self.fail(f"offset {offset} is not a multiple of {spec.ALIGNMENT}", name, role)
        if offset < spec.MAGIC_SIZE:
            self.fail(f"offset {offset} points into the file header", name, role)
        if offset + length > self.data_end:
            self.fail(f"bytes {offset}..{offset + length} run past the end of the data region "
                      f"({self.data_end})", name, role)
        encoding = c.get("encoding", "raw")
        ulen = c.get("uncompressed_length")
        if ulen is not None and (type(ulen) is not int or ulen < 0 or ulen >= _U64):
            self.fail(f"'uncompressed_length' must be an unsigned 64-bit integer, got "
                      f"{_show(ulen)}", name, role)
        if encoding == "raw":
            if ulen is not None and ulen != length:
                self.fail(f"raw component has uncompressed_length {ulen} != length {length}",
                          name, role)
            ulen = None
            if length % itemsize:
                self.fail(f"length {length} is not a whole number of {ltype or dtype} "
                          "elements", name, role)
        elif encoding == "zstd":
            self.check_zstd_size(name, role, ulen, itemsize, ltype or dtype, length)
        else:
            self.fail(f"unknown encoding {_show(encoding)} (expected 'raw' or 'zstd')",
                      name, role)
        digest = c.get("digest")
        if digest is not None:
            self.check_digest(name, role, digest)
        return ComponentSpec(role, dtype, ltype, offset, length, encoding, ulen, digest,
                             c.get(BYTEORDER, "<"), not unaligned)

    def lift_dtype(self, name, role, dtype, ltype):
        """v1.1 dtypes that are really logical types -> (storage, type)."""
        alias = dtypes.V11_DTYPE_ALIASES.get(dtype) if type(dtype) is str else None
        if alias is None:
            if type(dtype) is not str:
                self.fail(f"'dtype' must be a string, got {_kind(dtype)}", name, role)
            self.fail(f"unknown dtype {_show(dtype)}", name, role)
        return alias[0], ltype or alias[1]

    def check_type(self, name, role, dtype, ltype):
        if type(ltype) is not str:
            self.fail(f"'type' must be a string, got {_kind(ltype)}", name, role)
        ltype = dtypes.TYPE_ALIASES.get(ltype, ltype)
        known = dtypes.LOGICAL.get(ltype)
        if known is not None and known.storage != dtype:
            self.fail(f"type {_show(ltype)} needs dtype {known.storage!r}, "
                      f"not {_show(dtype)}", name, role)
        return ltype

    def check_zstd_size(self, name, role, ulen, itemsize, dtype, length):
        if ulen is None:
            if self.info.requires_uncompressed_length:
                self.fail("zstd component lacks 'uncompressed_length' (required since 1.2)",
                          name, role)
            return  # v0.1/v1.1: dense objects derive it from the shape (formats/dense.py)
        if ulen > self.limits.max_component_size:
            self.fail(f"uncompressed_length {ulen} exceeds the per-component limit of "
                      f"{self.limits.max_component_size}", name, role, cls=LimitError)
        self.total_decoded += ulen
        if self.total_decoded > self.limits.max_total_decompressed:
            self.fail(f"total uncompressed size {self.total_decoded} exceeds the per-file "
                      f"limit of {self.limits.max_total_decompressed}", name, role,
                      cls=LimitError)
        if ulen > spec.zstd_max_output(length):
            self.fail(f"uncompressed_length {ulen} is more than {length} bytes of zstd data "
                      f"can produce (at most {spec.ZSTD_MAX_RATIO}x)", name, role)
        if ulen % itemsize:
            self.fail(f"uncompressed_length {ulen} is not a whole number of {dtype} elements",
                      name, role)

    def check_digest(self, name, role, digest):
        if type(digest) is not str or ":" not in digest:
            self.fail(f"'digest' must be a string 'algorithm:hex', got {_show(digest)}",
                      name, role)
        algorithm = digest.split(":", 1)[0].lower()
        if algorithm in ("sha256", "crc32c") and not _DIGEST.match(
                algorithm + digest[len(algorithm):]):
            self.fail(f"malformed {algorithm} digest {_show(digest)}", name, role)


def _name_is_text(name, what, **where):
    if type(name) is not str or not name:
        raise FormatError(f"{what} must be non-empty strings, got {_show(name)}", **where)
    return name


def _kind(value) -> str:
    return "nothing" if value is None else type(value).__name__


# ------------------------------------------------------------------ encoding
def encode_manifest(objects, attributes) -> bytes:
    """CBOR manifest for ``objects`` (name -> ObjectSpec, or a plain dense entry
    ``(shape, storage, offset, length)`` as the writer records raw arrays), in the
    reference's layout: fixed key order, object/component/attribute keys sorted by
    UTF-8 bytes, raw encoding left implicit.  Same input, same bytes.

    The compiled backend writes the objects map in C from columns
    (csrc/manifest_encode.c); the fallback builds the dicts for cbor2; a test holds
    the two to the same bytes."""
    head = [cbor2.dumps("version"), cbor2.dumps(spec.WRITE_VERSION)]
    if attributes:
        head += [cbor2.dumps("attributes"), cbor2.dumps(_sorted_map(attributes))]
    head.append(cbor2.dumps("objects"))
    root = bytes([0xA0 + (len(head) + 1) // 2]) + b"".join(head)  # pairs, "objects" included
    if hasattr(kernels, "manifest_encode"):
        return root + _objects_from_columns(objects)
    return root + cbor2.dumps({name: _encode_object(_as_spec(name, objects[name]))
                               for name in sorted(objects, key=lambda n: n.encode("utf-8"))})


_DTYPE_CODES = {name: i for i, name in enumerate(dtypes.STORAGE)}
_DTYPE_WORDS = tuple(dtypes.STORAGE)


def _objects_from_columns(objects) -> bytes:
    encoded = [name.encode("utf-8") for name in objects]
    plain, rank, dims, codes, offsets, lengths, pre = [], [], [], [], [], [], []
    for entry in objects.values():
        if type(entry) is tuple:
            shape, storage, offset, length = entry
            plain.append(1)
            rank.append(len(shape))
            dims.extend(shape)
            codes.append(_DTYPE_CODES[storage])
            offsets.append(offset)
            lengths.append(length)
        else:
            plain.append(0)
            pre.append(cbor2.dumps(_encode_object(entry)))
    return kernels.manifest_encode(b"".join(encoded), list(map(len, encoded)), plain, rank,
                                   dims, codes, offsets, lengths, b"".join(pre),
                                   list(map(len, pre)), _DTYPE_WORDS)


def _as_spec(name, entry) -> ObjectSpec:
    if type(entry) is not tuple:
        return entry
    shape, storage, offset, length = entry
    return ObjectSpec(name, shape, "dense", {}, {"data": ComponentSpec("data", storage, None,
                                                                       offset, length)})


def _encode_object(obj: ObjectSpec) -> dict:
    out = {"shape": list(obj.shape), "format": obj.format}
    if obj.attributes:
        out["attributes"] = _sorted_map(obj.attributes)
    out["components"] = {role: _encode_component(obj.components[role])
                         for role in sorted(obj.components, key=lambda r: r.encode("utf-8"))}
    return out


def _encode_component(c: ComponentSpec) -> dict:
    out = {"dtype": c.dtype}
    if c.type is not None:
        out["type"] = c.type
    out["offset"] = c.offset
    out["length"] = c.length
    if c.encoding != "raw":
        out["uncompressed_length"] = c.uncompressed_length
        out["encoding"] = c.encoding
    if c.digest is not None:
        out["digest"] = c.digest
    return out


def _sorted_map(mapping) -> dict:
    """An attributes map with its keys, and those of every map nested in its values,
    sorted by UTF-8 bytes: the same attributes give the same bytes whatever order
    their dicts were built in (docs/format-decisions.md, "Canonical order").  The
    depth is bounded: attributes.check_map refused deeper nesting before this."""
    return {k: _canonical_value(mapping[k])
            for k in sorted(mapping, key=lambda k: str(k).encode("utf-8"))}


def _canonical_value(value):
    if isinstance(value, dict):
        return _sorted_map(value)
    if type(value) in (list, tuple):  # exact: older cbor2's CBORSimpleValue is a namedtuple
        return [_canonical_value(v) for v in value]
    return value
