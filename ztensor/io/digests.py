"""Component digests: ``"crc32c:0x%08X"`` and ``"sha256:<64 hex>"`` over the stored
(possibly compressed) bytes, as the reference implementation writes them; v2 files'
``"xxh3:<16 hex>"`` and ``"sha256:"`` cover the decoded bytes (the caller decodes)."""

from __future__ import annotations

import hashlib
from typing import Optional

from ztensor import kernels
from ztensor.errors import ChecksumError, UnsupportedError

ALGORITHMS = ("crc32c", "sha256")


class Hasher:
    """Incremental digest of one of :data:`ALGORITHMS`."""

    def __init__(self, algorithm: str):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"checksum must be None, 'crc32c' or 'sha256', got {algorithm!r}")
        self.algorithm = algorithm
        self._crc = 0
        self._sha = hashlib.sha256() if algorithm == "sha256" else None

    def update(self, data) -> None:
        if self._sha is not None:
            self._sha.update(data)
        else:
            self._crc = kernels.crc32c(data, self._crc)

    def digest(self) -> str:
        if self._sha is not None:
            return "sha256:" + self._sha.hexdigest()
        return f"crc32c:0x{self._crc:08X}"


def verify(stored, digest: str, **where) -> None:
    """Raise ChecksumError unless ``stored`` matches ``digest`` (validated syntax).
    ``xxh3:<16 hex>`` (XXH3-64, zTensor v2's part digest) is verified too."""
    hasher = incremental(digest, **where)
    if hasher is None:  # xxh3: one call over the whole buffer
        expected = digest.partition(":")[2]
        actual = f"{kernels.xxh3_64(memoryview(stored).cast('B')):016x}"
        if actual != expected.lower():
            raise ChecksumError(
                f"xxh3 mismatch: manifest says {expected}, the bytes give {actual}", **where
            )
        return
    hasher.update(stored)
    check(hasher, digest, **where)


def incremental(digest: str, **where) -> Optional[Hasher]:
    """A :class:`Hasher` to feed the bytes ``digest`` covers piece by piece, then
    :func:`check`; None for ``xxh3`` (the C kernel hashes one whole buffer: check
    those with :func:`verify`).  UnsupportedError for an unknown algorithm."""
    algorithm = digest.partition(":")[0].lower()
    if algorithm == "xxh3":
        return None
    if algorithm not in ALGORITHMS:
        raise UnsupportedError(
            f"cannot verify digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})",
            **where,
        )
    return Hasher(algorithm)


def check(hasher: Hasher, digest: str, **where) -> None:
    """ChecksumError unless the bytes fed to ``hasher`` (from :func:`incremental`)
    match ``digest``: the one comparison of a crc32c or sha256 digest."""
    expected = digest.partition(":")[2]
    actual = hasher.digest().partition(":")[2]
    if hasher.algorithm == "crc32c":
        same = int(actual, 16) == int(expected, 16)
    else:
        same = actual == expected.lower()
    if not same:
        raise ChecksumError(
            f"{hasher.algorithm} mismatch: manifest says {expected}, stored bytes give {actual}",
            **where,
        )
