"""READ 1 / WRITE last: the file tail that locates the manifest.

::

    v1.x:  ... | CBOR manifest | manifest_size: u64 LE | "ZTEN1000" |  (EOF)
    v0.1:  ... | CBOR array    | size: u64 LE |                        (EOF)

The header magic (first 8 bytes) says which tail to expect.  The checks run in
C (csrc/footer.c) on the first 8 and last 16 bytes alone.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ztensor import kernels, spec


@dataclass(frozen=True)
class Footer:
    family: int  # 0: v0.1 ("ZTEN0001"), 1: v1.x ("ZTEN1000")
    manifest_offset: int  # also the end of the blob region
    manifest_size: int


def read_footer(source, limits, head=None) -> Footer:
    """Validate the header and tail of ``source`` and locate the manifest.  ``head``:
    its first ``min(MAGIC_SIZE, size)`` bytes where the caller has read them already
    (over a URL each read is a request of its own)."""
    size = source.size
    if head is None:
        head = source.view(0, min(spec.MAGIC_SIZE, size), "header")
    tail = source.view(size - min(spec.TAIL_SIZE, size), min(spec.TAIL_SIZE, size), "footer")
    family, offset, length = kernels.footer_parse(
        head, tail, size, limits.max_manifest_size, source.name
    )
    return Footer(family, offset, length)


def encode_footer(manifest_size: int) -> bytes:
    """The 16-byte v1 tail for a manifest of ``manifest_size`` bytes."""
    return struct.pack("<Q", manifest_size) + spec.MAGIC_V1
