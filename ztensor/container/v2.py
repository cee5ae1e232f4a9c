"""READ 1-3 for zTensor version 2 files (the container PyPI ``ztensor`` 2.x writes):
footer, manifest checks, and the objects mapped onto our ObjectSpecs.  Read-only:
this package writes v1.2 (docs/format-versions.md).

The v2 spec (the reference repository's spec/ztensor-v2-spec.md, Draft 4) in brief::

    magic 89 5A 54 32 0D 0A 1A 0A | blobs at multiples of 4096 | manifest blob |
    footer: manifest offset u64, length u64, XXH3-64 of the manifest u64,
            version u32 (= 2), reserved u32, magic

Every rule of its validation summary (section 3.6) is checked before any data is
read: footer magic and version; manifest bounds, alignment, 1 GiB cap, XXH3-64;
deterministic CBOR (csrc/cbor_canonical.c: shortest heads, definite lengths,
sorted unique keys, canonical floats, no tags, depth 32); then the schema here:
blob references ([offset, length], 4096-aligned, at least 4096, inside the file
and off the footer, pairwise identical or disjoint per file, the manifest blob
included), shard table and references, names, shapes (rank <= 64, no u64
overflow), attribute maps, and the dense size equation.  The reader's own
:class:`ztensor.Limits` apply on top, as for v1.2 files: ``max_rank``,
``max_objects``, ``max_manifest_size``, and every encoded part's
``decoded_length`` through v1.2's own check (``manifest.Checker.check_zstd_size``:
the per-component and per-file limits, and for zstd what its stored bytes can
decode to at most), so nothing is sized on a declaration the file's bytes cannot
back.  Dimensions of 2**63 or more (valid v2, but no array can have them) are
refused as unsupported.

Parts referencing one blob (weight tying) are marked ``shared``: a reader that
hands out writable views (torch) copies those instead, so no result aliases
another (components.read_component).

How the objects map:

* ``dense`` -> dense; ``zt.sparse_csr/1`` / ``zt.sparse_coo/1`` -> our sparse
  formats (their data rules run when assembled); ``gguf.<type>/1`` -> gguf_blocks
  (part ``data`` becomes component ``blocks``, ``elems_per_block`` becomes
  ``block_elements``; ``ggml_type``, ``ggml_type_id``, ``block_elements`` and
  ``block_bytes`` come from the layout, and an object attribute of one of those
  names that says otherwise is refused).  Any other layout is kept structurally:
  its parts are readable as raw components, never interpreted.
* Encoding ``zt.zstd-seekable/1`` is zstd frames with a seek table, which our
  decoder reads (ztensor/io/seekable.py); another encoding is refused when decoded.
* Logical types: ``bool`` (bytes must be 0 or 1), the four FP8 types, complex64
  and complex128 decode; ``f8_e8m0``, ``f4_e2m1`` and unknown types are refused
  when decoded, as the spec requires, and readable only structurally.
* Digests (``xxh3:`` or ``sha256:``) cover the decoded bytes.
* Parts in other files (``shard``) are validated from this manifest; reading them
  is refused with a message naming the shard (multi-file v2 models are not read).
* A data shard (a footer with no manifest) opens with no objects.
"""

from __future__ import annotations

import math
import re
import struct
from typing import Any, Dict

import cbor2

from ztensor import dtypes, kernels, spec
from ztensor.container.manifest_checks import Checker
from ztensor.dtypes import GGML_TYPES
from ztensor.errors import FormatError, LimitError, UnsupportedError
from ztensor.objects import ComponentSpec, ObjectSpec, shape_problem

MAGIC = spec.MAGIC_V2
FOOTER = 40
VERSION = "2.0"  # what Reader.version reports for these files
ALIGN = 4096
MAX_MANIFEST = 1 << 30
MAX_DEPTH = 32  # item nesting below the root
MAX_RANK = spec.MAX_RANK  # the spec's; Limits.max_rank may lower it
MAX_NAME = 1024
# v2's storage dtypes: v1's (dtypes.STORAGE) but bool, which v2 makes a logical type
STORAGE_WIDTH = {name: st.itemsize for name, st in dtypes.STORAGE.items() if name != "bool"}


def _widths(per: int):
    return lambda n: per * n


# registered logical types: required storage, size of n elements in bytes; v1's
# (dtypes.LOGICAL: FP8, complex) and three of v2's own
LOGICAL = {
    **{
        name: (lt.storage, _widths(lt.ratio * dtypes.STORAGE[lt.storage].itemsize))
        for name, lt in dtypes.LOGICAL.items()
    },
    "bool": ("u8", _widths(1)),
    "f8_e8m0": ("u8", _widths(1)),
    "f4_e2m1": ("u8", lambda n: -(-n // 2)),
}
# the logical types read as values (the rest come back as their storage)
DECODED_TYPES = dtypes.DECODED_TYPES
ENCODINGS = {"zt.zstd-seekable/1": "zstd"}
_SHARD = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}\Z")
_DIGEST = re.compile(r"(xxh3:[0-9a-f]{16}|sha256:[0-9a-f]{64})\Z")
_U64 = (1 << 64) - 1


def is_v2(head) -> bool:
    return bytes(head[:8]) == MAGIC


def read(source, limits, path):
    """(attributes, {name: ObjectSpec}) of a v2 file, every rule checked."""
    size = source.size
    if size < len(MAGIC) + FOOTER:
        raise FormatError(f"a v2 file is at least 48 bytes; this one has {size}", path=path)
    tail = bytes(source.view(size - FOOTER, FOOTER, "footer"))
    offset, length, digest, version, _reserved = struct.unpack("<QQQII", tail[:32])
    if tail[32:] != MAGIC:
        raise FormatError("v2 footer magic missing (truncated, or not a zTensor file)", path=path)
    if version != 2:
        raise UnsupportedError(
            f"zTensor container version {version} (this reader knows v2, and v1.2/v1.1/v0.1)",
            path=path,
        )
    if length == 0:
        if offset or digest:
            raise FormatError(
                "a data shard's footer must have manifest offset and hash 0", path=path
            )
        return {}, {}  # a data shard: blobs only, described by its root's manifest
    spec.check_file_totals(path, limits, manifest_size=length, ceiling=MAX_MANIFEST)
    if offset % ALIGN or offset < ALIGN or offset > size - FOOTER - length:
        raise FormatError(
            f"manifest blob [{offset}, +{length}) is not a 4096-aligned range inside the file",
            path=path,
        )
    raw = source.view(offset, length, "manifest")
    if kernels.xxh3_64(raw) != digest:
        raise FormatError("manifest hash (XXH3-64) does not match the footer", path=path)
    kernels.cbor_check_canonical(raw, MAX_DEPTH, path)
    try:
        root = cbor2.loads(bytes(raw))
    except (cbor2.CBORDecodeError, ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"manifest is not valid CBOR: {exc}", path=path) from None
    return _Schema(path, size, (offset, length), limits).root(root)


def _names_one_of(value, table) -> bool:
    """Whether a manifest value is text naming one of ``table``'s keys: a CBOR list
    or map is unhashable, and a number could equal a key of another type, so only
    text is looked up."""
    return isinstance(value, str) and value in table


def _same_attribute(given, derived) -> bool:
    """Whether an attribute a v2 ``gguf.*`` object gives says what its layout says: the
    same integer (not a bool, nor a float), or the type's name in either case (the
    layout spells it in lower case, ``gguf_blocks`` in upper)."""
    if isinstance(derived, str):
        return isinstance(given, str) and given.upper() == derived
    return type(given) is int and given == derived


class _Schema:
    def __init__(self, path, size, manifest_blob, limits):
        self.path, self.size, self.limits = path, size, limits
        self.blobs: Dict[Any, list] = {None: [manifest_blob]}  # file -> references
        self.shards: Dict[str, int] = {}
        self.parts: list = []  # every ComponentSpec made, for the shared marks
        # v1.2's checker, for the decoded sizes: the same limits, the same words
        self.sizes = Checker(path, spec.VERSIONS["1.2"], size - FOOTER, limits)

    def fail(self, why, **where):
        raise FormatError(why, path=self.path, **where)

    def root(self, root):
        if not isinstance(root, dict):
            self.fail("the manifest is not a map")
        if "objects" not in root or not isinstance(root["objects"], dict):
            self.fail("the manifest has no 'objects' map")
        attributes = self.attributes(root.get("attributes", {}), "file attributes")
        if "shards" in root:
            self.shard_table(root["shards"])
        objects = root["objects"]
        spec.check_file_totals(self.path, self.limits, len(objects))
        specs = {}
        for name, obj in objects.items():
            self.name(name, "an object name")
            specs[name] = self.object(name, obj)
        for file, refs in self.blobs.items():
            self.disjoint(file, refs)
        self.mark_shared()
        self.check_visits()
        return attributes, specs

    # ------------------------------------------------------------ pieces
    def name(self, name, what, **where):
        if (
            not isinstance(name, str)
            or not name
            or "\0" in name
            or len(name.encode("utf-8")) > MAX_NAME
        ):
            self.fail(
                f"{what} must be non-empty text of at most {MAX_NAME} bytes without "
                f"NUL, got {name!r:.80}",
                **where,
            )

    def attributes(self, value, what, **where):
        if not isinstance(value, dict):
            self.fail(f"{what} must be a map", **where)
        for key in value:
            self.name(key, "an attribute key", **where)
        return value

    def shard_table(self, table):
        if not isinstance(table, dict):
            self.fail("'shards' must be a map")
        for name, entry in table.items():
            if not isinstance(name, str) or not _SHARD.match(name):
                self.fail(
                    f"shard name {name!r:.80} is not 1-64 of A-Z a-z 0-9 . _ - "
                    "(not starting with '.')"
                )
            if (
                not isinstance(entry, dict)
                or type(entry.get("size")) is not int
                or not 0 <= entry["size"] <= _U64
                or not isinstance(entry.get("digest"), str)
                or not _DIGEST.match(entry["digest"])
            ):
                self.fail(f"shard {name!r} needs 'size' and a lowercase 'digest'")
            self.shards[name] = entry["size"]
            self.blobs.setdefault(name, [])

    def shape(self, shape, where):
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_RANK
            or any(type(d) is not int or not 0 <= d <= _U64 for d in shape)
        ):
            self.fail(f"shape must be a list of at most {MAX_RANK} u64 dimensions", **where)
        if len(shape) > self.limits.max_rank:
            raise LimitError(
                f"rank {len(shape)} exceeds the limit of {self.limits.max_rank}",
                path=self.path,
                **where,
            )
        if math.prod(shape) > _U64:
            self.fail(f"shape {shape} has more than 2**64 - 1 elements", **where)
        if any(d >= 1 << 63 for d in shape):
            raise UnsupportedError(
                f"shape {shape} has a dimension of 2**63 or more, which no array can have",
                path=self.path,
                **where,
            )
        return tuple(shape)

    def part(self, role, part, where):
        where = {**where, "component": role}
        if not isinstance(part, dict):
            self.fail("a part must be a map", **where)
        dtype, ltype = part.get("dtype"), part.get("type")
        if not _names_one_of(dtype, STORAGE_WIDTH):
            self.fail(f"unknown storage dtype {dtype!r:.40}", **where)
        if ltype is not None:
            if not isinstance(ltype, str):
                self.fail("'type' must be text", **where)
            if ltype in LOGICAL and LOGICAL[ltype][0] != dtype:
                self.fail(
                    f"type {ltype!r} needs dtype {LOGICAL[ltype][0]!r}, not {dtype!r}", **where
                )
        blob = part.get("blob")
        if (
            not isinstance(blob, list)
            or len(blob) != 2
            or any(type(v) is not int or not 0 <= v <= _U64 for v in blob)
        ):
            self.fail("'blob' must be [offset, length]", **where)
        offset, length = blob
        shard = part.get("shard")
        if shard is not None and not _names_one_of(shard, self.shards):
            self.fail(
                f"part names shard {shard!r:.80}, which the shard table does not declare", **where
            )
        file_size = self.size if shard is None else self.shards[shard]
        if offset % ALIGN or offset < ALIGN:
            self.fail(f"blob offset {offset} is not a multiple of 4096 at or past 4096", **where)
        if offset + length > file_size - FOOTER:
            self.fail(
                f"blob [{offset}, +{length}) runs past the data of "
                f"{'this file' if shard is None else 'shard ' + repr(shard)}",
                **where,
            )
        encoding, decoded = part.get("encoding"), part.get("decoded_length")
        if (encoding is None) != (decoded is None):
            self.fail("'decoded_length' must be present exactly when 'encoding' is", **where)
        if encoding is not None and (
            not isinstance(encoding, str) or type(decoded) is not int or not 0 <= decoded <= _U64
        ):
            self.fail("'encoding' must be text and 'decoded_length' a u64", **where)
        # decoded bytes are whole elements (a complex element is two floats), as
        # v1.2 requires: numpy could not view anything else as the part's dtype
        unit = STORAGE_WIDTH[dtype] * dtypes.element_ratio(dtype, ltype)
        if encoding is not None:
            # the v1.2 check of a declared decoded size: Limits, whole elements, and
            # for zstd the most its stored bytes can decode to; an encoding we do
            # not know has no known bound (it is refused when decoded), so only the
            # limits and whole elements apply to it
            bound = length if ENCODINGS.get(encoding) == "zstd" else _U64
            self.sizes.check_zstd_size(where["obj"], role, decoded, unit, ltype or dtype, bound)
        elif length % unit:
            self.fail(
                f"blob of {length} bytes is not a whole number of {ltype or dtype} elements",
                **where,
            )
        digest = part.get("digest")
        if digest is not None and (not isinstance(digest, str) or not _DIGEST.match(digest)):
            self.fail(
                f"digest {digest!r:.80} is not 'xxh3:' or 'sha256:' with lowercase hex", **where
            )
        if length:
            self.blobs[shard].append((offset, length))
        comp = ComponentSpec(
            role,
            dtype,
            ltype,
            offset,
            length,
            "raw" if encoding is None else ENCODINGS.get(encoding, encoding),
            decoded,
            digest,
            digest_over="decoded",
            shard=shard,
        )
        self.parts.append(comp)
        return comp

    def object(self, name, obj):
        where = {"obj": name}
        if not isinstance(obj, dict):
            self.fail("an object must be a map", **where)
        shape = self.shape(obj.get("shape"), where)
        layout = obj.get("layout")
        if not isinstance(layout, str):
            self.fail("'layout' must be text", **where)
        attributes = self.attributes(obj.get("attributes", {}), "object attributes", **where)
        parts = obj.get("parts")
        if not isinstance(parts, dict) or not parts:
            self.fail("'parts' must be a non-empty map", **where)
        comps = {}
        for role, part in parts.items():
            self.name(role, "a part name", **where)
            comps[role] = self.part(role, part, where)
        if layout == "dense":
            return self.dense(name, shape, attributes, comps, where)
        if layout in ("zt.sparse_csr/1", "zt.sparse_coo/1"):
            return ObjectSpec(name, shape, layout[3:-2], attributes, comps)
        if layout.startswith("gguf.") and layout.endswith("/1"):
            return self.gguf(name, layout, shape, attributes, comps, where)
        return ObjectSpec(name, shape, layout, attributes, comps)  # structural only

    def dense(self, name, shape, attributes, comps, where):
        if list(comps) != ["data"]:
            self.fail(
                f"a dense object has exactly one part, 'data'; this one has {sorted(comps)}",
                **where,
            )
        comp = comps["data"]
        # the v1.2 dense rule: one array of the element type a read gives must hold it
        if comp.type is None:
            unit = STORAGE_WIDTH.get(comp.dtype, 16)
        elif comp.type in dtypes.LOGICAL:
            unit = dtypes.LOGICAL[comp.type].ratio * dtypes.STORAGE[comp.dtype].itemsize
        else:
            unit = 16
        problem = shape_problem(shape, unit)
        if problem:
            raise UnsupportedError(f"shape: {problem}", path=self.path, **where)
        count = math.prod(shape)
        if comp.type is None:
            want = count * STORAGE_WIDTH[comp.dtype]
        elif comp.type in LOGICAL:
            want = LOGICAL[comp.type][1](count)
        else:
            want = None  # an unknown logical type: refused when decoded, not here
        if want is not None and comp.decoded_length != want:
            self.fail(
                f"part 'data' decodes to {comp.decoded_length} bytes; shape "
                f"{list(shape)} of {comp.type or comp.dtype} needs {want}",
                **where,
            )
        return ObjectSpec(name, shape, "dense", attributes, comps)

    def gguf(self, name, layout, shape, attributes, comps, where):
        per, nbytes = attributes.get("elems_per_block"), attributes.get("block_bytes")
        comp = comps.get("data")
        if list(comps) != ["data"] or comp.dtype != "u8" or comp.type is not None:
            self.fail(f"{layout} has exactly one part 'data' of u8", **where)
        if (
            type(per) is not int
            or type(nbytes) is not int
            or per < 1
            or nbytes < 1
            or math.prod(shape) % per
        ):
            self.fail(
                f"{layout}: elems_per_block must divide the element count and "
                "block_bytes be positive",
                **where,
            )
        if comp.decoded_length != math.prod(shape) // per * nbytes:
            self.fail(
                f"{layout}: part 'data' decodes to {comp.decoded_length} bytes, the "
                f"blocks need {math.prod(shape) // per * nbytes}",
                **where,
            )
        type_name = layout[len("gguf.") : -2].upper()
        known = [i for i, t in GGML_TYPES.items() if t[0] == type_name and t[1:3] == (per, nbytes)]
        if not known:
            return ObjectSpec(name, shape, layout, attributes, comps)
        comp.role = "blocks"
        derived = {
            "ggml_type": type_name,
            "ggml_type_id": known[0],
            "block_elements": per,
            "block_bytes": nbytes,
        }
        # the layout says what these are; the object may say them too (a writer
        # copying a gguf_blocks object's attributes), and then it must say the same:
        # one of them silently replaced by the other would let readers disagree
        for key, want in derived.items():
            if key in attributes and not _same_attribute(attributes[key], want):
                self.fail(
                    f"{layout}: attribute {key}={attributes[key]!r:.40} contradicts the "
                    f"layout's {key}={want!r}",
                    **where,
                )
        extra = {k: v for k, v in attributes.items() if k not in ("elems_per_block", *derived)}
        return ObjectSpec(name, shape, "gguf_blocks", {**extra, **derived}, {"blocks": comp})

    def mark_shared(self):
        """Mark every part whose blob another part, or the manifest, references too
        (in the same file): identical references are legal (weight tying), and a
        writable view of one would alias the other."""
        count: Dict[Any, int] = {}
        for file, refs in self.blobs.items():
            for ref in refs:
                count[file, ref] = count.get((file, ref), 0) + 1
        for comp in self.parts:
            if count.get((comp.shard, (comp.offset, comp.length)), 0) > 1:
                comp.shared = True

    def check_visits(self):
        """Identical references are legal, so a thousand objects may name one blob: the
        bytes a read of every object visits are held by the one rule for bytes read
        under many names (spec.check_visits), each blob's decoded bytes counted once
        (2,000 objects over one 16 MiB blob, a 17 MB file, made ``verify`` hash
        32 GiB).  Parts in another file of a multi-file model are not read by this
        reader, and their lengths are only what the manifest declares: they count for
        nothing (one declaring 2**40 bytes lifted the budget)."""
        visited = decoded = present = 0
        seen = set()
        for comp in self.parts:
            if comp.shard is not None:
                continue
            visited += comp.decoded_length
            blob = (comp.shard, comp.offset, comp.length)
            if blob not in seen:
                seen.add(blob)
                decoded += comp.decoded_length
                present += comp.length
        spec.check_visits(self.path, visited, decoded, present, self.limits)

    def disjoint(self, file, refs):
        """Blob references into one file: each pair identical or disjoint."""
        held_end, held = -1, None
        for ref in sorted(set(refs)):
            offset, length = ref
            if offset < held_end:
                self.fail(
                    f"blobs [{held[0]}, +{held[1]}) and [{offset}, +{length}) "
                    f"{'in this file' if file is None else 'in shard ' + repr(file)} "
                    "partly overlap"
                )
            held_end, held = offset + length, ref


__all__ = ["is_v2", "read", "MAGIC", "VERSION"]
