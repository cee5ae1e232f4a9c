"""Writing to object stores and other fsspec URLs (``s3://``, ``gs://``, ``memory://``...).

The one place an upload happens: :class:`ztensor.Writer` and
:func:`ztensor.save_sharded`'s index both go through :meth:`Upload.commit`.

The Writer builds the file in a local temporary file exactly as it builds a local
one (every check it makes applies unchanged), and only a successful ``close``
uploads it.  The promise of a local write holds: the object at the URL is complete
or absent, never torn, and a failure leaves no object behind, temporary or final.

How the upload keeps it:

* ``s3``, ``gs`` and Azure (``az``, ``abfs``): one upload straight to the final key.
  These stores make an object visible only when its upload completes (S3's
  PutObject and CompleteMultipartUpload, GCS's finalised upload, Azure's block-list
  commit), and s3fs aborts a multipart upload that fails.  A temporary key and a
  copy would cost a second server-side copy of every byte and give nothing more:
  these stores have no rename.
* every other writable filesystem (``memory://``, sftp, ...): the file is uploaded
  to a hidden temporary key beside the final one and then moved onto it
  (``fs.mv``); a failure removes the temporary key.  Their uploads may write in
  place, so a reader could see a torn object at the final key.

An upload interrupted in the process (Ctrl-C, the command's SIGTERM) is cancelled
with the call and its multipart upload aborted (:meth:`Upload._put`): it does not
run on in fsspec's loop thread.  A process killed mid-upload can still leave what
the store keeps of an unfinished upload (S3's invisible multipart parts, a
temporary key): a store's lifecycle rules clear those, as for any client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import tempfile
from collections.abc import Mapping
from typing import Any, Optional

from ztensor.errors import UnsupportedError, WriteError, ZTensorError
from ztensor.io.source import botocore_reason, url_filesystem
from ztensor.io.source import is_url as _is_url

# stores whose single upload becomes visible whole, only once complete
_ATOMIC_PUT = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
# seconds an interrupted upload is given to stop (Upload._put)
_SETTLE = 30.0
# protocols an object cannot be written to (fsspec's HTTP "put" is a POST of the
# bytes to a URL, which no server takes as storing a file there)
_NOT_WRITABLE = frozenset({"http", "https"})


def is_url(path: Any) -> bool:
    """True for a string naming an fsspec URL (the rule of
    :func:`ztensor.io.source.is_url`)."""
    return _is_url(path)


def check_storage_options(path: Any, storage_options: Any) -> Optional[dict]:
    """The storage options to use for ``path``: a copy of ``storage_options`` for an
    fsspec URL, None for a local path.  The one rule every function taking
    ``storage_options=`` applies (Reader, safe_open, open_sharded, save_sharded,
    Writer, the save and load functions, ztensor.dask).

    Options that are not a mapping are a TypeError; non-empty options with a local
    path, a file object or bytes are a ValueError (pandas' rule: they would be
    silently ignored, and a caller who passed credentials meant a URL)."""
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping):
        raise TypeError(
            "storage_options must be a dict (fsspec's options for the URL's "
            f"filesystem), not {type(storage_options).__name__}"
        )
    if not is_url(path):
        if storage_options:
            shown = (
                os.fspath(path)
                if isinstance(path, (str, os.PathLike))
                else f"a {type(path).__name__}"
            )
            raise ValueError(
                f"storage_options passed with a non-URL path ({shown!r}): "
                "they are for fsspec URLs such as s3://bucket/model.zt"
            )
        return None
    return dict(storage_options)


def _filesystem(url: str, storage_options: Optional[dict]):
    """(filesystem, path inside it, protocol) for ``url``."""
    protocol = url.split("://", 1)[0].lower()
    if protocol in _NOT_WRITABLE:
        raise UnsupportedError(
            f"cannot write a file to an {protocol} URL: write to an "
            "object store (s3://, gs://, ...) or a local path",
            path=url,
        )
    # no such protocol, a chain, a local file: source.url_filesystem's refusals
    fs, inner = url_filesystem(url, storage_options)
    return fs, inner, protocol


class Upload:
    """Where a file written locally goes at the end: the object at ``url``.

    Built before any byte is written, so a URL that cannot be written to (no
    fsspec, an unknown protocol, HTTP) is refused at once."""

    def __init__(self, url: str, storage_options: Optional[dict] = None) -> None:
        self.url = url
        self.fs, self.key, protocol = _filesystem(url, storage_options)
        self.atomic = protocol in _ATOMIC_PUT
        if not self.key.strip("/"):  # memory:// or s3://bucket/: no object's name
            raise WriteError("names no object to write (a store or bucket root)", path=url)
        self._refuse_folder()

    def _refuse_folder(self) -> None:
        """WriteError when the key is a folder of a store with folders (memory://,
        sftp): its ``mv`` of the temporary key onto a folder moved the file INTO the
        folder, under its hidden temporary name, and the write was reported done
        (local paths: atomic.final_target's rule).  Object stores have prefixes, not
        folders: a key may share its name with one, and they are not asked."""
        if self.atomic:
            return
        try:
            folder = self.fs.isdir(self.key)
        except Exception:
            return  # the store will not say: its upload will
        if folder:
            raise WriteError(
                "is a directory, not a file: a file written here would go inside it",
                path=self.url,
            )

    @classmethod
    def for_path(cls, path: str, storage_options: Any = None) -> Optional["Upload"]:
        """An Upload for a URL, None for a local path (options checked by
        :func:`check_storage_options` either way)."""
        options = check_storage_options(path, storage_options)
        return cls(path, options) if is_url(path) else None

    def create_temp(self):
        """(descriptor, path) of a new local file to build the object in (the system
        temporary folder: ``TMPDIR`` chooses it)."""
        try:
            return tempfile.mkstemp(prefix=".zt-upload-", suffix=".tmp")
        except OSError as exc:
            raise WriteError(
                f"cannot create a local temporary file to build the object "
                f"in: {exc.strerror or exc}",
                path=self.url,
                errno=exc.errno,
            ) from exc

    def commit(self, local: str) -> None:
        """Upload the complete file ``local`` to the URL (see the module doc for how
        it stays whole) and remove ``local``, whatever happens.  A failure is a
        WriteError naming the URL, and leaves no temporary object behind."""
        try:
            if self.atomic:
                self._put(local, self.key)
            else:
                parent, _, base = self.key.rstrip("/").rpartition("/")
                temp = (
                    f"{parent}/.{base}.{secrets.token_hex(6)}.tmp"
                    if parent
                    else f".{base}.{secrets.token_hex(6)}.tmp"
                )
                try:
                    self._put(local, temp)
                    self._refuse_folder()  # made one since the Writer began
                    self.fs.mv(temp, self.key)
                except BaseException:
                    self._discard(temp)
                    raise
        except ZTensorError:
            raise
        except Exception as exc:
            raise WriteError(
                f"cannot upload the file: {_reason(exc)}",
                path=self.url,
                errno=getattr(exc, "errno", None),
            ) from exc
        finally:
            try:
                os.unlink(local)
            except FileNotFoundError:
                pass

    def write_json(self, value: Any) -> None:
        """Upload ``value`` as the JSON a local sharded index holds (indented, keys
        sorted), whole (:meth:`commit`)."""
        import json

        fd, tmp = self.create_temp()
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(value, f, indent=2, sort_keys=True)
                f.write("\n")
        except BaseException:
            os.unlink(tmp)
            raise
        self.commit(tmp)

    def remove(self) -> None:
        """Delete the object at the URL if there is one (save_sharded's earlier
        index); a failure is a WriteError naming the URL."""
        try:
            if self.fs.exists(self.key):
                self.fs.rm_file(self.key)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise WriteError(
                f"cannot remove the earlier object: {_reason(exc)}",
                path=self.url,
                errno=getattr(exc, "errno", None),
            ) from exc

    def _put(self, local: str, key: str) -> None:
        """Upload ``local`` to ``key``, stopped when the caller is interrupted.

        fsspec's ``put_file`` of an async filesystem (s3fs, gcsfs, adlfs) runs the
        upload on fsspec's event loop thread and waits for it; a KeyboardInterrupt
        (Ctrl-C, the command's SIGTERM) ended the wait but not the upload, which
        went on in the background and made the object appear after the caller was
        told the write failed (and could land over a retry's newer object).  Here
        the wait is ours: on any interruption the upload is cancelled and waited for
        (at most _SETTLE seconds), and a multipart upload it left (s3fs aborts one
        only on an Exception, not on cancellation) is aborted."""
        fs = self.fs
        if not getattr(fs, "async_impl", False) or getattr(fs, "loop", None) is None:
            fs.put_file(local, key)
            return
        before = self._unfinished(key)
        future = asyncio.run_coroutine_threadsafe(fs._put_file(local, key), fs.loop)
        try:
            future.result()
        except BaseException:
            if future.cancel():
                concurrent.futures.wait([future], timeout=_SETTLE)
            self._abort_unfinished(key, before)
            raise

    def _unfinished(self, key: str) -> Optional[set]:
        """The ids of the multipart uploads to ``key`` now unfinished (S3 only;
        None elsewhere, or when the store will not say)."""
        if not hasattr(self.fs, "call_s3"):
            return None
        bucket, path, _ = self.fs.split_path(key)
        try:
            listed = self.fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=path)
        except Exception:
            return None
        return {u["UploadId"] for u in listed.get("Uploads", []) if u.get("Key") == path}

    def _abort_unfinished(self, key: str, before: Optional[set]) -> None:
        """Abort the multipart uploads to ``key`` begun since ``before`` was listed
        (the one this upload started), best effort: the error that led here is
        the one raised."""
        if before is None:
            return
        now = self._unfinished(key)
        bucket, path, _ = self.fs.split_path(key)
        for upload_id in (now or set()) - before:
            try:
                self.fs.call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=path, UploadId=upload_id
                )
            except Exception:
                pass

    def _discard(self, key: str) -> None:
        try:
            self.fs.rm_file(key)
        except Exception:
            pass  # never uploaded, or already gone: the failure that led here is raised


def join(folder: str, name: str) -> str:
    """The URL of object ``name`` in ``folder`` (a URL): object keys are joined with
    ``/`` and not percent-encoded."""
    return f"{folder.rstrip('/')}/{name}"


def _reason(exc: BaseException) -> str:
    said = botocore_reason(exc)  # no credentials: where to give them, as a read says
    if said is not None:
        return said
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, OSError) else text
