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

import io

import cbor2

from ztensor import attributes as attrs
from ztensor import dtypes, kernels, spec
from ztensor.attributes import show as _show
from ztensor.container import legacy, manifest_table
from ztensor.container.manifest_checks import (  # noqa: F401,E501  (imported from here too)
    MAX_CBOR_DEPTH,
    Checker,
    Manifest,
    check_file_totals,
    gc_paused,
    kind_of,
    refuse_repeated_keys,
)
from ztensor.errors import FormatError, UnsupportedError
from ztensor.objects import ComponentSpec, ObjectSpec


# ------------------------------------------------------------------ decoding
def decode_manifest(raw, footer, *, path, limits) -> Manifest:
    """Decode and validate the manifest bytes located by ``footer``."""
    # A manifest decodes to ~15 container objects per tensor and holds no cycles that
    # matter; cyclic GC passes over them while they are being built cost a third of
    # the decoding time, so the collector waits until the manifest is checked.
    with gc_paused():
        return _decode(raw, footer, path, limits)


def _decode(raw, footer, path, limits) -> Manifest:
    # the tables' scanner takes only CBOR that cbor_scan accepts too
    # (csrc/manifest_scan.h), so only a manifest it declines is scanned again
    fast = manifest_table.decode(raw, footer, path, limits, MAX_CBOR_DEPTH)
    if fast is not None:
        check_file_totals(path, limits, len(fast), footer.manifest_size)
        return fast
    items = _check_plain(raw, path)
    data = _cbor_loads(raw, path, items)
    if footer.family == 0:
        version, attributes, objects = "0.1.0", {}, legacy.lift_v01(data, path)
        info = spec.VERSIONS["0.1"]
    else:
        version, attributes, objects, info = _root_v1(data, path)
    check_file_totals(path, limits, len(objects), footer.manifest_size)
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
    spans = sorted(
        (c.offset, c.offset + c.length, name, c.role)
        for name, obj in specs.items()
        for c in obj.components.values()
        if c.length and c.aligned
    )
    for (_, end, name, role), (start, _, other, other_role) in zip(spans, spans[1:]):
        if start < end:
            raise FormatError(
                f"component {_show(role)} overlaps component "
                f"{_show(other_role)} of object {_show(other)}",
                path=path,
                obj=name,
            )


def _check_plain(raw, path):
    """The C scan's verdict on the manifest bytes; the data items it counted."""
    end, items, _ = kernels.cbor_scan(raw, MAX_CBOR_DEPTH, path)
    if end != len(raw):
        raise FormatError(f"manifest has {len(raw) - end} bytes after its CBOR item", path=path)
    return items


def _cbor_loads(raw, path, items):
    stream = io.BytesIO(raw)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except Exception as exc:  # cbor2 raises CBORDecodeError, ValueError, OverflowError...
        raise FormatError(f"manifest is not valid CBOR: {exc}", path=path) from None
    if stream.tell() != len(raw):
        raise FormatError(
            f"manifest has {len(raw) - stream.tell()} bytes after its CBOR item", path=path
        )
    refuse_repeated_keys(value, raw, items, path)
    return value


def _root_v1(root, path):
    if type(root) is not dict:
        raise FormatError(f"manifest root must be a map, got {kind_of(root)}", path=path)
    version = root.get("version")
    parsed = spec.parse_version(version)
    if parsed is None:
        raise FormatError(
            f"manifest 'version' must be a string like \"1.2.0\", got {_show(version)}", path=path
        )
    if parsed[0] != 1:
        raise UnsupportedError(
            f"format version {version} is not supported (this reader reads 0.1, 1.1 and 1.2)",
            path=path,
        )
    attributes = attrs.check_optional_map(root.get("attributes"), "file attributes", path=path)
    objects = root.get("objects")
    if type(objects) is not dict:
        raise FormatError(f"manifest 'objects' must be a map, got {kind_of(objects)}", path=path)
    return version, attributes, objects, spec.version_info(*parsed)


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
    return root + cbor2.dumps(
        {
            name: _encode_object(_as_spec(name, objects[name]))
            for name in sorted(objects, key=lambda n: n.encode("utf-8"))
        }
    )


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
    return kernels.manifest_encode(
        b"".join(encoded),
        list(map(len, encoded)),
        plain,
        rank,
        dims,
        codes,
        offsets,
        lengths,
        b"".join(pre),
        list(map(len, pre)),
        _DTYPE_WORDS,
    )


def _as_spec(name, entry) -> ObjectSpec:
    if type(entry) is not tuple:
        return entry
    shape, storage, offset, length = entry
    return ObjectSpec(
        name, shape, "dense", {}, {"data": ComponentSpec("data", storage, None, offset, length)}
    )


def _encode_object(obj: ObjectSpec) -> dict:
    out = {"shape": list(obj.shape), "format": obj.format}
    if obj.attributes:
        out["attributes"] = _sorted_map(obj.attributes)
    out["components"] = {
        role: _encode_component(obj.components[role])
        for role in sorted(obj.components, key=lambda r: r.encode("utf-8"))
    }
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
    return {
        k: _canonical_value(mapping[k])
        for k in sorted(mapping, key=lambda k: str(k).encode("utf-8"))
    }


def _canonical_value(value):
    if isinstance(value, dict):
        return _sorted_map(value)
    if type(value) in (list, tuple):  # exact: older cbor2's CBORSimpleValue is a namedtuple
        return [_canonical_value(v) for v in value]
    return value
