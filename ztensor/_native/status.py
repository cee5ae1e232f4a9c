"""C status codes (csrc/zt_status.h) and the error each one becomes.

Shared by the compiled kernels and the numpy fallback, so both raise the same
exception with the same words for the same problem.  The numbers mirror the C
header; ``_kernels.STATUS_CODES`` exports the header's own values and a test
checks the two agree.
"""

from ztensor import errors

(
    OK,
    ARG,
    TRUNCATED,
    BAD_MAGIC,
    BAD_FOOTER_MAGIC,
    MANIFEST_TOO_LARGE,
    MANIFEST_OUT_OF_BOUNDS,
    IO,
    NOMEM,
    CBOR_MALFORMED,
    CBOR_TAG,
    CBOR_DEPTH,
    CBOR_KEY,
    GROUP_INDEX,
) = range(14)

NAMES = {
    "OK": OK,
    "ARG": ARG,
    "TRUNCATED": TRUNCATED,
    "BAD_MAGIC": BAD_MAGIC,
    "BAD_FOOTER_MAGIC": BAD_FOOTER_MAGIC,
    "MANIFEST_TOO_LARGE": MANIFEST_TOO_LARGE,
    "MANIFEST_OUT_OF_BOUNDS": MANIFEST_OUT_OF_BOUNDS,
    "IO": IO,
    "NOMEM": NOMEM,
    "CBOR_MALFORMED": CBOR_MALFORMED,
    "CBOR_TAG": CBOR_TAG,
    "CBOR_DEPTH": CBOR_DEPTH,
    "CBOR_KEY": CBOR_KEY,
    "GROUP_INDEX": GROUP_INDEX,
}

TABLE = {
    ARG: (errors.KernelArgumentError, "invalid kernel arguments"),
    TRUNCATED: (errors.FormatError, "file is truncated: too short for header and footer"),
    BAD_MAGIC: (errors.FormatError, "not a zTensor file: unknown magic in the header"),
    BAD_FOOTER_MAGIC: (
        errors.FormatError,
        "footer magic 'ZTEN1000' missing: file is truncated or corrupt",
    ),
    MANIFEST_TOO_LARGE: (errors.LimitError, "manifest_size exceeds the manifest limit"),
    MANIFEST_OUT_OF_BOUNDS: (errors.FormatError, "manifest_size is larger than the file can hold"),
    NOMEM: (errors.LimitError, "out of memory in a kernel"),
    GROUP_INDEX: (errors.FormatError, "g_idx holds a group number outside [0, G)"),
}


def raise_for_status(status: int, what: str, path=None) -> None:
    """Raise the exception for a non-zero kernel status."""
    if status == OK:
        return
    cls, message = TABLE[status]
    raise cls(f"{message} ({what})", path=path)


def raise_cbor(status: int, why: str, offset: int, tag: int, max_depth: int, path=None):
    """The FormatError for a refused manifest (csrc/cbor_scan.c's verdict)."""
    if status == CBOR_TAG:
        why = (
            f"CBOR tag {tag} (manifests hold plain data: only tags 2 and 3, bignums, "
            "and 55799 are allowed)"
        )
    elif status == CBOR_DEPTH:
        why = f"CBOR nesting deeper than {max_depth} levels"
    elif status == CBOR_MALFORMED:
        raise errors.FormatError(f"manifest is not valid CBOR: {why} (byte {offset})", path=path)
    elif status != CBOR_KEY:
        raise_for_status(status, "scanning the manifest", path)
    raise errors.FormatError(f"manifest refused: {why} (byte {offset})", path=path)


def raise_canonical(status: int, why: str, offset: int, max_depth: int, path=None):
    """The FormatError for a v2 manifest that is not deterministic CBOR."""
    if status == CBOR_TAG:
        why = "a CBOR tag (v2 manifests use none)"
    elif status == CBOR_DEPTH:
        why = f"nesting deeper than {max_depth} levels"
    elif status != CBOR_MALFORMED:
        raise_for_status(status, "checking the manifest", path)
    raise errors.FormatError(
        f"manifest is not deterministic CBOR: {why} (byte {offset})", path=path
    )


def footer_context(manifest_size: int, file_size: int, max_manifest: int) -> str:
    """The numbers behind a footer error, for its message."""
    return (
        f"reading the footer: manifest_size={manifest_size}, file size={file_size}, "
        f"limit={max_manifest}"
    )
