"""``ztensor.convert``: one tensor file to another, or a sharded checkpoint directory
to a directory of ``.zt`` shards, one tensor at a time.

* A file in any format ``Reader`` reads becomes the format the output's name says:
  ``.zt`` (v1.2), ``.safetensors``, ``.npz`` or ``.gguf`` (ztensor/exporters.py).
* A checkpoint directory or index (``model.safetensors.index.json``, Hugging Face's
  layout, or ``.zt.index.json``) becomes an output directory: each shard converted on
  its own (same stem, ``.zt``), then ``model.zt.index.json`` written last, atomically,
  so a crash never leaves an index naming a shard that is not complete.  Everything
  is checked first (``_plan_checkpoint``): two shards that would have one output
  name, a tensor in two shards, an index naming a tensor its shard lacks, or an
  output that would replace an input are refused before anything is written, and
  the index lists exactly the tensors of the shards written.

Inputs are memory-mapped where their format allows, and tensors larger than
``STREAM_CHUNK`` are written through ``Writer.stream`` a chunk at a time (compressed
and digested as they go), so memory stays at one chunk, not one tensor.  Every
output file is written to a temporary name and renamed into place.
``progress(bytes done, bytes total)`` is called after each tensor, totals counted in
input bytes.
"""
from __future__ import annotations

import os
from typing import Callable, Optional, Union

import numpy as np

from ztensor import atomic
from ztensor.errors import FormatError, ZTensorError

PathLike = Union[str, "os.PathLike[str]"]
Progress = Optional[Callable[[int, int], None]]
# dense tensors larger than this go through Writer.stream in chunks of this size, so
# a conversion holds one chunk of a huge tensor, compressed or byte-swapped, at a time
STREAM_CHUNK = 16 << 20
INDEX_NAME = "model.zt.index.json"


def convert(input: PathLike, output: PathLike, *, compress: Union[bool, int] = False,
            checksum: Optional[str] = None, force: bool = False,
            progress: Progress = None) -> int:
    """Convert ``input`` to ``output`` (see the module doc); returns the number of
    tensors written.  An existing output is refused unless ``force``."""
    source, target = os.fspath(input), os.fspath(output)
    if os.path.isdir(source) or source.endswith(".index.json"):
        return _convert_checkpoint(source, target, compress, checksum, force, progress)
    if os.path.exists(target) and not force:
        raise ZTensorError("exists; pass force=True (--force) to replace it", path=target)
    from ztensor.source import open_local_input
    with open_local_input(source) as f:  # a FIFO, a device, a NUL in the name: refused
        total = os.fstat(f.fileno()).st_size
    return _convert_file(source, target, compress, checksum, _Counter(progress, total))


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


def _convert_file(source, target, compress, checksum, counter):
    from ztensor import exporters, importers
    from ztensor.reader import Reader
    from ztensor.writer import Writer

    kind = exporters.format_for(target)  # the output's name says its format
    if kind != "zt":
        with Reader(source) as reader:
            return exporters.writer_for(kind)(reader, target, progress=counter.add)
    attributes, tensors = importers.open_any(source)
    count = 0
    with Writer(target, attributes=attributes) as writer:
        for name, tensor in tensors:
            data = tensor.components.get("data")
            if tensor.format == "dense" and isinstance(data, np.ndarray) \
                    and data.nbytes > STREAM_CHUNK:
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
    with writer.stream(name, tensor.shape, data.dtype, compress=compress,
                       checksum=checksum, attributes=tensor.attributes or None,
                       type=tensor.types.get("data")) as sink:
        if data.flags.c_contiguous:
            flat = data.reshape(-1)
            step = max(1, STREAM_CHUNK // data.itemsize)
            for start in range(0, flat.size, step):
                sink.write(flat[start:start + step])
        else:  # strided (a transposed input): blocks of leading rows, copied one at a time
            step = max(1, STREAM_CHUNK // max(1, data[0].nbytes))
            for start in range(0, data.shape[0], step):
                sink.write(np.ascontiguousarray(data[start:start + step]))


class _CheckpointPlan:
    """What converting a checkpoint will write, worked out and checked before any
    file is touched: ``shards`` as (input file, output file, tensor names) and the
    output index's ``weight_map`` (every tensor of every output shard, once)."""

    def __init__(self, folder, shards, weight_map, metadata, indexed):
        self.folder, self.shards = folder, shards
        self.weight_map, self.metadata, self.indexed = weight_map, metadata, indexed


def _plan_checkpoint(source, target) -> _CheckpointPlan:
    """The one place a checkpoint conversion's names are checked: each input shard
    gets its own output file (two inputs with one stem, ``part.safetensors`` and
    ``part.zt``, are refused, naming both), no tensor is in two shards, every tensor
    the input index names is in the shard it names, and no output replaces an input.
    Each shard is opened (its manifest or header read, no data) to learn its names,
    so the index written lists exactly what the shards written hold."""
    from ztensor import sharded
    from ztensor.foreign.names import NameTable

    index = sharded.find_index(source)
    with sharded.open_sharded(source) as checkpoint:
        folder, files = checkpoint.folder, checkpoint.shards
        listed = {name: checkpoint.file_of(name) for name in checkpoint.keys()}
        metadata = dict(checkpoint.attributes)
    where = index or source
    outputs = NameTable(where, "output shard")
    tensors = NameTable(where, "tensor")
    shards, weight_map = [], {}
    for file in files:
        out = outputs.claim(_stem(file) + ".zt", file)
        # the sharded reader's one shard opener: a missing shard is a FormatError
        # naming the index, as open_sharded gives (a bare Reader let OSError out)
        with checkpoint.open_shard(file, unlisted_ok=True) as reader:
            names = reader.keys()
        for name in names:
            tensors.claim(name, file)
            weight_map[name] = out
        shards.append((file, out, names))
    for name, file in listed.items():
        if name not in tensors:
            raise FormatError(f"the index names {name!r} in {file}, which does not hold it",
                              path=where, obj=name)
    inputs = {os.path.realpath(os.path.join(folder, f)) for f in files}
    if index is not None:
        inputs.add(os.path.realpath(index))
    for out in [os.path.join(target, o) for _, o, _ in shards] + [
            os.path.join(target, INDEX_NAME)]:
        if os.path.realpath(out) in inputs:
            raise FormatError("converting would replace this input file; convert into "
                              "another directory", path=out)
    return _CheckpointPlan(folder, shards, weight_map, metadata, index is not None)


def _convert_checkpoint(source, target, compress, checksum, force, progress):
    from ztensor import sharded

    if os.path.exists(target) and not os.path.isdir(target):
        raise ZTensorError("a checkpoint converts into a directory, not a file", path=target)
    plan = _plan_checkpoint(source, target)
    index_path = os.path.join(target, INDEX_NAME)
    existing = [p for p in [index_path] + [os.path.join(target, o) for _, o, _ in plan.shards]
                if os.path.exists(p)]
    if existing and not force:
        raise ZTensorError("exists; pass force=True (--force) to replace it", path=existing[0])
    os.makedirs(target, exist_ok=True)
    if os.path.exists(index_path):
        os.unlink(index_path)  # from here on a crash leaves no index, never a wrong one
    counter = _Counter(progress, sum(os.path.getsize(os.path.join(plan.folder, f))
                                     for f, _, _ in plan.shards))
    count = 0
    for file, out, names in plan.shards:  # one shard at a time: memory stays at one tensor
        written = _convert_file(os.path.join(plan.folder, file), os.path.join(target, out),
                                compress, checksum, counter)
        if written != len(names):  # the index lists what the plan saw: it must be so
            raise ZTensorError(f"{written} tensors written where {len(names)} were found",
                               path=os.path.join(plan.folder, file))
        count += written
    if plan.indexed or len(plan.shards) > 1:
        atomic.write_json_atomically(index_path, {
            "metadata": {**plan.metadata, "total_size": counter.tensor_bytes},
            "weight_map": plan.weight_map})
    if progress is not None:
        progress(counter.total, counter.total)
    return count


def _stem(file):
    for suffix in (".safetensors", ".zt", ".bin", ".pt", ".pth"):
        if file.endswith(suffix):
            return file[:-len(suffix)]
    return file


__all__ = ["convert"]
