"""The ztensor exception hierarchy.

Every error ztensor raises on purpose is a :class:`ZTensorError`.  Subclasses also
inherit the builtin a caller would naturally catch (``ValueError`` for malformed
files, ``KeyError`` for a missing object, ``OSError`` for a failed write), and each
carries the file, object and component it is about, so the message alone says
where the problem is::

    model.zt: object 'layer.0.weight', component 'data': offset 100 is not a multiple of 64
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
import re
from typing import Any, Iterator, Optional

__all__ = [
    "ZTensorError",
    "FormatError",
    "ChecksumError",
    "LimitError",
    "UnsupportedError",
    "ObjectNotFoundError",
    "WriteError",
    "KernelArgumentError",
    "ClosedError",
    "SafetensorError",
    "NotAFileError",
    "NetworkError",
    "NetworkNotFoundError",
    "NetworkPermissionError",
    "NetworkTimeoutError",
    "NetworkConnectionError",
    "SliceError",
    "SliceTypeError",
    "SliceValueError",
    "SliceRuntimeError",
]


class ZTensorError(Exception):
    """Base class of every ztensor error.

    Parameters
    ----------
    message : str
        What is wrong.
    path : str, optional
        The file (or ``"<bytes>"`` for an in-memory source).
    obj : str, optional
        The object's name.
    component : str, optional
        The component's role name (``"data"``, ``"scales"``, ...).
    """

    def __init__(self, message: str, *, path=None, obj=None, component=None):
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.obj = obj
        self.component = component
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.obj is not None:
            where.append(f"object {_short(self.obj)}")
        if self.component is not None:
            where.append(f"component {_short(self.component)}")
        text = ", ".join(where)
        if text:
            text += ": "
        prefix = f"{self.path}: " if self.path is not None else ""
        # the path is one URL whole: its secrets go however many spaces it holds
        shown = without_secrets(f"{prefix}{text}{self.message}", self.path)
        # then one line: a message quoting another library's error (transformers'
        # validators, h5py, protobuf) may hold several, and a refusal is one line
        return " ".join(part.strip() for part in shown.splitlines()) if "\n" in shown else shown

    def __str__(self) -> str:  # KeyError would otherwise print repr(args[0])
        return self._render()

    def locate(self, path: Any, obj: Optional[str] = None) -> None:
        """Name the file (and the object) this error was raised without, where the
        code that raised it knew neither (an unpickler, a kernel handed a Tensor):
        what the error already names is kept.  The caller then re-raises it, its
        class and attributes unchanged."""
        if self.path is None:
            self.path = os.fspath(path)
        if self.obj is None:
            self.obj = obj
        self.args = (self._render(),)

    def replace_path(self, internal: str, shown: str) -> None:
        """Name the file ``shown`` wherever this error names ``internal`` (its
        ``path`` and its message), and render it again.  For errors raised through
        a temporary file the caller never saw (``_save.named_as_bytes``)."""
        if self.path is not None and os.fspath(self.path) == internal:
            self.path = shown
        self.message = self.message.replace(internal, shown)
        self.args = (self._render(),)

    def rename(self, shown: str, note: str = "") -> None:
        """Name the file ``shown`` in place of the one this error names, ``note``
        (if any) added to its message, and render it again.  For an error raised
        about a spelling of a URL the caller never gave (aiohttp's, a redirect's
        target): ``source.network_errors`` names the caller's URL."""
        self.path = shown
        if note:
            self.message = f"{self.message} ({note})"
        self.args = (self._render(),)


class FormatError(ZTensorError, ValueError, RuntimeError):
    """The file (or an object handed to the writer) breaks the zTensor format.

    A ``ValueError`` (the input is wrong) and, for code written against the
    reference implementation, which raised ``RuntimeError`` for corrupt files, a
    ``RuntimeError`` too."""


class ChecksumError(ZTensorError):
    """A component's stored bytes do not match its digest."""


class LimitError(ZTensorError):
    """A declared size exceeds a configured safety limit (see :class:`ztensor.Limits`)."""


class UnsupportedError(ZTensorError, ValueError, RuntimeError):
    """Valid, but something this version of ztensor cannot do (an unknown digest
    algorithm, format version 2.0).  A ``ValueError``, as numpy's for a ``.npy``
    version it does not know: the input is the problem, not a missing feature
    (``NotImplementedError`` says "not written yet").  A ``RuntimeError`` too, as
    :class:`FormatError` is: safetensors raises torch's ``RuntimeError`` for a tensor
    it cannot store (a meta tensor: "Cannot copy out of meta tensor"), and the
    reference implementation ``RuntimeError`` for what it cannot do, so code
    written against either catches it."""


class ObjectNotFoundError(ZTensorError, KeyError):
    """No object of that name in the file."""


class ClosedError(ZTensorError, RuntimeError):
    """A closed (or failed) Reader or Writer was used.  A ``RuntimeError``, as the
    reference implementation's "Writer is already finished"."""


class KernelArgumentError(ZTensorError, ValueError):
    """A call to a kernel in :mod:`ztensor.kernels` broke its contract (buffer sizes
    that do not fit, an unknown type code).  Raised the same by both backends."""


class WriteError(ZTensorError, OSError):
    """Writing the file failed (disk full, permissions, ...).  Nothing is left behind."""

    def __init__(self, message: str, *, errno=None, **where):
        ZTensorError.__init__(self, message, **where)
        self.errno = errno


class ReadError(ZTensorError, OSError):
    """Reading the file failed below the format: the system refused the read (an I/O
    error, a file of ``/proc`` that cannot be read by offset)."""

    def __init__(self, message: str, *, errno=None, **where):
        ZTensorError.__init__(self, message, **where)
        self.errno = errno


class NotAFileError(FormatError, IsADirectoryError):
    """A directory given where a tensor file was expected: a FormatError naming the
    path, and the ``IsADirectoryError`` the builtin ``open`` would have raised."""

    def __init__(self, message: str, **where) -> None:
        FormatError.__init__(self, message, **where)
        self.errno, self.strerror, self.filename = _errno.EISDIR, message, self.path


class NetworkError(ZTensorError, OSError):
    """Reading a URL failed: the message says how (connection refused, a status
    such as ``404 Not Found``, a timeout).  A ZTensorError and an ``OSError``; the
    subclasses below are also the builtin a caller would catch."""

    def __init__(self, message: str, *, errno=None, **where) -> None:
        ZTensorError.__init__(self, message, **where)
        self.errno, self.strerror, self.filename = errno, message, self.path


class NetworkNotFoundError(NetworkError, FileNotFoundError):
    """404 or 410: the URL names nothing."""


class NetworkPermissionError(NetworkError, PermissionError):
    """401 or 403: the server refuses."""


class NetworkTimeoutError(NetworkError, TimeoutError):
    """No connection, or no data, within ``ztensor.io.source.URL_TIMEOUT`` seconds;
    or a request not finished within ``ztensor.io.source.URL_DEADLINE`` seconds."""


class NetworkConnectionError(NetworkError, ConnectionError):
    """The connection failed or broke (refused, reset, cut short)."""


# safetensors' name for its one error class: ``except SafetensorError`` keeps working
SafetensorError = ZTensorError


class SliceError(SafetensorError, IndexError):
    """A get_slice index that does not fit the tensor.  Its message is safetensors'
    own wording (code written against safetensors compares it); ``path`` and ``obj``
    say where."""

    def _render(self) -> str:
        return self.message


# safe_open(framework="pt").get_slice indexes as torch does, and refuses what torch
# refuses with torch's own builtin (safetensors' pt slices are torch indexing): the
# same SliceError, also the builtin a caller of safetensors catches
class SliceTypeError(SliceError, TypeError):
    """A get_slice index of a type torch refuses (``"a"``, ``slice(1.0, 3)``)."""


class SliceValueError(SliceError, ValueError):
    """A get_slice index torch refuses as a value (a negative or zero step, an
    integer past int64)."""


class SliceRuntimeError(SliceError, RuntimeError):
    """A get_slice index torch refuses with a RuntimeError (a step past int64)."""


# a URL in a message: a scheme, then everything up to a space; what may end it is
# taken off and kept (_URL_END): a sentence's punctuation, the ': ' after a path, a
# repr's closing quote.  A quote inside is the URL's own (a value holding one was
# cut there, the rest shown)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
_URL_END = re.compile(r"['\"<>:;,.)\]]*$")
# what follows a scheme up to the last '@' before the host ends, on the whole text
# rather than inside a URL found first: a password may hold what ends a URL in
# text (a space, a quote, '<': 'https://user:pa'ss@host' was shown whole).  A
# password holding an unescaped '@' is cut where the URL's parsers cut it, at the
# last one (up to the first left the rest of the password shown)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\n]*@")
# the same at the start of a text known to be one URL whole (a line break too)
_WHOLE_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")
# a query item: a name and its value (a presigned URL's signature, a token), or a
# bare item, which may be a token itself ('?AbC123')
_QUERY_ITEM = re.compile(r"([?&])([^=&#]*)(=?)([^&#]*)")
# a path parameter's value (';jsessionid=...')
_PATH_PARAM_VALUE = re.compile(r"(;[^=;/?#]*=)[^;/?#]*")


def _query_item(match: "re.Match[str]") -> str:
    mark, name, equals, _ = match.groups()
    if equals:
        return f"{mark}{name}=***"
    return f"{mark}***" if name else mark


def _scrub(url: str) -> str:
    """``url`` (one URL, its userinfo already taken out) with its path parameters'
    and query items' values and its fragment shown as ``***``."""
    url, hash_mark, fragment = url.partition("#")
    head, mark, query = url.partition("?")
    head = _PATH_PARAM_VALUE.sub(r"\1***", head)
    if mark:
        head += _QUERY_ITEM.sub(_query_item, "?" + query)
    return head + (hash_mark + "***" if fragment else hash_mark)


def url_without_secrets(url: str) -> str:
    """``url``, a text known to be one URL from its first character to its last (the
    path an error names, a handle's path), with what may be a credential taken out
    by the rules of :func:`without_secrets`, whatever it holds: spaces, quotes and
    line breaks, which end a URL found in running text, are its own here (a URL
    given with a raw space in its query showed the query items after the space).
    Any other text is returned unchanged."""
    if not isinstance(url, str) or "://" not in url:
        return url
    return _scrub(_WHOLE_USERINFO.sub(r"\1***@", url, count=1))


def without_secrets(text: str, *urls: Any) -> str:
    """``text`` with what may be a credential taken out of every URL in it: the
    user and password before the host (``https://user:token@host`` becomes
    ``https://***@host``), each query or path parameter's value (a presigned URL's
    ``X-Amz-Signature``, an Azure SAS ``sig``, a ``token``: ``?token=***``,
    ``;jsessionid=***``; a bare query item, ``?***``) and the fragment (``#***``:
    never sent to a server, so anything there is the caller's own, an OAuth
    ``access_token`` say).  The one rule for text shown to a person: every
    :class:`ZTensorError` message (a URL given to ``Reader`` with credentials in it
    names itself in every error about it), the ``repr`` of handles on a URL
    (Reader, Writer, ShardedReader) and the warnings naming them.

    ``urls``: URLs the text is known to hold whole (an error's path, a handle's),
    as they are or as their ``repr``: each is scrubbed as one URL
    (:func:`url_without_secrets`) before the text is searched for others.  In
    running text a URL ends at the first space (a query value holding a raw space
    showed the items after it), and nothing can tell where it ends otherwise."""
    if "://" not in text:
        return text
    for url in urls:
        if isinstance(url, str) and "://" in url:
            shown = url_without_secrets(url)
            text = text.replace(repr(url), repr(shown)).replace(url, shown)

    def scrub(match: "re.Match[str]") -> str:
        whole = match[0]
        end = _URL_END.search(whole)
        cut = end.start() if end is not None else len(whole)
        return _scrub(whole[:cut]) + whole[cut:]

    return _URL.sub(scrub, _USERINFO.sub(r"\1***@", text))


def _short(value) -> str:
    """A name for a message: names come from files, and a file may hold a huge one."""
    text = repr(value) if isinstance(value, str) else f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:197] + "..."


def refuse_copy(handle: object, path: object) -> "UnsupportedError":
    """The error for copying or pickling a handle on an open file (Reader, Writer,
    safe_open: their ``__reduce_ex__``, which copy.copy, copy.deepcopy and pickle
    all call).  A shallow copy would share the file: when the copy was collected its
    ``__del__`` closed the original's file (a Reader then raised ClosedError, a
    Writer wrote to a closed, perhaps reused, descriptor); pickle raised a bare
    TypeError about a lock.  Open the path again instead."""
    return UnsupportedError(
        f"a {type(handle).__name__} holds an open file and cannot be copied or "
        "pickled: open the path again in the copy's place",
        path=path,
    )


def strerror(code: int) -> str:
    """``os.strerror`` that never fails (used by the C blob writer's errors)."""
    try:
        return os.strerror(code)
    except (ValueError, OverflowError):
        return f"error {code}"


@contextlib.contextmanager
def memory_is_a_limit(path: Any = None, obj: Optional[str] = None) -> Iterator[None]:
    """A read (or copy) larger than the memory left is a LimitError naming the file
    and the object, never a bare MemoryError (docs/safety.md): a legitimate view can
    show far more elements than its file holds (a stride-0 or overlapping view)."""
    try:
        yield
    except MemoryError:
        raise LimitError("not enough memory for this read", path=path, obj=obj) from None
