"""``ztensor.convert``: one tensor file to another, or a sharded checkpoint directory
to a directory of shards or to one file, one tensor at a time.

* A file in any format ``Reader`` reads becomes the format the output's name says:
  ``.zt`` (v1.2), ``.safetensors``, ``.npz`` or ``.gguf`` (ztensor/foreign/export.py).
* A checkpoint directory or index (``model.safetensors.index.json``, Hugging Face's
  layout, ``pytorch_model.bin.index.json`` or ``.zt.index.json``) becomes:

  - one file, when the output's name says a format (``out.zt``, ``out.safetensors``,
    ``out.npz``, ``out.gguf``): every shard's tensors merged (``_merge_checkpoint``);
  - else an output directory: each shard converted on its own, then the index
    written last, atomically, so a crash never leaves an index naming a shard that
    is not complete.  ``format="zt"`` (the default) keeps each shard's stem
    (``.zt``) and writes ``model.zt.index.json``; ``format="safetensors"`` writes
    Hugging Face's names (``model.safetensors`` alone, or ``model-00001-of-0000N
    .safetensors`` and ``model.safetensors.index.json``), which transformers loads.
    Every other regular file of the checkpoint folder (config, tokenizer, README)
    is copied byte for byte (``_plan_copies`` says which, and why not).

  Everything is checked first (``_plan_checkpoint``, ``_check_shards_fit``,
  ``_plan_copies``): two shards that would have one output name, a tensor in two
  shards, an index naming a tensor its shard lacks, an output that would replace an
  input, a tensor or attribute the output format cannot hold, a file to copy that
  is not a regular file or links outside the folder are refused before anything is
  written, and the index lists exactly the tensors of the shards written.

Inputs are memory-mapped where their format allows, and tensors larger than
``STREAM_CHUNK`` are written through ``Writer.stream`` a chunk at a time (compressed
and digested as they go), so memory stays at one chunk, not one tensor.  Every
output file is written to a temporary name and renamed into place.
``progress(bytes done, bytes total)`` is called after each tensor, totals counted in
input bytes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import unicodedata
import warnings
from typing import Callable, Iterator, List, NamedTuple, Optional, Union

import numpy as np

from ztensor import sharded
from ztensor.container.reader import Reader
from ztensor.container.writer import Writer
from ztensor.errors import FormatError, UnsupportedError, ZTensorError
from ztensor.foreign import export as exporters
from ztensor.foreign.names import NameTable
from ztensor.io import atomic, checkpoint_moves
from ztensor.io.source import is_url, open_local_input
from ztensor.tools import convert_inputs

PathLike = Union[str, "os.PathLike[str]"]
Progress = Optional[Callable[[int, int], None]]
# dense tensors larger than this go through Writer.stream in chunks of this size, so
# a conversion holds one chunk of a huge tensor, compressed or byte-swapped, at a time
STREAM_CHUNK = 16 << 20
INDEX_NAME = "model.zt.index.json"
# shard format of a checkpoint converted into a directory -> the index it gets
SHARD_FORMATS = {"zt": INDEX_NAME, "safetensors": "model.safetensors.index.json"}


def convert(
    input: PathLike,
    output: PathLike,
    *,
    compress: Union[bool, int] = False,
    checksum: Optional[str] = None,
    force: bool = False,
    progress: Progress = None,
    format: Optional[str] = None,
    drop_attributes: bool = False,
) -> int:
    """Convert ``input`` to ``output`` (see the module doc); returns the number of
    tensors written.  An existing output is refused unless ``force``.  ``format``
    (``"zt"`` or ``"safetensors"``) is the shard format of a checkpoint converted
    into a directory; for a file output it may only repeat what the name says.
    ``drop_attributes`` writes a ``.safetensors``, ``.npz`` or ``.gguf`` output
    without the attributes it has no place for (refused otherwise: nothing is
    dropped unasked)."""
    source, target = os.fspath(input), os.fspath(output)
    if format is not None and format not in SHARD_FORMATS:
        raise UnsupportedError(
            f"format {format!r}: a checkpoint directory is written as "
            f"{' or '.join(SHARD_FORMATS)} shards",
            path=target,
        )
    if is_url(source):
        # taken for a local path, a file's URL was "No such file or directory" (for a
        # server that refused the connection as for one that holds the file), and an
        # index's folder was listed and its shards read as local paths made from the
        # URL (./http:/host/ck/...)
        raise UnsupportedError(
            "convert reads from a local path (download the file or checkpoint first)",
            path=source,
        )
    checkpoint = os.path.isdir(source) or source.endswith(".index.json")
    _zt_options_fit(_output_kind(checkpoint, target, format), compress, checksum, target)
    if checkpoint:
        return _convert_checkpoint(
            source, target, compress, checksum, force, progress, format, drop_attributes
        )
    _format_agrees(target, format)
    # lexists: a link to a file not there yet is an output too (the file written
    # goes where it points), replaced only with --force, as _merge_checkpoint has it
    if os.path.lexists(target) and not force:
        raise ZTensorError("exists; pass force=True (--force) to replace it", path=target)
    with open_local_input(source) as f:  # a FIFO, a device, a NUL in the name: refused
        total = os.fstat(f.fileno()).st_size
    return _convert_file(
        source, target, compress, checksum, _Counter(progress, total), drop_attributes
    )


def _output_kind(checkpoint, target, fmt) -> str:
    """The format the output files get: the one ``target``'s name says, or for a
    checkpoint converted into a directory the shard format ``fmt`` (default zt)."""
    if checkpoint and not _is_file_target(target):
        return fmt or "zt"
    return exporters.format_for(target)


def _zt_options_fit(kind, compress, checksum, target):
    """``compress`` and ``checksum`` are options of the ``.zt`` writer: asked of
    another output (``convert IN out.safetensors --compress``, a checkpoint into a
    directory of safetensors shards) they are refused before anything is written,
    never silently dropped (the file came out uncompressed, no digest, exit 0)."""
    given = [
        option
        for option, value in (("compress", compress), ("checksum", checksum))
        if value is not None and value is not False and value != 0
    ]
    if given and kind != "zt":
        raise UnsupportedError(
            f"{' and '.join(f'--{o} ({o}=)' for o in given)} "
            f"{'applies' if len(given) == 1 else 'apply'} to .zt output only, "
            f"not {kind}: nothing was written",
            path=target,
        )


class _Counter:
    """Turns tensor sizes into progress(done, total) calls."""

    def __init__(self, progress, total):
        self.progress, self.total, self.done = progress, total, 0
        self.tensor_bytes = 0  # what the tensors hold, for an index's total_size

    def add(self, nbytes):
        self.tensor_bytes += nbytes
        self.done = min(self.done + nbytes, self.total)
        if self.progress is not None:
            self.progress(self.done, self.total)


def _convert_file(source, target, compress, checksum, counter, drop_attributes=False):

    kind = exporters.format_for(target)  # the output's name says its format
    with convert_inputs.input_reader(source) as reader:
        if kind != "zt":  # each exporter plans, then writes
            return exporters.writer_for(kind)(
                reader, target, progress=counter.add, drop_attributes=drop_attributes
            )
        exporters.plan_zt(reader)  # what .zt cannot hold, refused before the file exists
        require_room_for_zt(reader, target, compress)
    attributes, tensors = convert_inputs.open_any(source)
    return _write_zt(target, attributes, tensors, compress, checksum, counter)


def require_room_for_zt(reader, target, compress, size=None):
    """A WriteError before a raw ``.zt`` output of ``reader``'s objects is begun,
    when its disk has no room for every byte they hold decoded (``size``: the
    caller's count, dequantize's): a 1.8 KB stride-0 ``torch.save`` shard wrote a
    terabyte until the disk was full.  Compressed, the size is not known.  The one
    check for every ``.zt`` that convert and dequantize write."""
    if not compress:
        needed = exporters.data_bytes(reader, reader.keys()) if size is None else size
        atomic.require_room(target, needed)


def _write_zt(target, attributes, tensors, compress, checksum, counter):
    """``tensors`` ((name, Tensor) pairs) into one ``.zt`` file, a large dense one
    streamed (``_write_streamed``); returns how many were written."""

    count = 0
    with Writer(target, attributes=attributes) as writer:
        for name, tensor in tensors:
            data = tensor.components.get("data")
            if (
                tensor.format == "dense"
                and isinstance(data, np.ndarray)
                and data.nbytes > STREAM_CHUNK
            ):
                _write_streamed(writer, name, tensor, data, compress, checksum)
            else:
                writer.write(name, tensor, compress=compress, checksum=checksum)
            counter.add(sum(getattr(a, "nbytes", 0) for a in tensor.components.values()))
            count += 1
    return count


def _write_streamed(writer, name, tensor, data, compress, checksum):
    """A large dense tensor through Writer.stream, STREAM_CHUNK bytes at a time.
    The input is a mapped view (or a decoded array the importer already holds), so
    what this adds is one chunk: its byte-order swap or compressed frame, never a
    second copy of the tensor."""
    with writer.stream(
        name,
        tensor.shape,
        data.dtype,
        compress=compress,
        checksum=checksum,
        attributes=tensor.attributes or None,
        type=tensor.types.get("data"),
    ) as sink:
        if data.flags.c_contiguous:
            flat = data.reshape(-1)
            step = max(1, STREAM_CHUNK // data.itemsize)
            for start in range(0, flat.size, step):
                sink.write(flat[start : start + step])
        else:  # strided (a transposed input): blocks of leading rows, copied one at a time
            step = max(1, STREAM_CHUNK // max(1, data[0].nbytes))
            for start in range(0, data.shape[0], step):
                sink.write(np.ascontiguousarray(data[start : start + step]))


class _CheckpointPlan:
    """What converting a checkpoint will write, worked out and checked before any
    file is touched: ``shards`` as (input file, output file, tensor names), the
    output index's ``weight_map`` (every tensor of every output shard, once), the
    input ``index`` (None for a folder of one file) and each input shard's file
    ``attributes``."""

    def __init__(self, folder, shards, weight_map, metadata, indexed, index=None, attributes=None):
        self.folder, self.shards = folder, shards
        self.weight_map, self.metadata, self.indexed = weight_map, metadata, indexed
        self.index, self.attributes = index, attributes or {}


def _shard_names(files, fmt):
    """Input shard file -> output file name.  A ``.zt`` shard keeps its input's
    stem; a safetensors shard gets Hugging Face's name, the one transformers'
    ``from_pretrained`` looks for: ``model.safetensors`` when alone, else
    ``model-00001-of-0000N.safetensors`` in the input's shard order.  ``fmt`` None
    (a merge into one file): the input names, which never collide."""
    if fmt is None:
        return {file: file for file in files}
    if fmt == "zt":
        return {file: _stem(file) + ".zt" for file in files}
    if len(files) == 1:
        return {files[0]: "model.safetensors"}
    return {
        file: f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i, file in enumerate(files)
    }


def _plan_checkpoint(source, target, fmt="zt") -> _CheckpointPlan:
    """The one place a checkpoint conversion's names are checked: each input shard
    gets its own output file (two inputs with one stem, ``part.safetensors`` and
    ``part.zt``, or stems differing only in case, ``Part`` and ``part``, are
    refused, naming both), no tensor is in two shards, every tensor
    the input index names is in the shard it names, and no output replaces an input
    (nor is the output directory the checkpoint's own folder).  Each shard is opened
    (its manifest or header read, no data) to learn its names and attributes, so
    the index written lists exactly what the shards written hold.  ``fmt``: the
    output shards' format (``"zt"``, ``"safetensors"``), or None when the whole
    checkpoint is merged into the one file ``target``."""

    index = sharded.find_index(source)
    with sharded.open_sharded(source) as checkpoint:
        folder, files = checkpoint.folder, checkpoint.shards
        listed = {name: checkpoint.file_of(name) for name in checkpoint.keys()}
        metadata = dict(checkpoint.attributes)
        where = index or source
        outputs = NameTable(where, "output shard")
        tensors = NameTable(where, "tensor")
        out_names = _shard_names(files, fmt)
        shards, weight_map, attributes = [], {}, {}
        for file in files:
            out = out_names[file]
            # macOS and Windows file systems ignore case (and APFS the Unicode normal
            # form): two outputs differing only so would be one file there, the second
            # shard overwriting the first under an index that names both
            outputs.claim(out if fmt is None else _folded(out), file)
            # the sharded reader's one shard opener: a missing shard is a FormatError
            # naming the index, as open_sharded gives (a bare Reader let OSError out)
            with checkpoint.open_shard(file, unlisted_ok=True) as reader:
                names = reader.keys()
                attributes[file] = dict(reader.attributes)
            for name in names:
                tensors.claim(name, file)
                weight_map[name] = out
            shards.append((file, out, names))
    for name, file in listed.items():
        if name not in tensors:
            raise FormatError(
                f"the index names {name!r} in {file}, which does not hold it", path=where, obj=name
            )
    inputs = {os.path.realpath(os.path.join(folder, f)) for f in files}
    if index is not None:
        inputs.add(os.path.realpath(index))
    written = (
        [target]
        if fmt is None
        else [os.path.join(target, o) for _, o, _ in shards]
        + [os.path.join(target, SHARD_FORMATS[fmt])]
    )
    for out in written:
        if os.path.realpath(out) in inputs:
            raise FormatError(
                "converting would replace this input file; convert into another directory", path=out
            )
    # nor is the output directory the input folder: the files copied would be the
    # inputs themselves, and the outputs would sit among the inputs they came from
    if fmt is not None and os.path.realpath(target) == os.path.realpath(folder or "."):
        raise FormatError(
            "is the checkpoint's own folder: convert into another directory", path=target
        )
    return _CheckpointPlan(
        folder, shards, weight_map, metadata, index is not None, index, attributes
    )


def _folded(name: str) -> str:
    """``name`` as a case-insensitive, normalising file system compares it."""
    return unicodedata.normalize("NFC", name).casefold()


def _is_file_target(target) -> bool:
    """Whether a checkpoint converts into the one file ``target`` (its name says a
    format, ``out.safetensors``) rather than into a directory (any other name, an
    existing directory, or a name ending in a separator: ``out.zt/``)."""
    return not os.path.isdir(target) and os.path.splitext(target)[1].lower() in exporters.FORMATS


def _format_agrees(target, fmt):
    """A file output's format is the one its name says; ``format`` may only repeat it."""
    if fmt is not None:
        kind = exporters.format_for(target)
        if kind != fmt:
            raise UnsupportedError(
                f"format {fmt!r} asked for, but the output's name says {kind}", path=target
            )


def _convert_checkpoint(
    source, target, compress, checksum, force, progress, fmt=None, drop_attributes=False
):
    if _is_file_target(target):
        _format_agrees(target, fmt)
        return _merge_checkpoint(
            source, target, compress, checksum, force, progress, drop_attributes
        )
    if os.path.exists(target) and not os.path.isdir(target):
        raise ZTensorError("a checkpoint converts into a directory, not a file", path=target)
    fmt = fmt or "zt"
    plan = _plan_checkpoint(source, target, fmt)
    _check_shards_fit(plan, fmt, drop_attributes)
    copies = _plan_copies(plan)
    index_path = os.path.join(target, SHARD_FORMATS[fmt])
    existing = [
        p
        for p in [index_path]
        + [os.path.join(target, o) for _, o, _ in plan.shards]
        + [os.path.join(target, c.name) for c in copies]
        if os.path.lexists(p)
    ]
    if existing and not force:
        raise ZTensorError("exists; pass force=True (--force) to replace it", path=existing[0])
    made_folder = not os.path.isdir(target)
    os.makedirs(target, exist_ok=True)
    counter = _Counter(
        progress, sum(os.path.getsize(os.path.join(plan.folder, f)) for f, _, _ in plan.shards)
    )
    # every output file is written into a hidden folder inside ``target`` first; only
    # once all of them are whole is the old index removed and each renamed into place
    # (with the mode of the file it replaces), the new index last.  A failure part way
    # (a full disk, an interrupt, a shard whose data is broken) removes the staged
    # files, so the old checkpoint stays as it was, index and all: replacing shard
    # by shard left the new first shard beside the old second one and no index
    try:
        with checkpoint_moves.staged(target) as staging:
            with checkpoint_moves.staged_as_target(staging, target):
                count = _write_checkpoint(
                    plan, fmt, copies, staging, compress, checksum, counter, drop_attributes
                )
            # the old index goes first (a crash then leaves no index, never a wrong
            # one), and the old checkpoint's shards this one does not rewrite after
            # the new index
            checkpoint_moves.move_staged(
                staging,
                target,
                os.path.basename(index_path),
                # a model's config.json copied in describes the new weights only:
                # transformers' own beside it loaded under it without a word
                replaced=lambda: (
                    sharded.old_shards(index_path)
                    + (
                        sharded.transformers_weights(target)
                        if any(c.name == "config.json" for c in copies)
                        else []
                    )
                ),
            )
    except BaseException:
        if made_folder:
            try:
                os.rmdir(target)  # only when empty: nothing of anyone else's is removed
            except OSError:
                pass
        raise
    if progress is not None:
        progress(counter.total, counter.total)
    return count


def _write_checkpoint(plan, fmt, copies, folder, compress, checksum, counter, drop_attributes):
    """The planned shards, copies and index into ``folder`` (the staging folder)."""
    count = 0
    for file, out, names in plan.shards:  # one shard at a time: memory stays at one tensor
        written = _convert_file(
            os.path.join(plan.folder, file),
            os.path.join(folder, out),
            compress,
            checksum,
            counter,
            drop_attributes,
        )
        if written != len(names):  # the index lists what the plan saw: it must be so
            raise ZTensorError(
                f"{written} tensors written where {len(names)} were found",
                path=os.path.join(plan.folder, file),
            )
        count += written
    for copy in copies:
        _copy_file(copy, plan.folder, folder)
    # Hugging Face writes no index for one safetensors shard (model.safetensors is
    # loaded by name); a .zt checkpoint keeps an index whenever its input had one; a
    # checkpoint of no tensors is its index alone (there was no file at all: a
    # folder no command opened)
    if len(plan.shards) != 1 or (plan.indexed and fmt == "zt"):
        atomic.write_json_atomically(
            os.path.join(folder, SHARD_FORMATS[fmt]),
            {
                "metadata": {**plan.metadata, "total_size": counter.tensor_bytes},
                "weight_map": plan.weight_map,
            },
        )
    return count


def _check_shards_fit(plan, fmt, drop_attributes=False):
    """Every input shard checked against the output format before any shard is
    written (``exporters.plan_zt``: names and attributes the Writer takes;
    ``exporters.plan_safetensors``: dense tensors of a safetensors dtype, string
    metadata), so a refusal leaves no directory of some shards."""
    for file, _, _ in plan.shards:
        with Reader(os.path.join(plan.folder, file)) as reader:
            if fmt == "zt":
                exporters.plan_zt(reader)
            else:
                exporters.plan_safetensors(reader, drop_attributes)


# ------------------------------------------------------------------ one file
def _merge_checkpoint(source, target, compress, checksum, force, progress, drop_attributes=False):
    """Every tensor of every shard into the one file ``target``, of the format its
    name says, one tensor at a time (each exporter streams tensor by tensor; a
    ``.zt`` streams large tensors in chunks), one shard open at a time.  The shards'
    file attributes become the file's (a key two shards give different values is
    refused); the index's metadata (``total_size``) describes the split and is not
    kept.  Everything the format cannot hold is refused before the file is
    created."""

    kind = exporters.format_for(target)
    if os.path.lexists(target) and not force:
        raise ZTensorError("exists; pass force=True (--force) to replace it", path=target)
    with checkpoint_as_one(source, target) as merged:
        counter = _Counter(progress, merged.input_bytes)
        if kind == "zt":
            exporters.plan_zt(merged)  # as the other exporters plan, before writing
            require_room_for_zt(merged, target, compress)
            count = _write_zt(
                target, merged.attributes, merged.tensors(), compress, checksum, counter
            )
        else:
            count = exporters.writer_for(kind)(
                merged, target, progress=counter.add, drop_attributes=drop_attributes
            )
    if progress is not None:
        progress(counter.total, counter.total)
    return count


@contextlib.contextmanager
def checkpoint_as_one(source, target=None) -> Iterator["_MergedReader"]:
    """A checkpoint directory or index read as one file is: ``path``,
    ``attributes`` (the shards' merged: a key two shards give different values is
    refused), ``keys``, ``metadata``, ``read``, one shard open at a time, every
    ``.zt`` digest checked (convert_inputs.READ_OPTIONS).  What a merged output is
    written from: ``convert DIR out.zt`` and ``dequantize DIR out.zt``.  ``target``:
    the output, which may not be one of the checkpoint's files."""
    plan = _plan_checkpoint(source, target if target is not None else os.devnull, None)
    where = plan.index or source
    if (
        target is not None
        and plan.index is None
        and os.path.dirname(atomic.final_target(target)) == os.path.realpath(plan.folder)
    ):
        # a folder without an index is read as its one checkpoint file: a second
        # beside it made a folder every command refused ("not exactly one")
        raise ZTensorError(
            "is in the folder of the checkpoint it is made from, which has no index: "
            "that folder would hold two checkpoint files; write it elsewhere",
            path=target,
        )
    attributes = _merged_attributes(plan, where)
    with sharded.open_sharded(source) as checkpoint:
        merged = _MergedReader(checkpoint, plan, attributes, where)
        try:
            yield merged
        finally:
            merged.close()


def _merged_attributes(plan, where):
    """The file attributes of every shard, as one map; a key two shards give
    different values has no one value and is refused, naming both shards."""
    merged, origin = {}, {}
    for file, _, _ in plan.shards:
        for key, value in plan.attributes.get(file, {}).items():
            if key in merged and not (merged[key] == value or repr(merged[key]) == repr(value)):
                raise UnsupportedError(
                    f"attribute {key!r} differs between shards "
                    f"{origin[key]} and {file}: one file holds one value",
                    path=where,
                )
            merged.setdefault(key, value)
            origin.setdefault(key, file)
    return merged


class _MergedReader:
    """The part of the Reader API the exporters use (``path``, ``attributes``,
    ``keys``, ``metadata``, ``read``) over every shard of a planned checkpoint, in
    the plan's order, so one shard is open at a time."""

    def __init__(self, checkpoint, plan, attributes, path):
        self.path, self.attributes = path, attributes
        # what the checkpoint's files hold, for progress
        self.input_bytes = sum(
            os.path.getsize(os.path.join(plan.folder, f)) for f, _, _ in plan.shards
        )
        self._checkpoint = checkpoint
        self._names = [name for _, _, names in plan.shards for name in names]
        self._file_of = {name: file for file, _, names in plan.shards for name in names}
        self._file, self._reader = None, None

    def keys(self):
        return list(self._names)

    def _shard(self, name):
        file = self._file_of[name]
        if file != self._file:
            self.close()
            self._reader = self._checkpoint.open_shard(
                file, unlisted_ok=True, **convert_inputs.READ_OPTIONS
            )
            self._file = file
        return self._reader

    def metadata(self, name):
        return self._shard(name).metadata(name)

    def read(self, name):
        return self._shard(name).read(name)

    def tensors(self):
        for name in self._names:
            yield name, self.read(name)

    def close(self):
        if self._reader is not None:
            self._reader.close()
        self._file, self._reader = None, None


# ------------------------------------------------------------------ files copied
class _Copy(NamedTuple):
    name: str  # in the input folder and in the output directory
    source: str  # the path opened: the file itself, or a contained link's target


def _plan_copies(plan) -> List[_Copy]:
    """The files of the checkpoint's folder that are not weights, copied byte for
    byte into the output directory so that it is a complete checkpoint (config,
    generation config, tokenizer and vocabulary files, chat templates, README).

    Not copied: every shard this conversion reads and every ``*.index.json`` (the
    index written replaces them); a file with a weight suffix (``sharded.WEIGHT_SUFFIXES``:
    another format's copy of the weights, ``pytorch_model.bin`` beside
    ``model.safetensors``); subfolders (another model, ``original/``, ``onnx/``, a
    ``.git``: only the folder's own files make the checkpoint).  Those skipped are
    named in one warning.

    Refused, before anything is written (FormatError naming the entry): an entry
    that is not a regular file or a folder (a FIFO, socket or device, which a copy
    could block on or read without end), a broken link, and a link whose target
    lies outside the folder: a copy is the link target's bytes, unchecked, so a
    hostile ``config.json -> /etc/passwd`` would carry that file into the output.
    One exception, Hugging Face's cache layout: in ``<repo>/snapshots/<rev>/``
    every file links to ``<repo>/blobs/``, which counts as inside."""
    folder = plan.folder or "."
    real = os.path.realpath(folder)
    roots = [real]
    if os.path.basename(os.path.dirname(real)) == "snapshots":
        roots.append(os.path.join(os.path.dirname(os.path.dirname(real)), "blobs"))
    read = {file for file, _, _ in plan.shards}
    copies, skipped, subfolders = [], [], []
    with os.scandir(folder) as entries:
        listing = sorted(entries, key=lambda e: e.name)
    for entry in listing:
        name, path = entry.name, os.path.join(folder, entry.name)
        if name in read or name.endswith(".index.json"):
            continue
        if name.lower().endswith(sharded.WEIGHT_SUFFIXES):
            skipped.append(name)
            continue
        target = path
        if entry.is_symlink():
            target = os.path.realpath(path)
            if not any(_inside(target, root) for root in roots):
                raise FormatError(
                    "is a link to a file outside the checkpoint folder; its "
                    "content is not copied (put the file itself there if it "
                    "is meant)",
                    path=path,
                )
        try:
            mode = os.stat(target).st_mode
        except OSError as exc:
            raise FormatError(f"cannot be copied: {exc.strerror or exc}", path=path) from None
        if stat.S_ISDIR(mode):
            subfolders.append(name)
        elif not stat.S_ISREG(mode):
            raise FormatError(
                "not a regular file (a FIFO, socket or device): only regular "
                "files are copied into a converted checkpoint",
                path=path,
            )
        else:
            copies.append(_Copy(name, target))
    if skipped or subfolders:
        parts = []
        if skipped:
            parts.append("weights this conversion does not read: " + _listed(skipped))
        if subfolders:
            parts.append("subfolders: " + _listed(subfolders))
        warnings.warn(f"{folder}: not copied ({'; '.join(parts)})", stacklevel=4)
    return copies


def _inside(path, root) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # another drive
        return False


def _listed(names, most=5) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _copy_file(copy, folder, target):
    """``copy`` into ``target``, atomically (a temporary file renamed into place).
    The planned path is opened without following a link (a file swapped for a link
    after the plan is refused) and without blocking, and checked again on the open
    descriptor: a regular file, or FormatError."""
    label = os.path.join(folder, copy.name)
    flags = (
        os.O_RDONLY
        | getattr(os, "O_BINARY", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOFOLLOW", 0)
    )
    try:
        fd = os.open(copy.source, flags)
    except OSError as exc:
        raise FormatError(f"cannot be copied: {exc.strerror or exc}", path=label) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(
                "not a regular file: only regular files are copied into a converted checkpoint",
                path=label,
            )
        atomic.replace_atomically(
            os.path.join(target, copy.name), lambda out: shutil.copyfileobj(f, out, 1 << 20)
        )


def _stem(file):
    for suffix in (".safetensors", ".zt", ".bin", ".pt", ".pth"):
        if file.endswith(suffix):
            return file[: -len(suffix)]
    return file


__all__ = ["convert"]
