"""C status codes (csrc/zt_status.h) and the error each one becomes.

Shared by the compiled kernels and the numpy fallback, so both raise the same
exception with the same words for the same problem.
"""
from ztensor import errors

OK, ARG, TRUNCATED, BAD_MAGIC, BAD_FOOTER_MAGIC, MANIFEST_TOO_LARGE, \
    MANIFEST_OUT_OF_BOUNDS, IO, NOMEM = range(9)

TABLE = {
    ARG: (errors.ZTensorError, "internal error: invalid kernel arguments"),
    TRUNCATED: (errors.FormatError, "file is truncated: too short for header and footer"),
    BAD_MAGIC: (errors.FormatError, "not a zTensor file: unknown magic in the header"),
    BAD_FOOTER_MAGIC: (errors.FormatError,
                       "footer magic 'ZTEN1000' missing: file is truncated or corrupt"),
    MANIFEST_TOO_LARGE: (errors.LimitError, "manifest_size exceeds the manifest limit"),
    MANIFEST_OUT_OF_BOUNDS: (errors.FormatError,
                             "manifest_size is larger than the file can hold"),
    NOMEM: (MemoryError, "out of memory in a kernel"),
}


def raise_for_status(status: int, what: str, path=None) -> None:
    """Raise the exception for a non-zero kernel status."""
    if status == OK:
        return
    cls, message = TABLE[status]
    if cls is MemoryError:
        raise MemoryError(message)
    raise cls(f"{message} ({what})", path=path)


def footer_context(manifest_size: int, file_size: int, max_manifest: int) -> str:
    """The numbers behind a footer error, for its message."""
    return (f"reading the footer: manifest_size={manifest_size}, file size={file_size}, "
            f"limit={max_manifest}")
