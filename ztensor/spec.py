"""Constants of the zTensor format and the table of versions we read.

Byte layout (v1.x, magic ``ZTEN1000``)::

    offset 0          8                                  EOF-16         EOF-8      EOF
    | "ZTEN1000" | blob | 0-pad | blob | ... | CBOR manifest | size u64 LE | "ZTEN1000" |
                 ^ every blob starts at a multiple of 64

Legacy v0.1 (magic ``ZTEN0001``) has no footer magic: the last 8 bytes are the
size of a CBOR *array* of per-tensor maps.

Per-version differences live in :data:`VERSIONS`, one row each, so a legacy
version is a table row and a small lifting step in ``legacy.py``.  The magic bytes
of every file kind ztensor recognises are here too (:data:`MAGICS`), for the
readers and the format sniffers to share.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

import numpy as np

from ztensor.errors import LimitError

MAGIC_V1 = b"ZTEN1000"
MAGIC_V0 = b"ZTEN0001"
MAGIC_SIZE = 8
MAGIC_PREFIX = b"ZTEN"  # what v0.1 and v1.x magics share
MAGIC_V2 = b"\x89ZT2\r\n\x1a\n"  # the v2 container (container_v2.py), head and footer
# The first bytes of the other formats we read, for the sniffers (foreign.detect,
# importers) and the readers that check their own header.
MAGIC_GGUF = b"GGUF"
MAGIC_NPY = b"\x93NUMPY"
MAGIC_HDF5 = b"\x89HDF\r\n\x1a\n"
MAGIC_ZIP = b"PK\x03\x04"  # a zip's first local file header (npz, torch.save)
MAGIC_ZIP_EMPTY = b"PK\x05\x06"  # an empty zip: its end-of-central-directory record
# every magic above by name: the one table (tests check that no module spells one out)
MAGICS = {
    "zt_v1": MAGIC_V1,
    "zt_v0": MAGIC_V0,
    "zt_v2": MAGIC_V2,
    "gguf": MAGIC_GGUF,
    "npy": MAGIC_NPY,
    "hdf5": MAGIC_HDF5,
    "zip": MAGIC_ZIP,
    "zip_empty": MAGIC_ZIP_EMPTY,
}
TAIL_SIZE = 16  # v1: manifest size (u64 LE) + footer magic
ALIGNMENT = 64  # every blob offset is a multiple of this
WRITE_VERSION = "1.2.0"  # what Writer puts in "version"
SPEC_MAX_MANIFEST = 1 << 30  # the spec's 1 GB manifest ceiling
MAX_RANK = 64  # the spec's rank ceiling: Limits' default, and v2's hard limit

DEFAULT_ZSTD_LEVEL = 3
# the zstd levels the Writer takes (0 and False: raw): zstd's own range
MIN_ZSTD_LEVEL, MAX_ZSTD_LEVEL = -(1 << 17), 22

# The component whose dtype and type an object reports, per format (others: the first).
PRIMARY_ROLES = {
    "dense": "data",
    "sparse_csr": "values",
    "sparse_coo": "values",
    "quantized_group": "packed_weight",
    "gguf_blocks": "blocks",
}

# The most a zstd stream can expand: every block has a 3-byte header and yields at
# most 128 KiB, and the densest block is RLE (header + 1 byte), so n bytes of zstd
# decode to at most n / 4 * 128 KiB.  A declared size above that is a lie the reader
# refuses at open, before anything is allocated (docs/safety.md).
ZSTD_MAX_RATIO = (128 << 10) // 4


def zstd_max_output(compressed_length: int) -> int:
    """Upper bound on what ``compressed_length`` bytes of zstd frames can decode to."""
    return compressed_length * ZSTD_MAX_RATIO


@dataclass(frozen=True)
class VersionInfo:
    """What differs between the format versions ztensor reads."""

    name: str
    magic: bytes  # the header's (and v1's footer's) magic
    tail_size: int  # bytes after the manifest
    requires_uncompressed_length: bool  # zstd components must declare their size


# Read by the footer parser (the numpy twin of csrc/footer.c: magic and tail size;
# the C one has them as constants, checked by tests/native/test_c_constants.py) and by the
# manifest checks (requires_uncompressed_length).  v0.1's manifest is a CBOR array
# of per-tensor maps, which legacy.py lifts.
VERSIONS = {
    "0.1": VersionInfo("0.1", MAGIC_V0, 8, False),
    "1.1": VersionInfo("1.1", MAGIC_V1, TAIL_SIZE, False),
    "1.2": VersionInfo("1.2", MAGIC_V1, TAIL_SIZE, True),
}


U64_MAX = (1 << 64) - 1  # a limit above it means the same as it (Limits.__post_init__)


@dataclass(frozen=True)
class Limits:
    """Safety limits applied to every file before its data is touched.

    Each can be raised (or lowered) by passing ``limits=Limits(...)`` to
    :class:`ztensor.Reader`.  A violation raises :class:`ztensor.LimitError` with the
    numbers in its message.

    Attributes
    ----------
    max_manifest_size : int
        Largest manifest accepted, in bytes (the spec's 1 GiB by default).
    max_component_size : int
        Largest decoded size of one component (``uncompressed_length`` for zstd), in bytes.
    max_total_decompressed : int
        Largest sum of ``uncompressed_length`` over all zstd components of a file.
    max_rank : int
        Largest number of dimensions of an object's shape.
    max_objects : int
        Largest number of objects in one file.
    max_reads_per_file_byte : int
        How many times over the bytes a file's data takes the named tensors may read
        them, where a format lets names share bytes (``torch.save`` views, v2 objects
        over one blob, HDF5 hard links): see :func:`check_visits`.  Raise it for a
        trusted file that names one tensor very often (``ModuleList([block] * 100)``).

    Each is a non-negative int (numpy integers, and floats holding a whole number
    such as ``1e7``, taken): anything else (nan, 2.5, None) is a TypeError,
    a negative one a ValueError, naming the field.  Values above 2**64 - 1 are kept
    as 2**64 - 1, which no size reaches.
    """

    max_manifest_size: int = SPEC_MAX_MANIFEST
    max_component_size: int = 1 << 40
    max_total_decompressed: int = 1 << 42
    max_rank: int = MAX_RANK
    max_objects: int = 10_000_000
    max_reads_per_file_byte: int = 64

    def __post_init__(self) -> None:
        # checked here, once, not at each use: nan compared False with every size (it
        # switched a limit off), a negative one reached C as a bare OverflowError, and
        # a float, a string or None failed mid-read, or not at all
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (float, np.floating)) and float(value).is_integer():
                value = int(value)  # Limits(max_objects=1e7): a whole number, as written
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise TypeError(
                    f"Limits.{f.name} must be a whole number, not {value!r:.40}"
                    if isinstance(value, (float, np.floating))
                    else f"Limits.{f.name} must be an int, not {type(value).__name__}"
                )
            if value < 0:
                raise ValueError(f"Limits.{f.name} must not be negative, got {value}")
            # a plain int, and none above what a u64 holds (the C checks take u64s):
            # no size, count or rank is larger, so the limit means the same
            object.__setattr__(self, f.name, min(int(value), U64_MAX))

    def with_(self, **changes: int) -> "Limits":
        """A copy with some limits changed."""
        return replace(self, **changes)


DEFAULT_LIMITS = Limits()


def limits_given(limits: object) -> Limits:
    """The limits a caller passed as ``limits=``: None is the defaults; anything but
    a :class:`Limits` is a TypeError saying so (an int or a dict reached the first
    check as a bare AttributeError)."""
    if limits is None:
        return DEFAULT_LIMITS
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a ztensor.Limits, not {type(limits).__name__}")
    return limits


def parse_version(text: object) -> tuple[int, int] | None:
    """``"1.2.0"`` -> ``(1, 2)``; anything else -> ``None``.  Only ASCII digits:
    ``str.isdigit`` also takes ``"²"`` and ``"٢"``, which ``int`` then refuses or
    reads as another version."""
    if not isinstance(text, str) or not text.isascii():
        return None
    parts = text.split(".")
    if len(parts) < 2 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def version_info(major: int, minor: int) -> VersionInfo:
    """The row for a v1.x manifest.  Minor versions after 1.2 only add optional
    fields (spec's version policy), so they are read with the 1.2 rules."""
    return VERSIONS["1.1"] if (major, minor) <= (1, 1) else VERSIONS["1.2"]


# what a read of every named tensor of one file may visit in any case, beyond the
# decoded bytes and Limits.max_reads_per_file_byte times the file's (check_visits)
VISITS_ALLOWED = 64 << 20


def check_visits(path, visited: int, decoded: int, present: int, limits: Limits) -> None:
    """LimitError naming ``path`` unless ``visited``, the bytes a read of every named
    tensor of a file visits, is at most ``decoded`` (the bytes those tensors' data
    decode to, each blob, storage or dataset counted once) plus
    ``limits.max_reads_per_file_byte`` times ``present`` (the bytes that data takes in
    the file) plus :data:`VISITS_ALLOWED`.

    THE rule for bytes read under many names, for every format that lets names share
    them: overlapping ``torch.save`` views, v2 objects that reference one blob, HDF5
    datasets with many hard links.  Decoding is paid once, as for any compressed file
    (within ``Limits.max_total_decompressed``); reading the same bytes again under
    another name is held to the bytes present, so a small file cannot make ``stats``
    or ``verify`` read gigabytes: 2,000 v2 objects over one 16 MiB blob made ``verify``
    hash 32 GiB, and two overlapping views of a deflated 128 MiB storage (131 KB of
    file) made ``stats`` read 8 GiB.  Real files name each byte a few times (tied
    weights, a fused projection split in three); a trusted file that names one tensor
    a hundred times is read with the limit raised."""
    per_byte = limits.max_reads_per_file_byte
    allowed = decoded + per_byte * present + VISITS_ALLOWED
    if visited > allowed:
        raise LimitError(
            f"its tensors read {visited} bytes of data that decodes to {decoded} "
            f"bytes from {present} bytes of file: names that read the same bytes more than "
            f"{per_byte} times over the file's bytes are refused (work follows the bytes "
            "present; Limits.max_reads_per_file_byte raises it for a trusted file)",
            path=path,
        )


def check_file_totals(
    path,
    limits: Limits,
    objects: int = 0,
    manifest_size: int = 0,
    *,
    ceiling: Optional[int] = None,
) -> None:
    """LimitError naming ``path`` (the user's input file) unless a reader with
    ``limits`` takes a file of ``objects`` objects whose manifest (or header: the
    names, shapes and attributes of another format) is ``manifest_size`` bytes: at
    most ``limits.max_objects`` objects, and a manifest of at most
    ``limits.max_manifest_size`` bytes and never above ``ceiling`` (the spec's 1 GiB
    by default; a format whose own readers stop lower passes its bound).

    THE file-wide totals rule, for every kind of input: the .zt reader applies it to
    every manifest it decodes and the writer to the manifest it is about to write
    (so it never finishes a file a default Reader refuses), and the v2 reader and
    every foreign reader (safetensors, GGUF, ONNX, npy/npz, PyTorch, HDF5) to what
    they read, so a limit reads the same, and refuses the same, whatever the input.
    A reader that counts as it walks calls it with the count so far; one that learns
    the manifest's size before its objects calls it twice."""
    # the spec's ceiling read at the call, not bound when this module was imported
    most = min(limits.max_manifest_size, SPEC_MAX_MANIFEST if ceiling is None else ceiling)
    if manifest_size > most:
        raise LimitError(
            f"a manifest (names, shapes, attributes) of {manifest_size} bytes exceeds "
            f"the limit of {most}"
            + (" (Limits.max_manifest_size)" if most == limits.max_manifest_size else ""),
            path=path,
        )
    if objects > limits.max_objects:
        raise LimitError(
            f"{objects} objects exceed the limit of {limits.max_objects} (Limits.max_objects)",
            path=path,
        )
