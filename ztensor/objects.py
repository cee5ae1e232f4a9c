"""READ 3: what one object and its components are, after validation.

:class:`ObjectSpec` and :class:`ComponentSpec` are the validated, version-neutral
form of a manifest entry (v0.1 and v1.1 entries are lifted to v1.2 terms by
``manifest.py``).  They are what :meth:`ztensor.Reader.metadata` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Iterator

from ztensor import dtypes, spec

MAX_BYTES = 1 << 63


def primary_role(format, roles) -> str:
    """The component an object's ``dtype`` and ``type`` describe: the format's
    primary role (``data``, ``values``, ``packed_weight``...), present or not (a
    sparse object without ``values`` has no dtype, not its indices'); for a format
    the spec does not name, the first component (``"data"`` when there is none).
    One rule for ObjectSpec and ztensor.Tensor."""
    role = spec.PRIMARY_ROLES.get(format)
    return role if role is not None else next(iter(roles), "data")


def reference_dtype_name(storage, ltype) -> str:
    """An element type by numpy's name (``"float32"``, ``"bfloat16"``), as the
    reference implementation reports ``dtype``: the storage type's name (FP8 codes
    are ``"uint8"``, complex64 is ``"float32"`` with its logical type beside it);
    v2's bool, a logical type over u8, is ``"bool"``."""
    if ltype == "bool":
        return "bool"
    return dtypes.REFERENCE_NAMES.get(storage, storage)


def shape_problem(shape, unit_bytes=16):
    """Why numpy could not make an array of this shape, or None.  numpy multiplies out
    every dimension, zero or not, so the product of the non-zero ones (times the
    element size; 16 covers complex128) must fit in 63 bits, as must each one.  A
    negative dimension is no size at all (numpy reads -1 as "whatever is left", and
    two of them as a product that looks positive)."""
    extent = unit_bytes
    for dim in shape:
        if dim < 0:
            return f"dimension {dim} is negative"
        if dim >= MAX_BYTES:
            return f"dimension {dim} is not below 2**63"
        extent *= dim or 1
    if extent >= MAX_BYTES:
        return "shape is too large: the product of its non-zero dimensions exceeds 2**63 bytes"
    return None


# ComponentSpec's fields that its mapping form holds (and to_dict gives): the
# reference's component dicts' keys (dtype, type, offset, length, encoding) and the
# two the v1.2 manifest adds
COMPONENT_FIELDS = (
    "dtype",
    "type",
    "offset",
    "length",
    "encoding",
    "uncompressed_length",
    "digest",
)


class ComponentSpec(Mapping):
    """One blob of an object.

    Also a read-only mapping of its manifest fields (:data:`COMPONENT_FIELDS`), as
    the reference's component dicts are: ``meta.components["data"]["length"]``,
    ``.get("type")``, ``dict(comp)`` and ``**comp`` work.  It still compares and
    hashes by identity (``dict(comp)`` compares by fields).  Its ``"dtype"`` is the
    spec's name (``"f32"``), as the attribute is; the reference's dicts gave
    numpy's (docs/migrating.md).

    Attributes
    ----------
    role : str
        The component's name within its object (``"data"``, ``"scales"``, ...).
    dtype : str
        Storage type, one of the 13 spec primitives.
    type : str or None
        Logical type (``"f8_e4m3fn"``, ``"complex64"``, ...), or None.
    offset, length : int
        Where the stored bytes are, and how many (compressed size for zstd).
    encoding : str
        ``"raw"`` or ``"zstd"``.
    uncompressed_length : int or None
        Decoded size in bytes (zstd; None for raw).
    digest : str or None
        ``"sha256:<hex>"`` or ``"crc32c:0x<hex>"`` over the stored bytes.
    byteorder : str
        ``"<"`` (every v1 file) or ``">"`` (v0.1 ``data_endianness: "big"``).
    digest_over : str
        ``"stored"`` (v1: the bytes as stored) or ``"decoded"`` (v2 parts).
    shard : str or None
        v2 only: the shard (another file) holding the bytes; None for this file.
    shared : bool
        v2 only: another part (or the manifest) references the same blob, so a
        writable view of these bytes would alias another result (never true for v1
        files: their components are disjoint).
    """

    __slots__ = (
        "role",
        "dtype",
        "type",
        "offset",
        "length",
        "encoding",
        "uncompressed_length",
        "digest",
        "byteorder",
        "aligned",
        "digest_over",
        "shard",
        "shared",
    )

    def __init__(
        self,
        role,
        dtype,
        type,
        offset,
        length,
        encoding="raw",
        uncompressed_length=None,
        digest=None,
        byteorder="<",
        aligned=True,
        digest_over="stored",
        shard=None,
        shared=False,
    ):
        self.role = role
        self.dtype = dtype
        self.type = type
        self.offset = offset
        self.length = length
        self.encoding = encoding
        self.uncompressed_length = uncompressed_length
        self.digest = digest
        self.byteorder = byteorder
        self.aligned = aligned  # False only for parts of a v0.1 sparse blob
        self.digest_over = digest_over
        self.shard = shard
        self.shared = shared

    @property
    def decoded_length(self) -> int:
        """Bytes after decoding: ``length`` for raw, ``uncompressed_length`` for zstd."""
        return self.length if self.encoding == "raw" else self.uncompressed_length

    @property
    def storage(self) -> dtypes.StorageType:
        return dtypes.STORAGE[self.dtype]

    def to_dict(self) -> dict:
        """The component as a plain dict (v1.2 field names)."""
        return dict(self)

    # the Mapping: its keys are COMPONENT_FIELDS, its values the attributes
    def __getitem__(self, key: str) -> Any:
        if key not in COMPONENT_FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(COMPONENT_FIELDS)

    def __len__(self) -> int:
        return len(COMPONENT_FIELDS)

    # compared and hashed by identity, as before it was a mapping (Mapping's own
    # __eq__ compares fields and drops the hash): two blobs with the same fields are
    # still two blobs, and code keeps them in sets; dict(comp) compares by fields
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        extra = f" type={self.type!r}" if self.type else ""
        return (
            f"<ComponentSpec {self.role!r} dtype={self.dtype!r}{extra} offset={self.offset} "
            f"length={self.length} encoding={self.encoding!r}>"
        )


class Shape(tuple):
    """An object's shape: a tuple, as numpy's shapes are, that is also equal to the
    list of the same sizes, which the reference implementation reported
    (``r.metadata("w").shape == [4096, 4096]`` in its users' code)."""

    __slots__ = ()

    def __eq__(self, other):
        if isinstance(other, list):
            return tuple.__eq__(self, tuple(other))
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = tuple.__hash__

    def __getitem__(self, index):
        item = tuple.__getitem__(self, index)
        return Shape(item) if isinstance(index, slice) else item


class ObjectSpec:
    """One named object: shape, format, attributes and components.

    ``dtype``/``storage_dtype`` and ``type`` are those of the object's primary
    component (``data`` for dense, ``values`` for sparse, ``packed_weight`` for
    quantized_group): ``dtype`` by numpy's name (``"float32"``, as the reference
    implementation reports it), ``storage_dtype`` by the spec's (``"f32"``).
    """

    __slots__ = ("name", "shape", "format", "attributes", "components", "legacy", "plan")

    def __init__(self, name, shape, format, attributes, components, legacy=None):
        self.name = name
        self.shape = Shape(shape)
        self.format = format
        self.attributes = attributes
        self.components = components  # role name -> ComponentSpec
        self.legacy = legacy  # v0.1 sparse (layout, value dtype), else None
        self.plan = None  # set by the reader: formats.dense.view_plan, cached

    @property
    def primary(self) -> ComponentSpec | None:
        return self.components.get(primary_role(self.format, self.components))

    @property
    def dtype(self) -> str | None:
        """The primary component's element type by numpy's name (``"float32"``,
        ``"bfloat16"``): the reference implementation's convention, which code
        written against it compares with.  ``storage_dtype`` has the spec's name."""
        comp = self.primary
        return None if comp is None else reference_dtype_name(comp.dtype, comp.type)

    @property
    def storage_dtype(self) -> str | None:
        """The primary component's storage type by the spec's name (``"f32"``)."""
        comp = self.primary
        return None if comp is None else comp.dtype

    @property
    def type(self) -> str | None:
        comp = self.primary
        return None if comp is None else comp.type

    @property
    def tensor_types(self) -> dict:
        """Role -> logical type, plus "bf16" for bf16 storage (whose bits come back as
        uint16 without ml_dtypes): a Tensor read with these types writes back the same
        bytes, and its formats' rules know bf16 bits from uint16 integers."""
        return {
            role: c.type or "bf16"
            for role, c in self.components.items()
            if c.type or c.dtype == "bf16"
        }

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def stored_size(self) -> int:
        """Bytes this object occupies on disk (sum of component lengths)."""
        return sum(c.length for c in self.components.values())

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "format": self.format,
            "dtype": self.dtype,
            "storage_dtype": self.storage_dtype,
            "type": self.type,
            "attributes": dict(self.attributes),
            "components": {r: c.to_dict() for r, c in self.components.items()},
        }

    def __repr__(self) -> str:
        return (
            f"<ObjectSpec {self.name!r} format={self.format!r} shape={list(self.shape)} "
            f"dtype={self.dtype!r}>"
        )
