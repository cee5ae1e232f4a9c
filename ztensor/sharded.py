"""Sharded checkpoints, the Hugging Face convention with ``.zt`` shards.

A directory holds ``model-00001-of-00003.zt`` ... and ``model.zt.index.json``::

    {"metadata": {"total_size": 123456}, "weight_map": {"layer.weight": "model-00001-of-00003.zt"}}

the schema of ``model.safetensors.index.json``, so tools that read one read the other.

Writing (:func:`save_sharded`): the split is planned first (greedily, in the order given,
a tensor larger than ``max_shard_size`` alone in its shard); an index left by an earlier
save is removed before any shard is written; every shard is written atomically (a
``Writer``); the index is written last, atomically.  A crash at any point therefore
leaves no index, or an index whose every shard is complete: never an index naming a
shard that is not.

Reading (:func:`open_sharded`): a directory (its ``*.zt.index.json`` or
``*.safetensors.index.json``, or a single checkpoint file in it) or an index file; the
Reader API over all shards, each shard opened on first use.
"""

from __future__ import annotations

import contextlib
import fractions
import functools
import math
import os
import re
import threading
import unicodedata
import urllib.parse
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Tuple, Union

import numpy as np

from ztensor import _save, dtypes
from ztensor import attributes as attrs
from ztensor.container.reader import Reader
from ztensor.container.writer import Writer
from ztensor.errors import (
    ClosedError,
    FormatError,
    ObjectNotFoundError,
    UnsupportedError,
    WriteError,
    ZTensorError,
    without_secrets,
)
from ztensor.foreign.names import json_loads_unique
from ztensor.io import atomic, checkpoint_moves
from ztensor.io import upload as remote_write
from ztensor.io.source import (
    file_version,
    is_url,
    network_errors,
    read_small_file,
    url_filesystem,
)
from ztensor.safe import safe_open

PathLike = Union[str, "os.PathLike[str]"]
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}


def parse_size(size: Union[int, float, str]) -> int:
    """``max_shard_size`` in bytes: an int of bytes, or a string ``"5GB"`` (powers
    of 10, as Hugging Face counts; ``"100kB"``: the unit in any case, a ``b`` never
    bits), ``"500MiB"`` (powers of 2) or ``"1.5GB"`` (a fraction with a unit, as
    huggingface_hub's ``parse_size_to_int`` takes it, rounded down to a byte).

    A float is a count of bytes as huggingface_hub compares it, so a whole one
    (``5e9``) is taken; one with a fraction (``1.9``: most likely gigabytes without
    their unit, which became 1 byte), ``inf`` or ``nan`` is a ValueError, as is a
    fraction of a byte as a string (``"1.5"``, ``"1.5B"``), a bool, and a size of
    no bytes or fewer.  A ValueError names ``max_shard_size``."""
    if isinstance(size, bool):  # an int to Python, never a size
        raise ValueError(f"max_shard_size must be bytes or like '5GB', got {size!r}")
    if isinstance(size, float):
        if not math.isfinite(size) or not size.is_integer():
            raise ValueError(
                f"max_shard_size must be a whole number of bytes or like '1.9GB', got {size!r}"
            )
        size = int(size)
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*", str(size))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"max_shard_size must be bytes or like '5GB', got {size!r}")
    # exact decimal arithmetic: a float overflowed for a long number of digits
    # (an OverflowError from int(inf)) and rounded "1.1GB" by binary fractions
    try:
        exact = fractions.Fraction(m.group(1)) * _UNITS[m.group(2).upper()]
        value = int(exact)
    except ValueError:  # past Python's digit limit for int(str)
        raise ValueError(f"max_shard_size must be bytes or like '5GB', got {size!r}") from None
    if _UNITS[m.group(2).upper()] == 1 and exact != value:
        raise ValueError(f"max_shard_size must be a whole number of bytes, got {size!r}")
    if value <= 0:
        raise ValueError(f"max_shard_size must be positive, got {size!r}")
    return value


def _nbytes(value: Any) -> int:
    if type(value).__module__.startswith("torch"):
        return value.nelement() * value.element_size()
    return int(np.asarray(value).nbytes)


def _check_before_writing(tensors: Dict[str, Any], folder: str) -> None:
    """What a shard's Writer would refuse and can be known before a byte is
    written: every name (attrs.caller_name), and every numpy array's element
    type (dtypes.spec_types_for): refused before a byte is written, where the
    Writer would refuse it only at its shard (a local rewrite is staged, so the old
    checkpoint survives that too; a save to a URL is not)."""
    for name, value in tensors.items():
        attrs.caller_name(name, "tensor names", folder)
        if isinstance(value, np.ndarray) and dtypes.spec_types_for(value.dtype) is None:
            raise UnsupportedError(
                f"cannot store numpy dtype {value.dtype}; nothing was written",
                path=folder,
                obj=name,
            )


def save_sharded(
    tensors: Dict[str, Any],
    directory: PathLike,
    *,
    max_shard_size: Union[int, str] = "5GB",
    prefix: str = "model",
    metadata: Optional[Dict[str, str]] = None,
    compress: Any = False,
    checksum: Optional[str] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    storage_options: Optional[Dict[str, Any]] = None,
    write_beside: Optional[Callable[[str], None]] = None,
    supersedes: Callable[[str], List[str]] = lambda folder: [],
) -> List[str]:
    """Write ``tensors`` (name -> numpy array or torch tensor) as shards of at most
    ``max_shard_size`` bytes each (one larger tensor alone) plus the index.
    Tensors are taken in name order (``_save.canonical_order``), so the same
    tensors give the same shards and bytes whatever the dict's order.

    ``metadata`` (str -> str) goes into every shard's attributes; ``progress`` is
    called with (bytes done, bytes total) after each tensor.  Returns the shard
    file names, in order.

    ``directory`` may be an fsspec URL (``s3://bucket/ckpt``; ``storage_options``:
    its filesystem's options): each shard is uploaded whole as its Writer closes,
    the index last (ztensor/io/upload.py).

    ``write_beside(folder)``: more files of the checkpoint (a model's config), which
    it writes into ``folder`` once the shards are whole; they move into
    ``directory`` together with the shards and index, all or none (a local
    ``directory`` only).  ``supersedes(directory)``: the names of more files there
    that the new checkpoint replaces (another format's weights of the model, whose
    config it rewrites), removed with the old shards once it is in place."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of tensors but received {type(tensors)}")
    limit = parse_size(max_shard_size)
    folder = os.fspath(directory)
    metadata = _save.str_metadata(metadata)
    _check_before_writing(tensors, folder)
    storage_options = remote_write.check_storage_options(folder, storage_options)
    place = remote_write.join if _is_url(folder) else os.path.join
    if not isinstance(prefix, str) or not prefix or prefix.startswith("."):
        # "" named the index ".zt.index.json": a hidden file, shards "-00001-of-..."
        raise ValueError(f"prefix {prefix!r} must be a plain name, not empty or hidden")
    try:  # before a byte is written: names the reader would refuse make no checkpoint
        check_shard_name(f"{prefix}.zt.index.json", place(folder, f"{prefix}.zt.index.json"))
    except FormatError as exc:
        raise ValueError(f"prefix {prefix!r} does not make plain file names: {exc}") from None
    plan: List[List[str]] = [[]]
    used = 0
    # the one order (_save.canonical_order): the same tensors give the same shards
    for name, value in _save.canonical_order(tensors):
        size = _nbytes(value)
        if plan[-1] and used + size > limit:
            plan.append([])
            used = 0
        plan[-1].append(name)
        used += size
    plan = [names for names in plan if names] or [[]]
    count = len(plan)
    files = [f"{prefix}-{i + 1:05d}-of-{count:05d}.zt" for i in range(count)]
    index_path = place(folder, f"{prefix}.zt.index.json")
    if write_beside is not None and _is_url(folder):
        raise ValueError("write_beside is for a local checkpoint, not a URL")
    # the outermost folder this call makes, removed again on a refusal
    made = None
    if not _is_url(folder):
        made = folder
        while made and not os.path.lexists(os.path.dirname(os.path.abspath(made))):
            made = os.path.dirname(os.path.abspath(made))
        if os.path.lexists(made):
            made = None
    if not _is_url(folder):  # an object store has no folders to make
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:  # a file at the name, a parent that is a file, ...
            raise WriteError(
                f"cannot make the checkpoint's folder: {exc.strerror}",
                path=folder,
                errno=exc.errno,
            ) from exc
    local = not _is_url(index_path)
    if not local:
        remote_write.Upload(index_path, storage_options).remove()  # as below
    # a local checkpoint is written whole into a hidden folder beside its files, then
    # moved into place (checkpoint_moves.move_staged): a refusal or failure in any shard (a torch
    # tensor only its Writer refuses, a full disk) leaves the old checkpoint as it was,
    # index and all (removing the old index first, one shard's refusal left none)
    total = sum(_nbytes(v) for v in tensors.values())
    done = 0
    weight_map = {}
    try:
        with contextlib.ExitStack() as stack:
            staging = stack.enter_context(checkpoint_moves.staged(folder)) if local else None
            if staging is not None:
                stack.enter_context(checkpoint_moves.staged_as_target(staging, folder))
            for file, names in zip(files, plan):
                with Writer(
                    place(staging or folder, file),
                    attributes=metadata,
                    storage_options=storage_options,
                ) as w:
                    for name in names:
                        value = tensors[name]
                        if type(value).__module__.startswith("torch"):
                            w.write_torch(name, value, compress=compress, checksum=checksum)
                        else:
                            w.write_numpy(name, value, compress=compress, checksum=checksum)
                        weight_map[name] = file
                        done += _nbytes(value)
                        if progress is not None:
                            progress(done, total)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            if staging is None:  # uploaded whole, last (remote_write.Upload.commit)
                remote_write.Upload(index_path, storage_options).write_json(index)
            else:
                index_name = os.path.basename(index_path)
                if write_beside is not None:
                    write_beside(staging)
                atomic.write_json_atomically(os.path.join(staging, index_name), index)
                # the old checkpoint's shards this one does not rewrite go with it
                checkpoint_moves.move_staged(
                    staging,
                    folder,
                    index_name,
                    replaced=lambda: (
                        old_shards(index_path) + _own_shards(folder, prefix) + supersedes(folder)
                    ),
                )
    except BaseException:
        if made is not None:  # a refusal leaves no folder the call made (nor parents)
            _remove_empty_folders(folder, made)
        raise
    return files


def _own_shards(folder: str, prefix: str) -> List[str]:
    """The files in ``folder`` named as this function names shards
    (``{prefix}-00001-of-00003.zt``), regular files, not links: an earlier save's,
    which a new save replaces even where the earlier index is gone or unreadable."""
    pattern = re.compile(re.escape(prefix) + r"-\d{5}-of-\d{5}\.zt")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(folder, name)
        if pattern.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
            out.append(name)
    return sorted(out)


# the weight files transformers reads before ours: whole, their indexes, their shards
_TRANSFORMERS_WHOLE = ("model.safetensors", "pytorch_model.bin")
_TRANSFORMERS_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_TRANSFORMERS_SHARD = re.compile(r"(model|pytorch_model)-\d{5}-of-\d{5}\.(safetensors|bin)")


def transformers_weights(folder: str) -> List[str]:
    """The weight files of a transformers checkpoint in ``folder`` (regular files,
    not links): ``model.safetensors``, ``pytorch_model.bin``, their indexes, the
    shards those name and the files named as transformers names shards.  A save
    that writes a new ``config.json`` there supersedes them: left beside it,
    transformers' own from_pretrained loaded the old weights under the new config
    without a word."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = set()
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        if name in _TRANSFORMERS_WHOLE or _TRANSFORMERS_SHARD.fullmatch(name):
            out.add(name)
        elif name in _TRANSFORMERS_INDEXES:
            out.add(name)
            out.update(old_shards(path))
    return sorted(out)


def _remove_empty_folders(folder: str, outermost: str) -> None:
    """``folder`` and each parent up to ``outermost`` removed while empty (only what
    a refused save made: a folder holding anything else stays)."""
    path, stop = os.path.abspath(folder), os.path.abspath(outermost)
    while True:
        try:
            os.rmdir(path)
        except OSError:
            return
        if path == stop or os.path.dirname(path) == path:
            return
        path = os.path.dirname(path)


def old_shards(index_path: str) -> List[str]:
    """The shard names the local index at ``index_path`` gives (each passed
    check_shard_name), or none when there is no index or it cannot be read: the
    files a checkpoint written over it replaces.  Only names of weight files
    (``WEIGHT_SUFFIXES``): an index naming ``tokenizer.json`` or ``README.md`` as a
    shard had the next save into the folder remove that file."""
    if not os.path.isfile(index_path):
        return []
    try:
        names = set(_read_index(index_path, None)[0].values())
    except ZTensorError:
        return []  # not an index this library reads: nothing of it is removed
    return sorted(n for n in names if n.lower().endswith(WEIGHT_SUFFIXES))


def _is_url(path: str) -> bool:
    return is_url(path)


def check_shard_name(file: Any, index: Optional[str] = None) -> str:
    """``file`` if it is one plain file name beside the index, else FormatError
    naming ``index``: the one rule for every shard name an index gives, for local
    paths and URLs alike.

    Refused: anything but a non-empty string; a separator (``/``, ``\\``); ``%``
    (a server decodes ``..%2f`` into a separator, so the name is refused before and
    after percent-decoding alike); NUL and every other control character; the dot
    segments ``.`` and ``..``; ``:`` (a drive on Windows, a scheme in a URL); ``?``
    and ``#`` (an object store's filesystem reads ``s.zt?versionId=...`` as another
    version of ``s.zt``, an older or deleted one; gsutil's syntax, which gcsfs
    follows, reads ``s.zt#123`` as generation 123); ``;`` (servers that strip a
    segment's path parameters before resolving dot segments, Tomcat and Jetty among
    them, read ``..;x`` as ``..``); a lone surrogate (JSON's ``"\ud800"``: no path
    or URL can encode it).

    Each rule holds for the name as given and for its NFKC form, which a server or
    filesystem that normalises Unicode would see: ``"\uff0e\uff0e"`` (fullwidth
    dots) and ``"\u2025"`` (two dot leader) become ``..``, ``"\uff0f"`` a ``/``,
    ``"\uff05"`` a ``%``.  A name of dots and spaces alone (``...``, ``.. ``) is
    refused too: Windows drops trailing dots and spaces, so it is a dot segment
    there."""
    if not isinstance(file, str) or not file:
        raise FormatError(f"shard name {_show(file)} is not a file name", path=index)
    for form in dict.fromkeys((file, _nfkc(file))):  # the name, then what it may become
        bad = next(
            (
                c
                for c in form
                if c in _NOT_IN_SHARD_NAMES or unicodedata.category(c) in ("Cc", "Cs")
            ),
            None,
        )
        if bad is not None:
            how = "" if form == file else f" once normalised ({_show(form)})"
            raise FormatError(
                f"shard {_show(file)} is not a file beside the index: it holds {bad!r}{how}",
                path=index,
            )
        if not form.strip(". "):
            raise FormatError(f"shard {_show(file)} is not a file beside the index", path=index)
    return file


def _nfkc(text: str) -> str:
    try:
        return unicodedata.normalize("NFKC", text)
    except UnicodeError:  # a lone surrogate: refused as a character above
        return text


_NOT_IN_SHARD_NAMES = frozenset("/\\%:?#;")


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


# an index is JSON text that lists names; no honest one comes near this (100,000
# tensors of 80-character names and their shards take about 10 MB).  Parsed, JSON takes
# about 20 times its bytes in Python objects: the bound keeps that near a gigabyte
MAX_INDEX_BYTES = 64 << 20
# shards a ShardedReader holds open at once (each a file descriptor)
MAX_OPEN_SHARDS = 64


# a file with one of these suffixes holds weights (this checkpoint's in another
# format, or another model's): convert does not copy it (a second, unconverted
# copy), and a save removes an old index's shard only when it has one
WEIGHT_SUFFIXES = (
    ".safetensors",
    ".zt",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".h5",
    ".hdf5",
    ".msgpack",
    ".gguf",
    ".onnx",
    ".onnx_data",
    ".npz",
    ".npy",
    ".ot",
    ".tflite",
    ".pkl",
    ".pickle",
)


_INDEX_SUFFIXES = (".zt.index.json", ".safetensors.index.json", ".bin.index.json")


def find_index(path: PathLike) -> Optional[str]:
    """The index file of a checkpoint directory (or the path itself, if it is one).
    A URL must name the index itself: a server has no directory listing."""
    path = os.fspath(path)
    if _is_url(path):
        if not _url_parts(path)[0].endswith(".index.json"):
            raise FormatError(
                "a sharded checkpoint behind a URL is opened by its index "
                "(.../model.zt.index.json)",
                path=path,
            )
        return path
    if not os.path.isdir(path):
        return path if path.endswith(".index.json") else None
    found = sorted(n for n in os.listdir(path) if n.endswith(_INDEX_SUFFIXES))
    # in order of preference: a converted checkpoint keeps its source's index beside
    # ours, and Hugging Face folders often hold a PyTorch index beside a safetensors one
    pick = []
    for suffix in _INDEX_SUFFIXES:
        pick = [n for n in found if n.endswith(suffix)]
        if pick:
            break
    if len(pick) > 1:
        raise FormatError(
            f"more than one index ({', '.join(map(repr, pick[:4]))}): open "
            "the one meant by its path",
            path=path,
        )
    return os.path.join(path, pick[0]) if pick else None


def _url_parts(url: str) -> Tuple[str, str]:
    """(the URL less its query, the query) of an index URL.  Only an HTTP(S) URL
    keeps a query: a token a server or CDN wants with every request (an Azure SAS,
    ``?token=``), sent with each shard's request too, as they sit in the index's
    folder on the index's host.  A presigned S3 URL signs one object: its shards
    are refused by the server (403), which the error says.  For an object store the
    query is the object's version (s3fs: ``?versionId=``), so it is left in place
    and the name check of its shards refuses nothing new."""
    if not url.lower().startswith(("http://", "https://")):
        return url, ""
    base, _, query = url.split("#", 1)[0].partition("?")
    return base, query


def _read_index(index: str, options) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """(weight_map, metadata) of the index file or URL ``index``, checked: names to
    shard files that are plain file names (check_shard_name), metadata a map."""
    try:
        raw = read_small_file(index, MAX_INDEX_BYTES, "index", options)
        data = json_loads_unique(raw, index, "index key")
    except ZTensorError:
        raise  # a network failure, a FIFO: already says what and where
    except (OSError, ValueError, RecursionError) as exc:
        raise FormatError(f"not a readable index: {exc}", path=index) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise FormatError("an index needs a 'weight_map' of names to shard files", path=index)
    for file in set(weight_map.values()):
        check_shard_name(file, index)
    meta = data.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise FormatError(
            f"an index's 'metadata' is a JSON object, not {type(meta).__name__}", path=index
        )
    return dict(weight_map), meta or {}


def _require_one_checkpoint(folder: str, index: str, weight_map: Dict[str, str]) -> None:
    """A folder opened by its name must hold one checkpoint: every other zTensor or
    safetensors index in it and every whole-checkpoint file such an index's name
    implies (``model.safetensors``
    beside ``model.safetensors.index.json``, which transformers loads first) must
    name the same tensors as the index chosen, else the folder is refused, naming
    both.  Two indexes naming different tensors lost one index's tensors without a
    word, and ztensor and transformers loaded different weights from one folder.
    A caller who means one of them opens it by its path."""
    names, shards = set(weight_map), set(weight_map.values())
    # a PyTorch index or file is not compared: transformers takes safetensors
    # first and ignores it, and older transformers kept a tied head in .bin
    # shards that the safetensors ones (and the hub's conversion) leave out
    indexes = sorted(
        n
        for n in os.listdir(folder)
        if n.endswith(_INDEX_SUFFIXES) and not n.endswith(".bin.index.json")
    )
    for other in indexes:
        path = os.path.join(folder, other)
        if path != index:
            other_map = _read_index(path, None)[0]
            _same_tensors(names, set(other_map), index, path)
            shards.update(other_map.values())
    for other in indexes:
        whole = other[: -len(".index.json")]  # a shard of some index is no checkpoint
        if whole not in shards and os.path.isfile(os.path.join(folder, whole)):
            with Reader(os.path.join(folder, whole)) as r:
                _same_tensors(names, set(r.keys()), index, whole)


def _same_tensors(names, others, index, other) -> None:
    if names != others:
        odd = sorted(names ^ others)[:1]
        raise FormatError(
            f"the folder holds two checkpoints: {os.path.basename(index)!r} and "
            f"{os.path.basename(other)!r} name different tensors (e.g. {odd[0]!r}); "
            "open the one meant by its path",
            path=os.path.dirname(index),
        )


class ShardedReader:
    """The Reader API over the shards of a checkpoint (see :func:`open_sharded`)."""

    def __init__(self, path: PathLike, storage_options: Optional[Dict[str, Any]] = None) -> None:
        self.path = os.fspath(path)
        self._closed = False
        # fsspec's options for the index's URL, and for every shard beside it
        self._options = remote_write.check_storage_options(self.path, storage_options)
        index = find_index(self.path)
        # the shards open for metadata/read_numpy, the least recently used closed
        # past MAX_OPEN_SHARDS (ShardedReader._reader)
        self._readers: "OrderedDict[str, Reader]" = OrderedDict()
        # threads may share a checkpoint as they share a Reader (docs/safety.md): the
        # table above, the readers in use (id -> how many reads hold it) and those
        # put out of it while in use (closed by their last read) change under one lock
        self._lock = threading.Lock()
        self._users: Dict[int, int] = {}
        self._retired: Dict[int, Reader] = {}
        self._slicers: "OrderedDict[str, Any]" = OrderedDict()  # get_slice's handles
        # the index's version, taken before it is read: a shard opened after the
        # checkpoint was rewritten (save_sharded removes the index first; a server's
        # copy replaced by a newer release) would mix two versions' tensors
        # (_open_checked compares)
        self._index = index
        self._query = ""
        self._index_version = self._version_now()
        if index is None:
            single = self._single_file(self.path)
            self.folder = os.path.dirname(single)
            with Reader(single) as r:
                names = r.keys()
            self._map = {n: os.path.basename(single) for n in names}
            self._meta: Dict[str, Any] = {}
            return
        # an HTTP(S) index's query goes with every shard's URL (_url_parts)
        self._query = _url_parts(index)[1] if _is_url(index) else ""
        self.folder = (
            _url_parts(index)[0].rsplit("/", 1)[0] if _is_url(index) else os.path.dirname(index)
        )
        self._map, self._meta = _read_index(index, self._options)
        if not _is_url(self.path) and os.path.isdir(self.path):
            _require_one_checkpoint(self.folder, index, self._map)

    def _version_now(self) -> Any:
        """The index's version as it is now (a local file's stat, what a server
        says of a URL: :func:`ztensor.io.source.file_version`); None where nothing
        can tell (no index; a server naming no version, read by the caller's
        opt-in) or the local index is gone (then it differs from the one taken)."""
        if self._index is None:
            return None
        if not _is_url(self._index):
            return atomic.identity(self._index)
        identity, versioned = file_version(self._index, self._options)
        return identity if versioned else None

    def _shard(self, file: str) -> str:
        """The path or URL of shard ``file``: a name check_shard_name passed when the
        index was read, or the one checkpoint file of a folder without an index."""
        if not _is_url(self.folder):
            return os.path.join(self.folder, file)
        if self.folder.lower().startswith(("http://", "https://")):
            # a URL path segment: '?', '#', spaces and non-ASCII are escaped, so the
            # server sees exactly this name ('%' itself is never in a shard name)
            query = f"?{self._query}" if self._query else ""
            return f"{self.folder}/{urllib.parse.quote(file, safe='')}{query}"
        return f"{self.folder}/{file}"  # s3://, memory://...: keys, not URL-encoded

    @staticmethod
    def _single_file(path):
        if not os.path.isdir(path):
            # a file (or a FIFO, device, missing path): Reader's own input check
            # (source.open_local_input) says what it is, never os.listdir's
            # NotADirectoryError
            return path
        candidates = sorted(
            n
            for n in os.listdir(path)
            if n.endswith((".zt", ".safetensors")) and not n.startswith(".")
        )
        if not candidates:  # a PyTorch checkpoint alone (pytorch_model.bin)
            candidates = sorted(
                n for n in os.listdir(path) if n.endswith(".bin") and not n.startswith(".")
            )
        if len(candidates) != 1:
            interrupted = (
                "; a save into this folder was killed part way: the old checkpoint's "
                "files are kept under hidden names, and the next save into the folder "
                "(save_sharded, convert, save_pretrained) puts them back first"
                if checkpoint_moves.interrupted_save(path)
                else ""
            )
            raise FormatError(
                "no index (*.zt.index.json / *.safetensors.index.json / *.bin.index.json) "
                "and not exactly one checkpoint file" + interrupted,
                path=path,
            )
        return os.path.join(path, candidates[0])

    @contextlib.contextmanager
    def _using(self, name: str) -> Iterator[Reader]:
        """The open Reader of the shard holding ``name``, kept open while the block
        runs: the one way every read reaches a shard.  A checkpoint of more shards
        than the process may hold open files (ulimit -n, often 1024) is read with
        MAX_OPEN_SHARDS open, the least recently used closed; one that a read in
        another thread still uses is closed when that read ends (it was closed under
        the read: a ClosedError for a valid checkpoint shared by threads).  Arrays
        already read stay valid (Reader.close)."""
        reader = self._acquire(name)
        try:
            yield reader
        finally:
            self._release(reader)

    def _acquire(self, name: str) -> Reader:
        self._require_open(name)  # a closed checkpoint, whatever the name
        file = self._map.get(name) if isinstance(name, str) else None
        if file is None:
            raise ObjectNotFoundError("no such tensor in any shard", path=self.path, obj=name)
        with self._lock:
            self._require_open(name)
            reader = self._readers.get(file)
            if reader is not None:
                self._readers.move_to_end(file)
                self._users[id(reader)] = self._users.get(id(reader), 0) + 1
                return reader
        # opened outside the lock: a remote shard's open takes round trips, and
        # reads of shards already open need not wait for it
        opened = self._open_checked(file, name)
        with self._lock:
            closed = self._closed
            reader = self._readers.get(file)
            if not closed:
                if reader is None:  # no other thread opened it meanwhile
                    while len(self._readers) >= MAX_OPEN_SHARDS:
                        old = self._readers.popitem(last=False)[1]
                        if self._users.get(id(old)):
                            self._retired[id(old)] = old
                        else:
                            old.close()
                    reader = self._readers[file] = opened
                self._users[id(reader)] = self._users.get(id(reader), 0) + 1
        if closed or reader is not opened:
            opened.close()
        if closed or reader is None:  # closed while it opened
            raise ClosedError("this checkpoint is closed", path=self.path, obj=name)
        return reader

    def _release(self, reader: Reader) -> None:
        with self._lock:
            left = self._users.pop(id(reader)) - 1
            if left:
                self._users[id(reader)] = left
                return
            retired = self._retired.pop(id(reader), None)
        if retired is not None:
            retired.close()

    def _open_checked(
        self,
        file: str,
        name: Optional[str] = None,
        *,
        unlisted_ok: bool = False,
        **reader_options: Any,
    ) -> Reader:
        """A new Reader of shard ``file``, checked to hold exactly the tensors the
        index places there: the one place a shard is opened for reading (none once
        the checkpoint is closed: a ClosedError, as from a closed Reader; none once a
        local index was rewritten or removed, which would mix two checkpoints'
        tensors: a FormatError saying to open it again)."""
        self._require_open(name)
        if self._index_version is not None and self._version_now() != self._index_version:
            raise FormatError(
                "the checkpoint changed while open (its index was rewritten or removed): "
                "its shards would mix two versions; open it again",
                path=self.path,
                obj=name,
            )
        try:
            reader = Reader(self._shard(file), storage_options=self._options, **reader_options)
        except IsADirectoryError:  # NotAFileError too: its advice is for a checkpoint
            raise FormatError(
                f"the index names shard {_show(file)}, which is a directory",
                path=self.path,
                obj=name,
            ) from None
        except ZTensorError:
            raise  # says what is wrong, and where
        except OSError as exc:  # the index names a shard that is not there
            raise FormatError(
                f"the index names shard {_show(file)}, which cannot be opened: "
                f"{exc.strerror or exc}",
                path=self.path,
                obj=name,
            ) from None
        missing = self._missing(file, reader)
        if missing:
            reader.close()
            raise FormatError(
                f"the index names {_show(missing[0])} in {_show(file)}, which does not hold it",
                path=self.path,
            )
        extra = next(self._misplaced(file, reader, unlisted_ok), None)
        if extra is not None:
            reader.close()
            raise extra
        return reader

    def _misplaced(self, file: str, reader: Reader, unlisted_ok: bool = False):
        """A FormatError for each tensor shard ``file`` holds that the index places
        in another shard or (unless ``unlisted_ok``) does not list: it would be
        dropped without a word, the index and its shards disagree.  The one rule:
        _open_checked (every read of a shard) refuses the first, verify reports all."""
        for n in reader.keys():
            elsewhere = self._map.get(n)
            if elsewhere == file or (unlisted_ok and elsewhere is None):
                continue
            yield FormatError(
                f"shard {file} holds {n!r}, which the index "
                + (f"places in {elsewhere}" if elsewhere else "does not list"),
                path=self.path,
                obj=n,
            )

    # shard by shard, for callers that load or convert one shard at a time
    def files(self) -> List[str]:
        """The shard files, in the order of their first tensor in the index."""
        self._require_open()
        return list(dict.fromkeys(self._map.values()))

    def file_of(self, name: str) -> str:
        """The shard file the index places ``name`` in (ObjectNotFoundError if none)."""
        self._require_open(name)
        file = self._map.get(name) if isinstance(name, str) else None
        if file is None:
            raise ObjectNotFoundError("no such tensor in any shard", path=self.path, obj=name)
        return file

    def names_in(self, file: str) -> List[str]:
        """The tensors the index places in shard ``file``, in index order."""
        self._require_open()
        return list(self._placed.get(file, ()))

    @functools.cached_property
    def _placed(self) -> Dict[str, List[str]]:
        """Shard file -> the tensors the index places there, in index order, made
        once: each per-shard question asked of the whole map made opening every
        shard of a checkpoint quadratic in its tensors (10,000 one-tensor shards:
        10**8 steps)."""
        out: Dict[str, List[str]] = {}
        for name, file in self._map.items():
            out.setdefault(file, []).append(name)
        return out

    def shard_path(self, file: str) -> str:
        """The path or URL of shard ``file`` (one the index names)."""
        self._require_open()
        if file not in self._placed:
            raise ObjectNotFoundError(f"the index names no shard {file!r}", path=self.path)
        return self._shard(file)

    def open_shard(self, file: str, *, unlisted_ok: bool = False, **reader_options: Any) -> Reader:
        """A new :class:`ztensor.Reader` of shard ``file`` (``reader_options`` as
        Reader takes them, e.g. ``copy_on_write=True``), checked to hold every tensor
        the index places there and none it places in another shard; with
        ``unlisted_ok`` it may hold tensors the index does not list at all (a
        conversion keeps them and lists them).  The caller closes it: loading shard by
        shard keeps one shard mapped at a time."""
        self._require_open()
        if file not in self._placed:
            raise ObjectNotFoundError(f"the index names no shard {file!r}", path=self.path)
        return self._open_checked(file, unlisted_ok=unlisted_ok, **reader_options)

    # the Reader API.  Once closed, every method answering about the checkpoint
    # raises ClosedError (_require_open), its index as its shards: a closed handle
    # that still listed names read as open until a read failed
    @property
    def format(self) -> str:
        return "sharded"

    @property
    def shards(self) -> List[str]:
        self._require_open()
        return sorted(set(self._map.values()))

    @property
    def attributes(self) -> Dict[str, Any]:
        self._require_open()
        return dict(self._meta)

    def keys(self) -> List[str]:
        self._require_open()
        return list(self._map)

    def __iter__(self) -> Iterator[str]:
        self._require_open()
        return iter(self._map)

    def __len__(self) -> int:
        self._require_open()
        return len(self._map)

    def __bool__(self) -> bool:  # an open or closed handle, never its len()
        return True

    def __contains__(self, name: Any) -> bool:
        self._require_open()
        return name in self._map

    def __getitem__(self, name: str) -> Any:
        return self.read_numpy(name)

    def metadata(self, name: str) -> Any:
        with self._using(name) as reader:
            return reader.metadata(name)

    def reader_of(self, name: str) -> Reader:
        """The open :class:`ztensor.Reader` of the shard holding ``name`` (opened once,
        checked against the index, closed with this one): for reads that go through
        a Reader's own paths (``ztensor stats`` streams a compressed tensor).  With
        more than MAX_OPEN_SHARDS shards read meanwhile it may have been closed."""
        with self._using(name) as reader:
            return reader

    def read_numpy(self, name: Any, **kwargs: Any) -> Any:
        self._require_open()
        if isinstance(name, list):
            return {n: self.read_numpy(n, **kwargs) for n in name}
        with self._using(name) as reader:
            return reader.read_numpy(name, **kwargs)

    def read(self, name: Any, **kwargs: Any) -> Any:
        self._require_open()
        if isinstance(name, list):
            return {n: self.read(n, **kwargs) for n in name}
        with self._using(name) as reader:
            return reader.read(name, **kwargs)

    def read_torch(self, name: Any, **kwargs: Any) -> Any:
        self._require_open()
        if isinstance(name, list):
            return {n: self.read_torch(n, **kwargs) for n in name}
        with self._using(name) as reader:
            return reader.read_torch(name, **kwargs)

    def read_into(self, name: Any, dst: Any = None) -> None:
        self._require_open()
        if isinstance(name, dict):
            for n, d in name.items():
                self.read_into(n, d)
            return
        with self._using(name) as reader:
            reader.read_into(name, dst)

    def get_tensor(self, name: str) -> Any:
        return self.read_numpy(name)

    def get_slice(self, name: str) -> Any:
        """safe_open's lazy slice of ``name``, over its shard (only the rows asked
        for are read)."""
        with self._using(name):
            pass  # the name must be in its shard, of the index's version
        file = self._map[name]
        with self._lock:
            handle = self._slicers.pop(file, None)
        if handle is None:
            # one handle a shard, kept (a handle a call left each slice unclosed: 300
            # slices held 307 descriptors past MAX_OPEN_SHARDS, and a request set a
            # call over a URL); the least recently used closed past MAX_OPEN_SHARDS,
            # and every one with the checkpoint
            handle = safe_open(self._shard(file), framework="np", storage_options=self._options)
        with self._lock:
            self._slicers[file] = handle
            evicted = []
            while len(self._slicers) > MAX_OPEN_SHARDS:
                evicted.append(self._slicers.popitem(last=False)[1])
            closed = self._closed
        for old in evicted:
            old.close()
        if closed:  # a close raced this call
            handle.close()
            self._require_open(name)
        return handle.get_slice(name)

    def verify(
        self,
        progress: Optional[Callable[[int, int], None]] = None,
        *,
        errors: Optional[List[Exception]] = None,
    ) -> int:
        """Every shard checked as :meth:`ztensor.Reader.verify` checks a file (every
        object read, every digest), and every tensor the index names present in its
        shard.  Returns how many digests matched.  ``progress(bytes done, bytes
        total)`` over the shards' file sizes.  ``errors``: a list collecting every
        problem of every shard (a shard that cannot be opened is one), instead of
        raising the first."""

        def problem(exc):
            if errors is None:
                raise exc
            errors.append(exc)

        self._require_open()
        checked, done = 0, 0
        paths = {file: self._shard(file) for file in self.shards}
        sizes = self._progress_sizes(paths)
        total = sum(sizes.values())
        for file, path in paths.items():
            try:
                with Reader(path, storage_options=self._options) as r:
                    for name in self._missing(file, r):
                        problem(
                            FormatError(
                                f"the index names this tensor in {_show(file)}, which does "
                                "not hold it",
                                path=self.path,
                                obj=name,
                            )
                        )
                    for exc in self._misplaced(file, r):  # what every read of it refuses
                        problem(exc)

                    def shard_progress(d, t, base=done):  # this shard's bytes after base
                        progress(base + d, total)

                    checked += r.verify(None if progress is None else shard_progress, errors=errors)
            except (ZTensorError, OSError) as exc:
                if not isinstance(exc, ZTensorError):  # a missing or unreadable shard
                    exc = FormatError(
                        f"cannot open shard {_show(file)}: {exc.strerror or exc}", path=self.path
                    )
                problem(exc)
            done += sizes[file]
            if progress is not None:
                progress(done, total)
        return checked

    def _progress_sizes(self, paths: Dict[str, str]) -> Dict[str, int]:
        """Each shard's size, for progress only: a shard that cannot be looked at
        counts 0 here and is refused, naming the index, when it is opened (a bare
        FileNotFoundError came from read_all, before any shard was opened)."""
        sizes = {}
        for file, path in paths.items():
            try:
                sizes[file] = _size(path, self._options)
            except OSError:
                sizes[file] = 0
        return sizes

    def _missing(self, file: str, reader: Reader) -> List[str]:
        """The tensors the index places in shard ``file`` that ``reader`` lacks."""
        return [n for n in self._placed.get(file, ()) if n not in reader]

    def read_all(
        self, *, copy: bool = True, progress: Optional[Callable[[int, int], None]] = None
    ) -> Dict[str, Any]:
        """name -> array of every tensor, shard by shard (each shard in one batch:
        ztensor/container/batch.py); ``progress(bytes done, bytes total)`` after each shard."""
        self._require_open()
        out: Dict[str, Any] = {}
        paths = {file: self._shard(file) for file in self.shards}
        sizes = self._progress_sizes(paths) if progress is not None else {}
        total, done = sum(sizes.values()), 0
        for file in paths:
            names = self._placed.get(file, [])
            if names:  # opened and checked as every read opens a shard (_open_checked)
                with self._using(names[0]) as reader:
                    out.update(reader.read_numpy(names, copy=copy))
            done += sizes.get(file, 0)
            if progress is not None:
                progress(done, total)
        return {name: out[name] for name in self._map}

    def _require_open(self, name: Optional[str] = None) -> None:
        if self._closed:
            raise ClosedError("this checkpoint is closed", path=self.path, obj=name)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            readers = [*self._readers.values(), *self._retired.values()]
            self._readers.clear()
            self._retired.clear()
            slicers = list(self._slicers.values())
            self._slicers.clear()
        for reader in readers:  # a read racing close: "reader is closed", as a Reader's
            reader.close()
        for handle in slicers:
            handle.close()

    def __enter__(self) -> "ShardedReader":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        state = (
            "closed"
            if self._closed
            else f"{len(set(self._map.values()))} shards, {len(self._map)} tensor(s)"
        )
        return without_secrets(f"<ztensor.ShardedReader {self.path!r} [{state}]>", self.path)


def _size(path: str, storage_options: Any = None) -> int:
    """A shard's size in bytes, for progress (its reads check what it holds)."""
    if _is_url(path):
        with network_errors(path):
            fs, inner = url_filesystem(path, storage_options)
            size = fs.size(inner)
        # a server stating no usable length (none, "*", -5): fsspec gives None, and
        # int(None) was a bare TypeError from verify() and read_all()
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise FormatError(
                "the server gives no length for this URL, so its bytes cannot be read by range",
                path=path,
            )
        return size
    return os.path.getsize(path)


def is_checkpoint(path: Any) -> bool:
    """Whether ``path`` names a sharded checkpoint rather than one file: a local
    directory, or an index (a path or URL ending in ``.index.json``).  The one rule
    every caller taking "a file or a checkpoint" uses to choose."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    if isinstance(text, bytes):
        return False
    return text.endswith(".index.json") or (not _is_url(text) and os.path.isdir(text))


def open_sharded(
    path: PathLike, *, storage_options: Optional[Dict[str, Any]] = None
) -> ShardedReader:
    """The Reader API over a sharded checkpoint: a directory or an index file
    (``.zt.index.json``, or ``.safetensors.index.json`` of safetensors shards), or an
    index's fsspec URL (its shards are read with range requests, as Reader(url));
    ``storage_options``: fsspec's options for the URL's filesystem, used for the
    index and every shard."""
    return ShardedReader(path, storage_options)
