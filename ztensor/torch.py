"""safetensors-style functions for PyTorch: switching is a one-line change.

>>> from ztensor.torch import save_file, load_file    # was: from safetensors.torch ...
>>> save_file({"w": torch.zeros(2, 3)}, "model.zt")
>>> load_file("model.zt")["w"].shape
torch.Size([2, 3])

Supported dtypes, both ways: float64/32/16, bfloat16, the four float8 types,
int64/32/16/8, uint8 (and the wider unsigned types torch has), bool, complex64/128.

The functions and helpers of ``safetensors.torch`` are here under the same names
and with the same behaviour (shared and tied weights in ``save_model`` /
``load_model``, ``_find_shared_tensors``, ``_remove_duplicate_names``,
``storage_ptr``, ...).  Deliberate deviations are listed in docs/migrating.md:
non-contiguous tensors are stored (safetensors refuses them), and shared-memory
errors are a ``ztensor.FormatError``, which is both the ``RuntimeError``
safetensors raises and the ``ValueError`` the reference ztensor raised.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import numpy as np
import torch

from ztensor import _save, dtypes, sharded
from ztensor.container import checkpoint_keys
from ztensor.container.reader import Reader, open_bytes, require_file_name
from ztensor.container.writer import Writer
from ztensor.errors import FormatError, UnsupportedError
from ztensor.foreign.names import NameTable
from ztensor.frameworks.staging import for_device as staging_for
from ztensor.frameworks.staging import torch_device
from ztensor.frameworks.torch_bridge import (
    copy_into,
    is_cpu,
    numpy_to_torch_plain,
    object_to_torch,
    to_numpy_for_writing,
)
from ztensor.safe import mapped_for_backend
from ztensor.sharded import open_sharded, save_sharded
from ztensor.tensor import Tensor

__all__ = ["save_file", "load_file", "save", "load", "save_model", "load_model"]


# ------------------------------------------------------------------ storage helpers
def storage_ptr(tensor: torch.Tensor) -> int:
    """Address of the storage a tensor views (0 where there is none, e.g. meta)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: torch.Tensor) -> int:
    """Bytes of the storage a tensor views."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return tensor.nelement() * tensor.element_size()


def _end_ptr(tensor: torch.Tensor) -> int:
    """One past the last byte the tensor's elements occupy, from its strides (torch
    has no negative ones): ``view(-1)`` raised a bare RuntimeError for a transposed
    or stepped view sharing a storage with another tensor."""
    if tensor.nelement():
        last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
        return tensor.data_ptr() + (last + 1) * tensor.element_size()
    return tensor.data_ptr()


def _is_complete(tensor: torch.Tensor) -> bool:
    """The tensor covers its whole storage, from its first byte."""
    return tensor.data_ptr() == storage_ptr(
        tensor
    ) and tensor.nelement() * tensor.element_size() == storage_size(tensor)


def _filter_shared_not_shared(
    groups: List[Set[str]], state_dict: Dict[str, torch.Tensor]
) -> List[Set[str]]:
    """Split each storage group into sets of names whose byte ranges overlap:
    disjoint views of one storage are not shared (each is saved on its own)."""
    out = []
    for group in groups:
        if len(group) < 2:
            out.append(group)
            continue
        spans = sorted((state_dict[n].data_ptr(), _end_ptr(state_dict[n]), n) for n in group)
        current, end = {spans[0][2]}, spans[0][1]
        for start, stop, name in spans[1:]:
            if start >= end:
                out.append(current)
                current, end = {name}, stop
            else:
                current.add(name)
                end = max(end, stop)
        out.append(current)
    return out


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Sets of names whose tensors overlap in memory (singletons included)."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for name, t in state_dict.items():
        if t.device.type != "meta" and storage_ptr(t) != 0 and storage_size(t) != 0:
            by_storage[(t.device, storage_ptr(t), storage_size(t))].add(name)
    # first-appearance order, as safetensors gives it
    return _filter_shared_not_shared(list(by_storage.values()), state_dict)


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of tied tensors: the name to keep -> the names to drop.  The
    kept name covers its whole storage; among those, a preferred name wins, then one
    not to discard, then the first in sorted order."""
    return _names_to_remove(
        _find_shared_tensors(state_dict), state_dict, preferred_names, discard_names
    )


def _names_to_remove(
    groups: List[Set[str]],
    state_dict: Dict[str, torch.Tensor],
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """:func:`_remove_duplicate_names` over groups already found (load_model finds
    them once and decides twice: before loading, then with the names it loaded)."""
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    to_remove: Dict[str, List[str]] = defaultdict(list)
    for shared in groups:
        complete = {n for n in shared if _is_complete(state_dict[n])}
        if not complete:
            # a FormatError, as every shared-memory refusal here (the module's
            # docstring): both the RuntimeError safetensors raises and a ZTensorError
            raise FormatError(
                "Error while trying to find names to remove to save state dict, but found no "
                f"suitable name to keep for saving amongst: {shared}. None is covering the "
                "entire storage. Refusing to save/load the model since you could be storing "
                "much more memory than needed."
            )
        keep = sorted(complete)[0]
        kept_not_discarded = complete - discard
        if kept_not_discarded:
            keep = sorted(kept_not_discarded)[0]
        if preferred & complete:
            keep = sorted(preferred & complete)[0]
        for name in sorted(shared):
            if name != keep:
                to_remove[keep].append(name)
    return to_remove


# public names of the shared-tensor rules (safetensors keeps them private; other
# modules, ztensor.transformers' save_pretrained among them, use these)
find_shared_tensors = _find_shared_tensors
remove_duplicate_names = _remove_duplicate_names


def _check_tensors(tensors: Any, path: Any = None) -> None:
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = [
        k for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.layout != torch.strided
    ]
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this "
            "library does not support. You can make it a dense tensor before "
            "saving with `.to_dense()` but be aware this might make a much "
            "larger file than needed."
        )
    for k, v in tensors.items():
        if not isinstance(v, torch.Tensor):
            raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received {type(v)}")
    failing = [names for names in _find_shared_tensors(tensors) if len(names) > 1]
    if failing:
        raise FormatError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and "
            f"potential differences when loading them again: {failing}. A potential way to "
            "correctly save your model is to use `save_model`.",
            path=path,
        )


# ------------------------------------------------------------------ files
def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: Any,
    metadata: Optional[Dict[str, str]] = None,
    compression: Any = None,
    *,
    compress: Any = None,
    checksum: Optional[str] = None,
    storage_options: Optional[Dict[str, Any]] = None,
) -> None:
    """Write ``tensors`` (name -> torch.Tensor) as a zTensor file.

    ``compress``: zstd for every tensor (True: level 3; an int: that level), the
    Writer's spelling; ``compression`` is the same, as the reference ztensor 1.2.3
    spells it, fourth positionally as there (not both).  ``checksum``: None,
    ``"crc32c"`` or ``"sha256"``.

    Tensors may live on any device and have any strides (they are stored as
    contiguous copies).  Tensors that overlap in memory are refused, as
    safetensors does: use :func:`save_model` for tied weights.  ``storage_options``:
    fsspec's options for a URL's filesystem (credentials, endpoint), as
    :class:`ztensor.Writer` takes them."""
    compression = _save.compress_option(compress, compression)
    _check_tensors(tensors, filename)
    with Writer(
        filename, attributes=_save.str_metadata(metadata), storage_options=storage_options
    ) as w:
        for name, t in _save.canonical_order(tensors):  # one order: same tensors, same bytes
            arr, type_name = to_numpy_for_writing(t, name, w.path)
            w.write(
                name,
                Tensor(
                    {"data": arr},
                    shape=tuple(t.shape),
                    types={"data": type_name} if type_name else None,
                ),
                compress=compression,
                checksum=checksum,
            )


def load_file(
    filename: Any,
    device: Any = "cpu",
    copy: bool = False,
    *,
    dequantize: bool = False,
    threads: Optional[int] = None,
    storage_options: Optional[Dict[str, Any]] = None,
    backend: str = "mmap",
) -> Dict[str, torch.Tensor]:
    """name -> torch.Tensor for every tensor of a file, on ``device``.

    ``filename`` may also be a sharded checkpoint: its directory or its index
    (``*.zt.index.json``, ``*.safetensors.index.json``): every tensor the index
    lists, each shard loaded as one file is.

    On the CPU the tensors are zero-copy views of a private (copy-on-write) mapping
    of the file (zTensor and safetensors files) unless ``copy``: then the plain ones
    are read in one batch, copied in ``threads`` threads (ztensor/container/batch.py);
    elsewhere each tensor goes to the device directly.  Writing to a view changes
    that tensor only, never the file.  Quantized (GPTQ) objects come under GPTQ
    checkpoint names, or dequantized with ``dequantize=True`` (see
    :func:`ztensor.numpy.load_file`).  ``storage_options`` go to fsspec for a URL
    (credentials, ``ztensor_allow_unversioned``: see docs/remote.md).

    ``device``: anything ``torch.device`` takes, or None (the CPU); one torch cannot
    use here is an UnsupportedError before the file is read
    (:func:`ztensor.frameworks.staging.torch_device`).  ``copy`` is third
    positionally, as in the reference ztensor.  A file's contents (bytes) are no
    filename: a TypeError, as in safetensors; :func:`load` takes them.  ``backend``:
    safetensors 0.8's ``"mmap"`` or ``"pread"`` (read without mapping: owned
    tensors; :func:`ztensor.safe.mapped_for_backend`)."""
    require_file_name(filename, "load_file", "ztensor.torch.load")
    mapped = mapped_for_backend(backend)
    device = torch_device(device, filename if isinstance(filename, (str, os.PathLike)) else None)
    if sharded.is_checkpoint(filename):
        out: Dict[str, torch.Tensor] = {}
        parts = _shard_by_shard(
            filename, device, copy, dequantize, threads, storage_options, mmap=mapped
        )
        for _, part in parts:
            out.update(part)
        return out
    with Reader(filename, copy_on_write=True, mmap=mapped, storage_options=storage_options) as r:
        return _load_reader(r, device, copy, dequantize, threads)


def _shard_by_shard(
    checkpoint: Any,
    device: Any,
    copy: bool,
    dequantize: bool,
    threads: Optional[int],
    storage_options: Optional[Dict[str, Any]] = None,
    *,
    mmap: bool = True,
):
    """(shard file, name -> tensor) for each shard of a checkpoint in turn, each as
    :func:`load_file` loads one file, restricted to the tensors the index places
    there.  A checkpoint name given by two shards is refused (a GPTQ object's
    ``x.qweight`` in one, a plain ``x.qweight`` in another), before that shard
    changes anything."""
    with open_sharded(checkpoint, storage_options=storage_options) as ckpt:
        taken = NameTable(ckpt.path, "tensor")
        for file in ckpt.files():
            with ckpt.open_shard(file, copy_on_write=True, mmap=mmap) as r:
                only = set(ckpt.names_in(file))
                for key, (name, _) in checkpoint_keys.entries(r, dequantize).items():
                    if name in only:
                        taken.claim(key, f"{key} in {file}")
                part = _load_reader(r, device, copy, dequantize, threads, only)
            yield file, part
            del part  # a suspended generator must not keep this shard mapped


# public for ztensor.transformers, which fills a model one shard at a time
shard_by_shard = _shard_by_shard


def _load_reader(
    r: Reader,
    device: Any,
    copy: bool,
    dequantize: bool,
    threads: Optional[int],
    only: Optional[Set[str]] = None,
) -> Dict[str, torch.Tensor]:
    """load_file's work on one open Reader (``only``: these objects, else all)."""
    out = {}
    on_cpu = is_cpu(device)
    entries = checkpoint_keys.entries(r, dequantize)
    if only is not None:
        entries = {key: entry for key, entry in entries.items() if entry[0] in only}
    owned = {}
    format_of = r.internals.format_of  # no spec built per object (reader.py)
    if copy and on_cpu:
        plain = [
            name for name, role in entries.values() if role is None and format_of(name) == "dense"
        ]
        owned = r.read_numpy(plain, copy=True, threads=threads)
    elif not on_cpu:  # one staging buffer, sized once for the largest object
        staging = staging_for(device)
        staging.reserve(max((_stored_bytes(r, name) for name, _ in entries.values()), default=0))
    # a plain dense object: read_numpy's zero-copy view of the private (copy-on-write)
    # mapping (a .zt file's found in the manifest's view table, no spec built); a
    # read-only view (a foreign file mapped read-only) or a big-endian host's
    # little-endian view goes the general way
    plain_view = r.internals.plain_view if on_cpu and not copy else None
    for key, (name, role) in entries.items():
        if role is None:
            arr = owned.get(name)
            if arr is None and plain_view is not None:
                arr = plain_view(name)
                if arr is not None and not arr.flags.writeable:
                    arr = None
            if (
                arr is not None
                and arr.dtype.kind in "biufc"
                and arr.dtype.isnative
                and not dtypes.is_ml_dtype(arr.dtype)  # ml_dtypes' FP8 say kind 'f'
                and not _may_be_typed(r, name, arr)
            ):
                out[key] = torch.from_numpy(arr)  # writable: shared, not copied
                continue
            if format_of(name) == "dense":
                out[key] = object_to_torch(r, name, copy=copy, device=device, sync=False)
                continue
        arr = checkpoint_keys.array(r, name, role, dtype=np.float16 if role is None else None)
        out[key] = numpy_to_torch_plain(arr, device, sync=False)
    if not on_cpu:
        staging.sync()  # every tensor complete, as after tensor.to(device)
    return out


def _may_be_typed(reader, name, arr):
    """Whether ``arr``, a batch read's owned array of ``name`` (read_numpy's values),
    may be the wrong torch tensor for it: bf16 storage or a logical type torch holds
    as its own dtype (float8, float4, e8m0) comes through numpy as its storage bits
    (u8, u16: a type ml_dtypes lacks) or decoded to float (no ml_dtypes), so such
    an object goes through object_to_torch (torch_bits_for), as ``copy=False`` and
    ``read_torch`` do; ``load_file(copy=True)`` and ``load(bytes)`` gave
    ``torch.uint8`` or ``float32`` for them.  The spec is asked only for arrays of
    those dtypes: building one for every float32 tensor would slow the common load."""
    kind = arr.dtype
    if not (kind.kind == "u" and kind.itemsize <= 2) and not (
        kind.kind == "f" and kind.itemsize <= 4 and dtypes.ml_dtypes_module() is None
    ):
        return False
    return "data" in reader.metadata(name).tensor_types


def _stored_bytes(reader, name):
    """The largest component of ``name``, decoded."""
    return max(
        (c.uncompressed_length or c.length for c in reader.metadata(name).components.values()),
        default=0,
    )


def save(
    tensors: Dict[str, torch.Tensor],
    metadata: Optional[Dict[str, str]] = None,
    compression: Any = None,
    *,
    compress: Any = None,
    checksum: Optional[str] = None,
) -> bytes:
    """The zTensor file for ``tensors``, as bytes (``compress``/``compression``,
    ``checksum`` as for :func:`save_file`)."""
    return _save.to_bytes(
        save_file,
        tensors,
        metadata,
        compress=_save.compress_option(compress, compression),
        checksum=checksum,
    )


def load(data: bytes, device: Any = "cpu") -> Dict[str, torch.Tensor]:
    """name -> torch.Tensor from a zTensor (or safetensors) file's bytes (owned copies):
    what :func:`load_file` gives for that file with ``copy=True`` (quantized objects
    under their GPTQ checkpoint names); ``device`` as for :func:`load_file`."""
    device = torch_device(device, "<bytes>")
    with open_bytes(data) as r:
        return _load_reader(r, device, copy=True, dequantize=False, threads=None)


# ------------------------------------------------------------------ models
def save_model(
    model: torch.nn.Module,
    filename: Any,
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = False,
    *,
    max_shard_size: Any = None,
    compress: Any = None,
    checksum: Optional[str] = None,
    compression: Any = None,
) -> None:
    """Save a model's state dict, keeping one copy of tied weights (the others are
    named in the metadata, ``dropped name -> kept name``, as safetensors does).

    With ``max_shard_size`` (or when ``filename`` is a directory) the model is saved
    as a sharded checkpoint in that directory (:func:`ztensor.save_sharded`).
    ``compress``/``compression`` and ``checksum`` as for :func:`save_file`."""
    _require_module(model)
    compress = _save.compress_option(compress, compression)
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            # a copy: the caller's dict, reused for another model, kept this one's names
            metadata = {} if metadata is None else dict(metadata)
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    if max_shard_size is not None or os.path.isdir(os.fspath(filename)):
        _check_tensors(state_dict, filename)
        save_sharded(
            state_dict,
            filename,
            # as given: 0 or False is refused by parse_size, never taken as 5GB
            max_shard_size="5GB" if max_shard_size is None else max_shard_size,
            metadata=metadata,
            compress=compress,
            checksum=checksum,
        )
        return
    save_file(state_dict, filename, metadata, compress=compress, checksum=checksum)


# What torch's load_state_dict consults on each module besides its tensors: the
# methods torch documents for subclasses to override (underscored in torch, not ours)
# and the hook tables its register_*_hook functions fill.  A module that overrides
# one or has a hook loads its own way, and goes through load_state_dict.
_LOADING_METHODS = ("_load_from_state_dict", "_save_to_state_dict", "get_extra_state", "state_dict")
_LOADING_HOOKS = (
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
)


def _loads_plainly(model: torch.nn.Module, model_state: Dict[str, torch.Tensor]) -> bool:
    """Whether ``load_state_dict`` would do nothing but copy each given tensor into
    the model's tensor of that name: no module of the model changes how it loads
    or saves its state (BatchNorm's versions, quantized modules, extra state), no
    hook is registered, every tensor is a plain one (:func:`_plain_target`) and
    torch is not set to swap tensors.  Then :func:`_copy_plainly` does that copy
    without walking the module tree once per shard (a walk per shard was the
    sharded load's cost)."""
    base = torch.nn.Module
    if type(model).load_state_dict is not base.load_state_dict:
        return False
    if torch.__future__.get_swap_module_params_on_conversion():
        return False
    for module in model.modules():
        kind = type(module)
        if any(getattr(kind, name) is not getattr(base, name) for name in _LOADING_METHODS):
            return False
        if any(getattr(module, hooks, None) for hooks in _LOADING_HOOKS):
            return False
    return all(_plain_target(t) for t in model_state.values())


def _plain_target(tensor: torch.Tensor) -> bool:
    """A tensor ``copy_`` fills as load_state_dict would: a plain strided tensor with
    storage (not meta, quantized or an inference tensor, which torch refuses to change
    outside inference mode, and no subclass with its own loading rules)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.layout == torch.strided
        and not (tensor.is_meta or tensor.is_quantized or tensor.is_inference())
    )


def _copy_plainly(
    model: torch.nn.Module,
    model_state: Dict[str, torch.Tensor],
    part: Dict[str, torch.Tensor],
) -> Tuple[Set[str], List[str]]:
    """``model.load_state_dict(part, strict=False)`` for a model that loads plainly
    (:func:`_loads_plainly`): each tensor copied into the model's tensor of its name
    (``model_state`` holds detached views of them), with load_state_dict's checks and
    its RuntimeError, which comes after every tensor that fits was copied.  Returns
    (missing, unexpected) names as load_state_dict reports them; names the model
    does not hold are left to load_state_dict itself, which copies nothing for them
    and reports them exactly as it always has."""
    errors = []
    with torch.no_grad():
        for key, target in model_state.items():  # the model's order, as torch copies
            value = part.get(key)
            if value is None:
                continue
            if not torch.overrides.is_tensor_like(value):
                errors.append(
                    f'While copying the parameter named "{key}", expected torch.Tensor '
                    f"or Tensor-like object from checkpoint but received {type(value)}"
                )
                continue
            if target.dim() == 0 and value.dim() == 1:  # torch's old 0-d parameters
                value = value[0]
            if value.shape != target.shape:
                errors.append(
                    f"size mismatch for {key}: copying a param with shape {value.shape} "
                    f"from checkpoint, the shape in current model is {target.shape}."
                )
                continue
            try:
                copy_into(target, value)
            except Exception as exc:  # torch's own wording, and its going on
                errors.append(
                    f'While copying the parameter named "{key}", whose dimensions in the '
                    f"model are {target.size()} and whose dimensions in the checkpoint "
                    f"are {value.size()}, an exception occurred : {exc.args}."
                )
    foreign = {key: value for key, value in part.items() if key not in model_state}
    unexpected = model.load_state_dict(foreign, strict=False).unexpected_keys if foreign else []
    if errors:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {model.__class__.__name__}:\n\t"
            + "\n\t".join(errors)
        )
    return set(model_state).difference(part), unexpected


def _require_module(model: Any) -> None:
    """``save_model`` and ``load_model`` take a ``torch.nn.Module``: anything else
    (a state dict, a path given first) is a TypeError saying so, not an
    AttributeError from deep inside."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")


def load_model(
    model: torch.nn.Module,
    filename: Any,
    strict: bool = True,
    device: Any = "cpu",
    copy: bool = False,
    *,
    backend: str = "mmap",
) -> Tuple[List[str], List[str]]:
    """Load a file written by :func:`save_model` (or any state dict file) into
    ``model``; tied weights dropped at save time are not reported missing.

    Returns (missing, unexpected) names; with ``strict``, either being non-empty
    is a RuntimeError.  ``filename`` may be a sharded checkpoint's directory or index:
    it is loaded shard by shard, each shard's zero-copy views copied into the model
    and released before the next shard is mapped, so memory peaks at the model plus
    one shard, never two copies of the model.

    A ZTensorError (a corrupt file, a name two shards give) leaves the model as
    it was for a single file: everything is decoded and checked before anything is
    written into it.  In a sharded checkpoint the shards before the one refused
    stay loaded; the refused shard changes nothing.  Memory shared by the model's
    tensors in a way :func:`_remove_duplicate_names` cannot resolve is refused
    before anything is read, as safetensors refuses it; ``load_state_dict``'s own
    RuntimeError (a size mismatch) leaves what it copied, as with safetensors.

    ``copy`` is the reference ztensor's (fifth, as there): the tensors are read as
    owned copies before they are copied into the model (the model owns its memory
    either way); ``device`` and ``backend`` as for :func:`load_file`, checked before
    anything is read."""
    # safetensors' load_model finds the names to remove before it loads: the same
    # refusal (a shared group with no tensor covering its memory) comes first here.
    # Loading copies into the model's tensors in place, so the state dict and its
    # groups of shared tensors found now still hold once it is loaded.
    _require_module(model)
    require_file_name(filename, "load_model", "ztensor.torch.load")
    mapped = mapped_for_backend(backend)
    where = filename if isinstance(filename, (str, os.PathLike)) else None
    device = torch_device(device, where)
    if device.type == "meta":
        # meta tensors have no values to copy: load_state_dict failed on the first
        # parameter with torch's bare RuntimeError (safetensors: "device meta is invalid")
        raise UnsupportedError(
            "load_model copies values into the model, and device 'meta' holds none: "
            "load_file(path, device='meta') gives shapes and dtypes",
            path=where,
        )
    model_state = model.state_dict()
    groups = _find_shared_tensors(model_state)
    _names_to_remove(groups, model_state)
    names: Set[str] = set()
    missing: Optional[Set[str]] = None
    unexpected: List[str] = []
    if sharded.is_checkpoint(filename):
        parts = _shard_by_shard(filename, device, copy, False, None, mmap=mapped)
    else:
        parts = (
            (filename, load_file(filename, device=device, copy=copy, backend=backend)) for _ in (0,)
        )
    plainly = _loads_plainly(model, model_state)
    for _, part in parts:
        names.update(part)
        if plainly:
            gave_none, unexpected_here = _copy_plainly(model, model_state, part)
        else:
            result = model.load_state_dict(part, strict=False)
            gave_none, unexpected_here = set(result.missing_keys), result.unexpected_keys
        del part  # the file's mapping goes with its last view
        # missing overall: what no shard gave; unexpected: what any shard gave
        missing = gave_none if missing is None else missing & gave_none
        unexpected += unexpected_here
    missing = set(model_state) if missing is None else missing
    to_remove = _names_to_remove(groups, model_state, preferred_names=names)
    for group in to_remove.values():
        for name in group:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        parts = []
        if unexpected:
            parts.append(
                "Unexpected key(s) in state_dict: "
                + ", ".join(f'"{k}"' for k in sorted(unexpected))
                + "."
            )
        if missing:
            parts.append(
                "Missing key(s) in state_dict: "
                + ", ".join(f'"{k}"' for k in sorted(missing))
                + "."
            )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {model.__class__.__name__}:\n\t"
            + "\n\t".join(parts)
        )
    return sorted(missing), unexpected
