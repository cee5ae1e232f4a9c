"""Constants of the zTensor format and the table of versions we read.

Byte layout (v1.x, magic ``ZTEN1000``)::

    offset 0          8                                  EOF-16         EOF-8      EOF
    | "ZTEN1000" | blob | 0-pad | blob | ... | CBOR manifest | size u64 LE | "ZTEN1000" |
                 ^ every blob starts at a multiple of 64

Legacy v0.1 (magic ``ZTEN0001``) has no footer magic: the last 8 bytes are the
size of a CBOR *array* of per-tensor maps.

Per-version differences live in :data:`VERSIONS`, one row each, so a legacy
version is a table row and a small lifting step in ``manifest.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

MAGIC_V1 = b"ZTEN1000"
MAGIC_V0 = b"ZTEN0001"
MAGIC_SIZE = 8
TAIL_SIZE = 16          # v1: manifest size (u64 LE) + footer magic
ALIGNMENT = 64          # every blob offset is a multiple of this
WRITE_VERSION = "1.2.0"  # what Writer puts in "version"
SPEC_MAX_MANIFEST = 1 << 30  # the spec's 1 GB manifest ceiling

DEFAULT_ZSTD_LEVEL = 3

# The component whose dtype and type an object reports, per format (others: the first).
PRIMARY_ROLES = {"dense": "data", "sparse_csr": "values", "sparse_coo": "values",
                 "quantized_group": "packed_weight", "gguf_blocks": "blocks"}

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
    magic: bytes
    tail_size: int                      # bytes after the manifest
    manifest_is_array: bool             # v0.1: CBOR array of per-tensor maps
    requires_uncompressed_length: bool  # zstd components must declare their size


VERSIONS = {
    "0.1": VersionInfo("0.1", MAGIC_V0, 8, True, False),
    "1.1": VersionInfo("1.1", MAGIC_V1, 16, False, False),
    "1.2": VersionInfo("1.2", MAGIC_V1, 16, False, True),
}


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
    """

    max_manifest_size: int = SPEC_MAX_MANIFEST
    max_component_size: int = 1 << 40
    max_total_decompressed: int = 1 << 42
    max_rank: int = 64
    max_objects: int = 10_000_000

    def with_(self, **changes) -> "Limits":
        """A copy with some limits changed."""
        return replace(self, **changes)


DEFAULT_LIMITS = Limits()


def parse_version(text) -> tuple:
    """``"1.2.0"`` -> ``(1, 2)``; anything else -> ``None``."""
    if not isinstance(text, str):
        return None
    parts = text.split(".")
    if len(parts) < 2 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def version_info(major: int, minor: int) -> VersionInfo:
    """The row for a v1.x manifest.  Minor versions after 1.2 only add optional
    fields (spec's version policy), so they are read with the 1.2 rules."""
    return VERSIONS["1.1"] if (major, minor) <= (1, 1) else VERSIONS["1.2"]
