"""Hugging Face transformers models to and from ``.zt`` checkpoints.

>>> from transformers import AutoModelForCausalLM
>>> from ztensor.transformers import from_pretrained, save_pretrained
>>> save_pretrained(model, "llama-zt")                     # config.json + .zt shards
>>> model = from_pretrained(AutoModelForCausalLM, "llama-zt")

A checkpoint folder is what transformers' ``save_pretrained`` writes, with ``.zt``
shards in place of ``.safetensors``: ``config.json``, ``generation_config.json`` (for a
model that generates), ``model-0000K-of-0000N.zt`` and ``model.zt.index.json`` (the
index is written even for one shard, so the folder is always a checkpoint that
:func:`ztensor.torch.load_file`, :func:`ztensor.open_sharded` and ``ztensor convert``
take).  ``ztensor convert`` of a transformers folder gives the same layout.

Loading builds the model with every parameter on torch's ``meta`` device (no memory),
then fills it shard by shard: each shard's zero-copy views are copied (cast to the
model's dtype where asked) into parameters of the model's own, and the shard is
unmapped before the next, so memory peaks at the model plus one shard.  The model
owns its memory: the files may be replaced or deleted once it is loaded.

This module imports torch and transformers; ``import ztensor`` never imports it.
docs/transformers.md says what is supported and what is not.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import operator
import os
import re
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import transformers

from ztensor import _save, sharded
from ztensor.container.reader import Reader
from ztensor.errors import (
    FormatError,
    LimitError,
    ObjectNotFoundError,
    UnsupportedError,
    ZTensorError,
    url_without_secrets,
    without_secrets,
)
from ztensor.io.paths import folder_of
from ztensor.io.source import is_url, read_small_file
from ztensor.sharded import save_sharded
from ztensor.torch import find_shared_tensors, load_file, shard_by_shard

__all__ = ["from_pretrained", "save_pretrained"]

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_PREFIX = "model"  # model-00001-of-00002.zt, model.zt.index.json
INDEX_NAME = f"{WEIGHTS_PREFIX}.zt.index.json"
# a config is a few kilobytes of JSON; no honest one comes near this
MAX_CONFIG_BYTES = 16 << 20


# ------------------------------------------------------------------ loading
def from_pretrained(cls: Any, path: Any, **kwargs: Any) -> "transformers.PreTrainedModel":
    """The model of transformers class ``cls`` (an Auto class such as
    ``AutoModelForCausalLM``, or a concrete one such as ``LlamaForCausalLM``) with the
    weights of the ``.zt`` checkpoint at ``path``, in eval mode, as transformers'
    ``cls.from_pretrained`` gives it.

    ``path``: a checkpoint folder, its index (``model.zt.index.json``), or one ``.zt``
    file; local, or an fsspec URL of the index or file (``config.json`` and
    ``generation_config.json`` are read beside it).

    ``dtype`` (or its older spelling ``torch_dtype``; ``dtype`` wins when both are
    given): a ``torch.dtype``, its name, or ``"auto"`` (the default, as in
    transformers 5: the config's dtype, else the checkpoint's first floating dtype).
    Every other keyword goes where transformers sends it: a config attribute updates
    the config, the rest (``attn_implementation``...) goes to the model's
    ``from_config``.

    Tied weights stay tied: a group of parameters that the built model shares is
    filled from whichever of its names the checkpoint holds (transformers stores
    the embedding, ``ztensor.torch.save_model`` may store the head).  A parameter
    the checkpoint lacks, after tying, is an ObjectNotFoundError naming it (no
    weight is invented); a tensor whose shape differs from the model's is a
    FormatError; tensors the model has no place for are skipped with a warning
    (transformers logs them), except those its ``_keys_to_ignore_on_load_unexpected``
    names.

    ``storage_options`` go to fsspec for a URL (credentials,
    ``ztensor_allow_unversioned``: see docs/remote.md), for the configs and the
    weights alike."""
    source = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(source, str):
        raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
    storage_options = kwargs.pop("storage_options", None)
    dtype = kwargs.pop("dtype", None)
    torch_dtype = kwargs.pop("torch_dtype", None)
    # the caller's own argument is checked before anything is read: a dtype no
    # model is built in is their mistake (a ValueError naming it), never config.json's
    dtype = _caller_dtype(dtype, "dtype") if dtype is not None else None
    if dtype is None:
        dtype = _caller_dtype(torch_dtype, "torch_dtype")
    if kwargs.pop("trust_remote_code", None):
        # a config.json's auto_map (and the _name_or_path it sets) would choose the
        # code to import and run, from any folder or a Hub repository
        raise UnsupportedError(
            "trust_remote_code is not supported: ztensor.transformers builds models "
            "from transformers' own classes only (docs/transformers.md)",
            path=source,
        )
    loading = _loading_keywords(kwargs, source)
    if loading["subfolder"]:
        source = _beside(source.rstrip("/"), loading["subfolder"])
    folder, checkpoint = _locate(source)

    config_path = _beside(folder, CONFIG_NAME)
    # the implementations the caller chose (the config may take them as attributes)
    chosen = {k: kwargs[k] for k in _MODEL_KEYWORDS if k in kwargs}
    # every parameter the model registers is filled from a tensor of the checkpoint:
    # a config declaring many more (10**9 layers) is refused before it is built,
    # after work that follows the checkpoint, not the count the config declares
    names, present = _checkpoint_extent(checkpoint, storage_options)
    count = len(names)
    if loading["config"] is not None:
        config, model_kwargs = _given_config(loading["config"], source), kwargs
    else:
        config, model_kwargs = _config_from_file(
            cls, config_path, source, kwargs, storage_options, 2 * count + 1024
        )
    _refuse_model_keywords(model_kwargs, source)
    resolved = _resolve_dtype(dtype, config, checkpoint, config_path, storage_options)
    # checked before any weight is read: what transformers refuses in it is a
    # FormatError naming it, as for config.json
    generation = loading["generation_config"]
    if generation is None:
        generation_path = _beside(folder, GENERATION_CONFIG_NAME)
        generation_dict = _read_json(generation_path, "generation config", storage_options)
        if generation_dict is not None:
            with _config_refusals(generation_path, "transformers refuses the generation config"):
                generation = transformers.GenerationConfig.from_dict(generation_dict)

    with _config_refusals(config_path, "the model this config declares cannot be built"):
        with _parameters_on_meta(2 * count + 1024, config_path):
            with _AllocationBound(present, config_path):
                with _caller_choice_refusals(chosen, source):
                    model = _build(cls, config, resolved, model_kwargs)
    if _needs_conversion(model, names):
        # a checkpoint transformers saved names some weights as the model did in an
        # earlier design (one tensor an expert, GPT-NeoX's embed_out, ViT's query):
        # transformers' own loader renames and merges them
        built = type(model)
        complex_ok = any(t.is_complex() for t in model.state_dict().values())
        model = None  # transformers builds its own
        with _AllocationBound(present, config_path):
            model, unexpected = _load_converted(
                built, config, resolved, model_kwargs, checkpoint, storage_options, complex_ok
            )
    else:
        unexpected = _load_weights(model, checkpoint, resolved, cls, storage_options)
    # kept by the model (repr, config.json): a URL's credentials are not
    model.config.name_or_path = url_without_secrets(source)

    if generation is not None and hasattr(model, "generation_config"):
        model.generation_config = generation
    model.eval()
    if loading["output_loading_info"]:
        # as transformers reports it; nothing is missing or mismatched (each refused)
        info = {
            "missing_keys": [],
            "unexpected_keys": list(unexpected),
            "mismatched_keys": [],
            "error_msgs": [],
        }
        return model, info  # type: ignore[return-value]
    return model


def _given_config(given: Any, source: str) -> Any:
    """A copy of the config the caller gave (``config=``), held to config.json's
    rules: no code map, no quantization, the caller's path as its name."""
    try:
        config = copy.deepcopy(given)
        settings = config.to_dict()
    except RecursionError:  # a config object nested past Python's stack (not JSON's)
        raise FormatError("the config given is nested too deep to be copied", path=source) from None
    _refuse_loading_choices(settings, "the config given", source)
    for key in ("auto_map", "custom_pipelines"):
        if hasattr(config, key):
            delattr(config, key)
    config.name_or_path = url_without_secrets(source)
    return config


# transformers' from_pretrained keywords about fetching and caching from the Hub, or
# how it spends memory while loading: a zTensor path is local or a URL and is
# always loaded one shard at a time onto a model built on meta, so they change
# nothing here and are accepted as transformers accepts them
_NO_EFFECT_KEYWORDS = frozenset(
    {
        "cache_dir",
        "force_download",
        "local_files_only",
        "proxies",
        "resume_download",
        "low_cpu_mem_usage",
        "disable_mmap",
        "weights_only",
        "use_safetensors",
        "tqdm_class",
        "_fast_init",
        "_from_auto",
        "_from_pipeline",
        "_commit_hash",
        "user_agent",
        "mirror",
    }
)
# keywords for what this loader does not do: each an UnsupportedError naming it
# (passed on, they reached the model's constructor and came back as a fault of
# config.json); why, in the message
_UNSUPPORTED_KEYWORDS = {
    "token": "credentials for a URL go in storage_options (docs/remote.md)",
    "use_auth_token": "credentials for a URL go in storage_options (docs/remote.md)",
    "variant": "a zTensor checkpoint has no weight variants: give the path of the one to load",
    "gguf_file": "convert the GGUF file with `ztensor convert` first",
    "state_dict": "the weights are the checkpoint's",
    "from_tf": "the weights are the checkpoint's",
    "from_flax": "the weights are the checkpoint's",
    "key_mapping": "the checkpoint's names are used as they are",
    "quantization_config": "quantized transformers models are not supported",
    "ignore_mismatched_sizes": "a tensor of another shape than the model's is refused",
    "max_memory": "the model is loaded onto the CPU whole",
    "offload_folder": "the model is loaded onto the CPU whole",
    "offload_state_dict": "the model is loaded onto the CPU whole",
    "offload_buffers": "the model is loaded onto the CPU whole",
    "tp_plan": "tensor parallelism is not supported",
    "tp_size": "tensor parallelism is not supported",
    "device_mesh": "tensor parallelism is not supported",
    "distributed_config": "tensor parallelism is not supported",
    "adapter_name": "load adapters with peft on the model returned",
    "adapter_kwargs": "load adapters with peft on the model returned",
    "use_kernels": "Hub kernels run code from the Hub",
    "kernel_config": "Hub kernels run code from the Hub",
    "allow_all_kernels": "Hub kernels run code from the Hub",
    "fusion_config": "the model is built as transformers' class declares it",
    "code_revision": "code from a repository is never run (trust_remote_code)",
}


def _loading_keywords(kwargs: Dict[str, Any], source: str) -> Dict[str, Any]:
    """transformers' own loading keywords taken out of ``kwargs`` (what is left are
    config attributes and model arguments) and checked before anything is read: a
    mistake in one is the caller's, a TypeError or UnsupportedError naming the
    keyword, never a fault of config.json.  Returns what the load uses: ``config``
    and ``generation_config`` (objects the caller gives instead of the files),
    ``subfolder``, ``output_loading_info``."""
    for name in sorted(set(kwargs) & _NO_EFFECT_KEYWORDS):
        del kwargs[name]
    for name in sorted(set(kwargs) & set(_UNSUPPORTED_KEYWORDS)):
        value = kwargs.pop(name)
        if value is not None and value is not False and value != {}:
            raise UnsupportedError(
                f"from_pretrained's {name}= is not supported here: {_UNSUPPORTED_KEYWORDS[name]}",
                path=source,
            )
    revision = kwargs.pop("revision", None)
    if revision not in (None, "main"):
        raise UnsupportedError(
            f"from_pretrained's revision={revision!r} is not supported here: a zTensor "
            "path names one version of the files (give that version's path)",
            path=source,
        )
    device_map = kwargs.pop("device_map", None)
    if device_map is not None and not _is_cpu_map(device_map):
        raise UnsupportedError(
            f"from_pretrained's device_map={device_map!r} is not supported here: the "
            "model is loaded onto the CPU (move it with .to() afterwards; a placement "
            "strategy such as 'auto' is taken where torch sees no accelerator)",
            path=source,
        )
    config = kwargs.pop("config", None)
    if config is not None and not isinstance(config, transformers.PretrainedConfig):
        raise TypeError(
            "config must be a transformers PretrainedConfig (or None: config.json "
            f"beside the weights), not {type(config).__name__}"
        )
    generation = kwargs.pop("generation_config", None)
    if generation is not None and not isinstance(generation, transformers.GenerationConfig):
        raise TypeError(
            "generation_config must be a transformers GenerationConfig, not "
            f"{type(generation).__name__}"
        )
    subfolder = kwargs.pop("subfolder", "") or ""
    if not isinstance(subfolder, str):
        raise TypeError(f"subfolder must be a str, not {type(subfolder).__name__}")
    return {
        "config": config,
        "generation_config": generation,
        "subfolder": subfolder,
        "output_loading_info": bool(kwargs.pop("output_loading_info", False)),
    }


# accelerate's strategies: each fills the accelerators first, then the CPU, so on a
# machine with none they put every module on the CPU
_PLACEMENT_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def _is_cpu_map(device_map: Any) -> bool:
    """Whether ``device_map`` puts everything on the CPU ("cpu", a CPU torch.device,
    {"": "cpu"}, or a dict whose every device is the CPU), as a placement strategy
    ("auto", ...) does on a machine without an accelerator."""
    if isinstance(device_map, str) and device_map in _PLACEMENT_STRATEGIES:
        return not _has_accelerator()
    if isinstance(device_map, dict):
        return bool(device_map) and all(_is_cpu_map(v) for v in device_map.values())
    try:
        return torch.device(device_map).type == "cpu"
    except (TypeError, RuntimeError, ValueError):
        return False


def _has_accelerator() -> bool:
    """Whether torch sees a device other than the CPU (CUDA, ROCm, MPS, XPU, ...)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps is not None and mps.is_available())


def _refuse_model_keywords(model_kwargs: Dict[str, Any], source: str) -> None:
    """A TypeError naming each keyword left for the model that is neither a config
    attribute nor one transformers' ``from_config`` takes (it passed them to the
    model's ``__init__``, whose TypeError came back as a fault of config.json)."""
    unknown = sorted(k for k in model_kwargs if k not in _MODEL_KEYWORDS)
    if unknown:
        raise TypeError(
            f"{source}: from_pretrained got keyword(s) that are neither a config "
            f"attribute nor a loading option: {', '.join(unknown)}"
        )


@contextlib.contextmanager
def _caller_choice_refusals(asked: Dict[str, Any], source: str) -> Iterator[None]:
    """A build that fails while the caller chose (``asked``) an implementation that
    is not torch's own (``attn_implementation="kernels-community/..."``, a Hub
    kernel; one whose package is not installed) fails for that choice: an
    UnsupportedError naming the keyword, never a fault of config.json."""
    # a per-sub-config dict ({"": "sdpa"}) is the caller's choice too (and no set key)
    chosen = {k: v for k, v in asked.items() if not (isinstance(v, str) and v in _FILE_MAY_CHOOSE)}
    try:
        yield
    except ZTensorError:
        raise
    except Exception as exc:
        if not chosen:
            raise
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(chosen.items()))
        raise UnsupportedError(
            f"the model cannot be built with {shown}, as asked: {type(exc).__name__}: {exc}",
            path=source,
        ) from exc


# the keywords transformers' from_config gives the model rather than its config
_MODEL_KEYWORDS = frozenset({"attn_implementation", "experts_implementation"})


def _config_from_file(
    cls: Any,
    config_path: str,
    source: str,
    kwargs: Dict[str, Any],
    storage_options: Optional[Dict[str, Any]],
    most_layers: int,
) -> Tuple[Any, Dict[str, Any]]:
    """(config, keywords left for the model) from ``config.json`` at ``config_path``,
    each of ``kwargs`` that is a config attribute applied to it, checked as
    :func:`from_pretrained` says; no layer count above ``most_layers``
    (:func:`_refuse_layer_counts`)."""
    config_dict = _read_json(config_path, "config", storage_options)
    if config_dict is None:
        raise FormatError(
            f"no {CONFIG_NAME} beside the weights: a transformers model is built from it",
            path=config_path,
        )
    _refuse_layer_counts(config_dict, most_layers, "config.json", config_path)
    _refuse_layer_counts(kwargs, most_layers, "the keywords", config_path)
    _refuse_hub_code(config_dict, config_path)
    _refuse_loading_choices(config_dict, "config.json", config_path)
    config_dict = _without_code_maps(config_dict)
    # where transformers would look for anything the config names is the caller's
    # path, never one config.json gives (_name_or_path: another folder, a Hub repo)
    config_dict = {**config_dict, "_name_or_path": url_without_secrets(source)}
    config_class = _config_class(cls, config_dict, source)
    with _config_refusals(config_path, "transformers refuses the config"):
        # the floats JSON has no word for, as transformers writes them
        # ({"__float__": "Infinity"}) and decodes them reading its own file
        decode = getattr(config_class, "_decode_special_floats", None)
        if decode is not None:
            config_dict = decode(config_dict)
        config, model_kwargs = config_class.from_dict(
            config_dict, return_unused_kwargs=True, **kwargs
        )
    return config, model_kwargs


def _refuse_layer_counts(values: Any, most: int, what: str, config_path: str) -> None:
    """LimitError naming ``config_path`` for an int under a key that names layers
    (``num_hidden_layers``, ``n_layer``, ``decoder_layers``, in sub-configs too)
    above ``most``, twice the checkpoint's tensors and 1024: each layer has weights
    of its own there.  Checked before the config is made: many config classes
    (Gemma2, Qwen2, GPT-OSS...) build a list a layer in their constructor, and
    ``num_hidden_layers: 10**9`` held from_pretrained for minutes and gigabytes
    before the model's parameters could be counted."""
    for key, value in _every_key(values):
        if (
            isinstance(key, str)
            and "layer" in key.lower()
            and isinstance(value, int)
            and not isinstance(value, bool)
            and value > most
        ):
            raise LimitError(
                f"{what}: {key}={value} is more layers than a checkpoint of "
                f"{(most - 1024) // 2} tensors can fill (at most {most})",
                path=config_path,
            )


def _locate(source: str) -> Tuple[str, str]:
    """(the folder config.json is read from, the weights as load_file takes them)."""
    if is_url(source):
        return source.rstrip("/").rsplit("/", 1)[0], source
    if os.path.isdir(source):
        return source, source
    if not os.path.exists(source):
        raise FileNotFoundError(f"{source}: no such file or directory")
    return folder_of(source), source


def _beside(folder: str, name: str) -> str:
    return f"{folder}/{name}" if is_url(folder) else os.path.join(folder, name)


def _read_json(
    where: str, what: str, storage_options: Optional[Dict[str, Any]]
) -> Optional[Dict[str, Any]]:
    """The JSON object at ``where`` (a path or URL), None if there is no such file;
    at most MAX_CONFIG_BYTES are read.  Anything but a JSON object is a FormatError."""
    try:
        data = read_small_file(where, MAX_CONFIG_BYTES, what, storage_options)
    except FileNotFoundError:  # NetworkNotFoundError (404) is one too
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"not a readable {what}: {exc}", path=where) from None
    if not isinstance(value, dict):
        raise FormatError(f"a {what} is a JSON object, not {type(value).__name__}", path=where)
    return value


# the config keys naming the code a layer runs: transformers takes a value such as
# "org/repo", "org/repo@rev:fn" or "msa|org/repo" as a Hub kernel repository, downloads
# it and imports it (through the `kernels` package, when installed)
_IMPLEMENTATION_KEYS = frozenset(
    (
        "attn_implementation",
        "_attn_implementation",
        "experts_implementation",
        "_experts_implementation",
    )
)
# the implementations a file may choose: torch's own code, nothing to fetch.  Every
# other name may download code: "flash_attention_2" without the flash_attn package
# falls back to the Hub's kernels-community/flash-attn2 when `kernels` is installed,
# "deepgemm"/"sonicmoe" load kernels, "org/repo" and "msa|org/repo" are Hub
# repositories.  The caller chooses those with its own keyword, never the file.
_FILE_MAY_CHOOSE = frozenset(
    ("eager", "sdpa", "flex_attention", "paged|eager", "batched_mm", "grouped_mm")
)


def _refuse_hub_code(config_dict: Dict[str, Any], config_path: str) -> None:
    """THE rule that a ``config.json`` makes transformers fetch and run no code: an
    attention or experts implementation it names (at its top or in a sub-config,
    as text or as transformers' per-sub-config dict) is one of ``_FILE_MAY_CHOOSE``,
    torch's own code.  Any other (a Hub kernel, ``msa|org/repo``, which transformers
    loads from any repository; ``flash_attention_2``, which falls back to a Hub
    kernel) is a FormatError naming the file: the caller may still ask for one with
    the ``attn_implementation`` keyword, their own choice."""
    for key, item in _every_key(config_dict):
        if key in _IMPLEMENTATION_KEYS:
            named = item.values() if isinstance(item, dict) else [item]
            for text in named:
                if text is not None and not (isinstance(text, str) and text in _FILE_MAY_CHOOSE):
                    shown = repr(text)[:120]
                    raise FormatError(
                        f"{key} {shown} is not torch's own code: transformers may "
                        "fetch it from the Hub and run it, and a file does not choose "
                        "that (pass attn_implementation= yourself to use a kernel)",
                        path=config_path,
                    )


def _every_key(config_dict: Dict[str, Any]) -> Iterator[Tuple[Any, Any]]:
    """(key, value) of every object within ``config_dict``, itself and its
    sub-configs at any depth, lists included.  Iterative: JSON nested as deep as the
    parser allows is no RecursionError here.  Each container is walked once: a
    ``config=`` object is Python's, not JSON, and a list holding itself looped for
    ever, forty lists each holding the next twice took 2**40 steps."""
    stack: List[Any] = [config_dict]
    seen = set()
    while stack:
        value = stack.pop()
        if isinstance(value, (list, dict)):
            if id(value) in seen:
                continue
            seen.add(id(value))
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                yield key, item
                stack.append(item)


# config keys transformers' loading path acts on beyond building the model: each
# makes from_pretrained (which a checkpoint saved under older names goes through,
# _load_converted) change the process or import code the caller did not choose
_LOADING_CHOICES = {
    # quantized layers from it and imports their packages (a sub-config's too:
    # transformers asks the text config), Hub kernels for some methods
    "quantization_config": "quantized transformers models (GPTQ, AWQ, FP8, bitsandbytes "
    "through transformers) are not supported (docs/transformers.md)",
    # monkey-patches transformers' classes and conversion tables for the whole
    # process: every later model of the type was built with the file's patches
    "fusion_config": "runtime fusions patch transformers' classes for the whole process, "
    "which a file does not choose",
}


def _refuse_loading_choices(config_dict: Dict[str, Any], what: str, where: str) -> None:
    """THE rule that a config makes transformers' loading path build the model its
    class declares and nothing else: a ``quantization_config`` or ``fusion_config``
    (``_LOADING_CHOICES``) at its top or in any sub-config, unless null or empty, is
    an UnsupportedError naming it (before, only a top-level quantization_config was
    seen, and a config.json's fusion_config patched every later Qwen2-VL of the
    process)."""
    for key, item in _every_key(config_dict):
        if key in _LOADING_CHOICES and item is not None and item != {}:
            raise UnsupportedError(f"{what} has a {key}: {_LOADING_CHOICES[key]}", path=where)


# what names a module of a checkpoint's own for transformers to import: an Auto
# class asked of a config holding it, with no class of its own for the model type,
# offered to run the file's code (an interactive prompt; "y" imported evil.py from
# the folder, or "org/repo--evil.Model" from the Hub, and cached it)
_CODE_MAP_KEYS = frozenset({"auto_map", "custom_pipelines"})


def _without_code_maps(config_dict: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of ``config_dict`` without the keys that name code of the file's own
    (``auto_map``, ``custom_pipelines``), at its top and in every object within
    (sub-configs): transformers' own classes are built, or the Auto class says it
    has none.  Iterative: JSON nested as deep as the parser allows is no
    RecursionError here."""
    top: Dict[str, Any] = {}
    stack: List[Tuple[Any, Any]] = [(config_dict, top)]
    while stack:
        source, copy_ = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if isinstance(source, dict) and key in _CODE_MAP_KEYS:
                continue
            if isinstance(item, (dict, list)):
                inner: Any = {} if isinstance(item, dict) else [None] * len(item)
                stack.append((item, inner))
                item = inner
            copy_[key] = item
    return top


def _config_class(cls: Any, config_dict: Dict[str, Any], source: str) -> Any:
    """The config class for ``cls``: a concrete model's own, else (an Auto class) the
    one config.json's ``model_type`` names."""
    own = getattr(cls, "config_class", None)
    if own is not None:
        return own
    model_type = config_dict.get("model_type")
    mapping = transformers.CONFIG_MAPPING
    if not isinstance(model_type, str) or model_type not in mapping:
        raise UnsupportedError(
            f"config.json names model_type {model_type!r}, which this "
            f"transformers ({transformers.__version__}) does not know",
            path=source,
        )
    return mapping[model_type]


# the floating dtypes torch builds a model in (torch.set_default_dtype, which
# transformers' from_config sets, refuses the float8/float4 types: they have no
# storage type of their own)
MODEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _model_dtype(dtype: Any) -> Optional[torch.dtype]:
    """The one rule for a model's dtype: a torch dtype of :data:`MODEL_DTYPES`, or
    its name (``"bfloat16"``, ``"half"``); None for anything else."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if not dtype.startswith("_") else None
    if isinstance(dtype, torch.dtype) and dtype in MODEL_DTYPES:
        return dtype
    return None


def _caller_dtype(dtype: Any, keyword: str) -> Any:
    """The caller's ``dtype``/``torch_dtype`` (``keyword`` names which): None or
    ``"auto"`` as given, else the torch dtype it names; one no model is built in
    is a ValueError naming ``keyword`` (a TypeError for what is no dtype or name)."""
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        return dtype
    found = _model_dtype(dtype)
    if found is not None:
        return found
    allowed = ", ".join(str(d).replace("torch.", "") for d in MODEL_DTYPES)
    if not isinstance(dtype, (str, torch.dtype)):
        raise TypeError(
            f"{keyword} must be a torch.dtype, its name or 'auto', not {type(dtype).__name__}"
        )
    raise ValueError(
        f"{keyword}={dtype!r}: a model is built in one of {allowed} (its torch.dtype or "
        "name), or 'auto'"
    )


def _resolve_dtype(
    dtype: Any,
    config: Any,
    checkpoint: str,
    config_path: str,
    storage_options: Optional[Dict[str, Any]],
) -> torch.dtype:
    """transformers 5's rule: None or "auto" -> the config's dtype, else the
    checkpoint's first floating dtype a model is built in, else torch's default;
    else the caller's dtype, checked already (:func:`_caller_dtype`).  The config's
    dtype that no model is built in (:func:`_model_dtype`) is a FormatError naming
    it."""
    if not (dtype is None or (isinstance(dtype, str) and dtype == "auto")):
        return dtype
    declared = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if declared is None:
        found = _checkpoint_float_dtype(checkpoint, storage_options)
        return found or torch.get_default_dtype()
    resolved = _model_dtype(declared)
    if resolved is None:
        raise FormatError(
            f"dtype {declared!r} is not a dtype a model is built in", path=config_path
        )
    return resolved


def _checkpoint_extent(
    checkpoint: str, storage_options: Optional[Dict[str, Any]]
) -> Tuple[frozenset, int]:
    """The names of the checkpoint's tensors (its index's, or one file's), and
    the elements they hold together, by the bytes present: the shape of a format
    whose bytes the reader holds to it (dense, GPTQ, GGUF blocks), else the bytes its
    components hold (a sparse object's shape is only declared: one value under a
    shape of 2**60 switched the bound below off).  Together, not the largest: one
    parameter may be filled from many tensors (a mixture of experts' fused weights
    from a file of one tensor an expert)."""
    with _open_checkpoint(checkpoint, storage_options) as r:
        names = r.keys()
        return frozenset(names), sum(_elements_present(r.metadata(n)) for n in names)


# formats whose shape the reader holds to the bytes the file stores
_SHAPED_BY_BYTES = frozenset({"dense", "quantized_group", "gguf_blocks"})


def _elements_present(spec: Any) -> int:
    if spec.format in _SHAPED_BY_BYTES:
        return math.prod(spec.shape)
    return sum(c.decoded_length for c in spec.components.values())


# a buffer a model computes in __init__ (rotary tables, causal masks) may exceed
# every stored tensor of a small checkpoint; this many elements are always allowed
_ALWAYS_ALLOWED_ELEMENTS = 1 << 26
# and this many more than the checkpoint's elements may be alive together while it is
# built: buffers and what computes them
_ALWAYS_ALLOWED_LIVE = 1 << 27


def _dims(size: Any) -> int:
    """The element count of a size: an int (a numpy int too) or a sequence of them."""
    if isinstance(size, (tuple, list, torch.Size)):
        return math.prod(operator.index(d) for d in size)
    return operator.index(size)


def _size_arguments(args: tuple, kwargs: dict) -> int:
    """``f(2, 3)``, ``f((2, 3))`` or ``f(size=(2, 3))``."""
    if "size" in kwargs:
        return _dims(kwargs["size"])
    if not args:
        return 0
    one_sequence = len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size))
    return _dims(args[0] if one_sequence else args)


def _arange_elements(args: tuple, kwargs: dict) -> int:
    bounds = list(args[:3])
    for key in ("start", "end", "step")[len(bounds) :]:
        if key in kwargs:
            bounds.append(kwargs[key])
    if len(bounds) == 1:
        start, end, step = 0, bounds[0], 1
    else:
        start, end, step = (list(bounds) + [1])[:3]
    return max(0, math.ceil((float(end) - float(start)) / float(step)))


def _randint_elements(args: tuple, kwargs: dict) -> int:
    sizes = [a for a in args if isinstance(a, (tuple, list, torch.Size))]
    return _dims(kwargs.get("size", sizes[0] if sizes else ()))


def _eye_elements(args: tuple, kwargs: dict) -> int:
    n = operator.index(args[0] if args else kwargs.get("n", 0))
    m = args[1] if len(args) > 1 and not isinstance(args[1], torch.Tensor) else kwargs.get("m")
    return n * (n if m is None else operator.index(m))


def _steps_elements(args: tuple, kwargs: dict) -> int:
    return operator.index(args[2] if len(args) > 2 else kwargs.get("steps", 0))


def _method_size_elements(args: tuple, kwargs: dict) -> int:
    """``t.new_zeros(2, 3)`` and the like: the size after the tensor itself."""
    return _size_arguments(args[1:], kwargs)


def _new_full_elements(args: tuple, kwargs: dict) -> int:
    return _dims(args[1] if len(args) > 1 else kwargs.get("size", ()))


# The functions a module's __init__ allocates tensors with, by name, and how each
# reads the element count it asks for from its arguments.
_ALLOCATORS = {
    **dict.fromkeys(("empty", "zeros", "ones", "rand", "randn"), _size_arguments),
    "full": lambda args, kwargs: _dims(args[0] if args else kwargs.get("size", ())),
    "empty_strided": lambda args, kwargs: _dims(args[0] if args else kwargs.get("size", ())),
    "arange": _arange_elements,
    "randint": _randint_elements,
    "randperm": lambda args, kwargs: operator.index(args[0] if args else kwargs.get("n", 0)),
    "eye": _eye_elements,
    "linspace": _steps_elements,
    "logspace": _steps_elements,
    **dict.fromkeys(("new_empty", "new_zeros", "new_ones"), _method_size_elements),
    "new_full": _new_full_elements,
}


def _tensors_in(values: Any) -> List[torch.Tensor]:
    """The tensors among ``values`` and the lists and tuples in them (one level)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _joined_elements(args: tuple, kwargs: dict) -> int:
    """``torch.cat`` and its kin: the sum of what they join."""
    return sum(t.numel() for t in _tensors_in(list(args) + list(kwargs.values())))


def _product_elements(args: tuple, kwargs: dict) -> int:
    """``outer``/``kron``: every element of one with every element of the other."""
    return math.prod(t.numel() for t in _tensors_in(list(args) + list(kwargs.values())))


def _matmul_elements(args: tuple, kwargs: dict) -> int:
    """``a @ b``: ``a``'s rows (and batch) by ``b``'s columns."""
    a, b = _tensors_in(args)[:2]
    rows = math.prod(a.shape[:-1]) if a.dim() > 1 else 1
    return rows * (b.shape[-1] if b.dim() > 1 else 1)


def _broadcast_elements(args: tuple, kwargs: dict) -> int:
    """An elementwise operation's result: its tensor arguments' broadcast shape
    (``arange(n)[:, None] * inv_freq`` makes a table neither factor is).  Only for
    the calls in ``_ELEMENTWISE``: others with two tensors (``bucketize``,
    ``type_as``) make something else, checked once made."""
    shapes = [t.shape for t in _tensors_in(list(args) + list(kwargs.values()))]
    return math.prod(torch.broadcast_shapes(*shapes)) if len(shapes) > 1 else 0


_ELEMENTWISE_NAMES = (
    "add sub mul div true_divide floor_divide remainder fmod pow atan2 hypot "
    "maximum minimum fmax fmin where eq ne lt le gt ge logical_and logical_or "
    "logical_xor bitwise_and bitwise_or bitwise_xor polar complex"
).split()
_DUNDERS = "add sub mul truediv floordiv mod pow and or xor eq ne lt le gt ge".split()
_ELEMENTWISE = frozenset(
    _ELEMENTWISE_NAMES
    + [f"__{n}__" for n in _DUNDERS]
    + [f"__r{n}__" for n in _DUNDERS if n not in ("eq", "ne", "lt", "le", "gt", "ge")]
)

# what a call makes that no factory is asked for: joined, multiplied out, broadcast
_COMBINERS = {
    **dict.fromkeys(
        ("cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack", "column_stack"),
        _joined_elements,
    ),
    **dict.fromkeys(("outer", "ger", "kron", "cartesian_prod"), _product_elements),
    **dict.fromkeys(("matmul", "mm", "bmm", "__matmul__", "einsum"), _matmul_elements),
}


def _requested_elements(name: str, args: tuple, kwargs: dict) -> int:
    """The element count a call asks for: an allocator's arguments, what a combining
    call makes, or an elementwise call's broadcast shape (0 where it cannot be read:
    torch then refuses the call itself)."""
    try:
        if name in _ALLOCATORS:
            return _ALLOCATORS[name](args, kwargs)
        if name in _COMBINERS:
            return _COMBINERS[name](args, kwargs)
        if name in _ELEMENTWISE:
            return _broadcast_elements(args, kwargs)
        return 0  # checked once made (_AllocationBound.__torch_function__)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, IndexError, RuntimeError):
        return 0


class _AllocationBound(torch.overrides.TorchFunctionMode):
    """While a model is built from its config, a tensor larger than the checkpoint's
    tensors together (and than ``_ALWAYS_ALLOWED_ELEMENTS``) is refused before it is
    allocated where the call says its size (a factory, a join, a product, a
    broadcast), else as soon as it is made: no tensor of that size could be filled
    from the checkpoint, and a config naming a vocabulary of 10**12 would otherwise
    reserve terabytes of address space (and, where memory is not overcommitted, fail
    in the allocator)."""

    def __init__(self, most_elements: int, config_path: str) -> None:
        super().__init__()
        self.most = max(most_elements, _ALWAYS_ALLOWED_ELEMENTS)
        # the tensors alive together: a config of 100 layers each building a
        # buffer just under the bound (GPT-J's embed_positions) held 27 GB
        self.most_live = most_elements + _ALWAYS_ALLOWED_LIVE
        self.live = 0
        self._held: List[Any] = []  # weakref.finalize of each tensor counted live
        self.config_path = config_path

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")  # torch.empty and the like
        self._refuse(_requested_elements(name, args, kwargs))
        result = func(*args, **kwargs)
        # and whatever a call made that no rule above foresaw (repeat, a view): the
        # build stops at the first tensor past the bound
        for made in _tensors_in(result if isinstance(result, (list, tuple)) else [result]):
            self._refuse(made.numel())
            self._hold(made, args)
        return result

    def __exit__(self, *exc_info):
        for held in self._held:  # the model's buffers outlive the build: nothing to count
            held.detach()
        self._held.clear()
        return super().__exit__(*exc_info)

    def _hold(self, made: torch.Tensor, args: tuple) -> None:
        """Count ``made`` among the tensors alive until it is freed, unless it holds
        no new memory: on the meta device, or sharing an argument's memory (a view,
        an in-place call's result)."""
        if made.device.type == "meta":
            return
        # a view or an in-place call's result shares an argument's memory
        memory = made.untyped_storage().data_ptr()
        if any(
            isinstance(arg, torch.Tensor)
            and arg.device.type != "meta"
            and arg.untyped_storage().data_ptr() == memory
            for arg in args
        ):
            return
        count = made.numel()
        if not count:
            return
        self.live += count
        if self.live > self.most_live:
            raise LimitError(
                f"the config declares tensors of more than {self.most_live} elements "
                "alive together while the model is built (the checkpoint's tensors "
                f"together, and {_ALWAYS_ALLOWED_LIVE} more)",
                path=self.config_path,
            )
        self._held.append(weakref.finalize(made, self._release, count))

    def _release(self, count: int) -> None:
        self.live -= count

    def _refuse(self, wanted: int) -> None:
        if wanted > self.most:
            raise LimitError(
                f"the config declares a tensor of {wanted} elements; at most "
                f"{self.most} are allowed (the checkpoint's tensors together, and "
                f"never fewer than {_ALWAYS_ALLOWED_ELEMENTS})",
                path=self.config_path,
            )


@contextlib.contextmanager
def _config_refusals(config_path: str, what: str) -> Iterator[None]:
    """transformers' and torch's refusals of what a config declares (a dtype torch
    lacks, a negative size, a field of the wrong type, a tensor larger than memory)
    as a ZTensorError naming the config: a FormatError, or a LimitError where
    memory ran out (torch's CPU allocator says so in a RuntimeError)."""
    try:
        yield
    except ZTensorError:
        raise
    except MemoryError as exc:
        raise LimitError(f"{what}: out of memory", path=config_path) from exc
    except Exception as exc:  # any class: transformers' validators raise their own
        if isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc):
            raise LimitError(f"{what}: out of memory: {exc}", path=config_path) from exc
        raise FormatError(f"{what}: {type(exc).__name__}: {exc}", path=config_path) from exc


def _open_checkpoint(checkpoint: str, storage_options: Optional[Dict[str, Any]]) -> Any:
    """The checkpoint's tensors, opened: a sharded checkpoint's or one file's reader."""
    if sharded.is_checkpoint(checkpoint):
        return sharded.open_sharded(checkpoint, storage_options=storage_options)
    return Reader(checkpoint, storage_options=storage_options)


def _checkpoint_float_dtype(
    checkpoint: str, storage_options: Optional[Dict[str, Any]]
) -> Optional[torch.dtype]:
    with _open_checkpoint(checkpoint, storage_options) as r:
        for name in r.keys():
            # a float8 weight (a quantized checkpoint's) is no dtype to build in
            found = _model_dtype(str(r.metadata(name).dtype))
            if found is not None:
                return found
    return None


def _build(cls: Any, config: Any, dtype: torch.dtype, model_kwargs: Dict[str, Any]) -> Any:
    """The model from its config, in ``dtype``: an Auto class's ``from_config``, a
    concrete class's ``_from_config`` (what the Auto class calls)."""
    build = getattr(cls, "from_config", None) or getattr(cls, "_from_config", None)
    if build is None:
        raise UnsupportedError(
            f"{getattr(cls, '__name__', cls)!r} is not a transformers model class (no from_config)"
        )
    return build(config, dtype=dtype, **model_kwargs)


@contextlib.contextmanager
def _parameters_on_meta(most: int, config_path: str) -> Iterator[None]:
    """Every parameter registered while the model is built goes to the ``meta``
    device (shape and dtype, no memory), so the weights are never allocated before
    the checkpoint's are: the largest allocation of the build is one uninitialised
    parameter, dropped at once.  Buffers stay real: they are small, and some (rotary
    frequencies) are computed in ``__init__``, not stored in the checkpoint.  A
    parameter already on meta is registered as it is, so weights the model ties
    while it is built stay one object.  The patch is global while it lasts: build no
    other module in another thread meanwhile.  More than ``most`` registrations
    are a LimitError naming ``config_path``.  transformers' initialisation of a
    module with nothing real in it (every parameter on meta, no buffer of its own)
    is skipped: whatever it would compute is replaced by the checkpoint's values."""
    original = torch.nn.Module.register_parameter
    count = 0

    def register(module, name, param):
        nonlocal count
        count += 1
        if count > most:
            raise LimitError(
                f"the config declares a model of more than {most} parameters, "
                "many more than the checkpoint holds",
                path=config_path,
            )
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    pretrained = transformers.PreTrainedModel
    initialize = getattr(pretrained, "_initialize_weights", None)

    def initialize_real(self, module, *args, **kwargs):
        # a module whose every parameter is on meta and that has no buffer of its
        # own has nothing real to initialise (the checkpoint fills it); its
        # _init_weights may still compute the values first, without bound (Marian's
        # sinusoidal table: 75 s of numpy for max_position_embeddings=2**19)
        own = list(module.parameters(recurse=False))
        buffers = [b for b in module.buffers(recurse=False) if b is not None]
        if own and not buffers and all(p.device.type == "meta" for p in own):
            return None
        return initialize(self, module, *args, **kwargs)

    # method-assign: torch's method is swapped for the load's duration, then restored
    torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
    if initialize is not None:
        pretrained._initialize_weights = initialize_real  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]
        if initialize is not None:
            pretrained._initialize_weights = initialize  # type: ignore[method-assign]


def _fp32_patterns(model: Any, dtype: torch.dtype) -> List[str]:
    """transformers' rule for modules kept in float32: ``_keep_in_fp32_modules`` when
    loading in float16, ``_keep_in_fp32_modules_strict`` in float16 or bfloat16."""
    patterns: List[str] = []
    if dtype == torch.float16:
        patterns += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    if dtype in (torch.float16, torch.bfloat16):
        patterns += list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    return patterns


def _shards(
    checkpoint: str, storage_options: Optional[Dict[str, Any]]
) -> Iterator[Dict[str, torch.Tensor]]:
    """name -> zero-copy CPU tensor, one shard at a time (one part for one file)."""
    if sharded.is_checkpoint(checkpoint):
        for _, part in shard_by_shard(checkpoint, "cpu", False, False, None, storage_options):
            yield part
            del part
    else:
        yield load_file(checkpoint, storage_options=storage_options)


def _load_weights(
    model: Any,
    checkpoint: str,
    dtype: torch.dtype,
    cls: Any,
    storage_options: Optional[Dict[str, Any]],
) -> List[str]:
    """Fill the meta-built ``model`` from ``checkpoint``, shard by shard (see
    :func:`from_pretrained` for the rules on tied, missing and unexpected names).
    Returns the names of the tensors the model has no place for."""
    expected = model.state_dict(keep_vars=True)  # the meta parameters, the buffers
    tied = _tied_groups(model)
    fp32 = _fp32_patterns(model, dtype)
    ignore = [
        re.compile(p) for p in (getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    ]
    loaded: Dict[str, torch.Tensor] = {}
    unexpected: List[str] = []
    for part in _shards(checkpoint, storage_options):
        own: Dict[str, torch.Tensor] = {}
        for key, value in part.items():
            target = expected.get(key)
            if target is None:
                if not any(p.search(key) for p in ignore):
                    unexpected.append(key)
                continue
            if tuple(value.shape) != tuple(target.shape):
                raise FormatError(
                    f"shape {list(value.shape)} in the checkpoint, "
                    f"{type(model).__name__} has {list(target.shape)}",
                    path=checkpoint,
                    obj=key,
                )
            want = target.dtype
            if fp32 and want.is_floating_point and any(re.search(p, key) for p in fp32):
                want = torch.float32
            if value.is_complex() and not want.is_complex:
                # Tensor.to drops the imaginary part with only torch's warning;
                # transformers refuses such a file (its loader has no complex dtype)
                raise FormatError(
                    f"a complex tensor ({str(value.dtype).split('.')[1]}) for a "
                    f"{str(want).split('.')[1]} parameter: its imaginary part would be lost",
                    path=checkpoint,
                    obj=key,
                )
            # a copy the model owns (cast as transformers casts: Tensor.to), so the
            # shard's mapping is released below and the file may go away
            own[key] = value.to(dtype=want, copy=True)
        del part
        model.load_state_dict(own, strict=False, assign=True)
        loaded.update(own)
        del own
    _retie(model, tied, loaded)
    missing = [
        name
        for name, value in model.state_dict(keep_vars=True).items()
        if value.device.type == "meta"
    ]
    _refuse_missing_and_warn_unexpected(model, checkpoint, missing, unexpected)
    return unexpected


def _refuse_missing_and_warn_unexpected(
    model: Any, checkpoint: str, missing: List[str], unexpected: List[str]
) -> None:
    """The rules both loading paths end with: a weight the checkpoint lacks is an
    ObjectNotFoundError naming the first and their count (never a random one); a
    tensor the model has no place for, a warning naming them."""
    if missing:
        shown = ", ".join(repr(n) for n in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ObjectNotFoundError(
            f"{len(missing)} weight(s) of {type(model).__name__} are "
            f"not in the checkpoint: {shown}",
            path=checkpoint,
            obj=missing[0],
        )
    if unexpected:
        shown = ", ".join(repr(n) for n in unexpected[:8]) + (" ..." if len(unexpected) > 8 else "")
        warnings.warn(
            # the checkpoint may be a URL: its credentials are never shown
            without_secrets(
                f"{checkpoint}: {len(unexpected)} tensor(s) the model "
                f"{type(model).__name__} has no place for were not loaded: {shown}",
                checkpoint,
            ),
            stacklevel=4,  # the caller of from_pretrained
        )


def _conversions(model: Any) -> List[Any]:
    """transformers' renames and merges of checkpoint names for ``model``: none on a
    transformers before 5 (which has no conversion mapping to apply)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:
        return []
    return list(get_model_conversion_mapping(model) or ())


def _needs_conversion(model: Any, names: frozenset) -> bool:
    """Whether some parameter of the meta-built ``model`` is among the checkpoint's
    ``names`` under no name of its own (nor a name it is tied to), the checkpoint
    holds names the model has no place for (what a conversion renames or merges),
    and transformers has conversions for the model.  A checkpoint that merely lacks
    a weight is refused on the direct path, before anything is allocated for it."""
    groups = {n: g for g in _tied_groups(model) for n in g}
    own = set(model.state_dict(keep_vars=True))
    if not names - own:
        return False
    for name, _ in model.named_parameters(remove_duplicate=False):
        if not any(n in names for n in groups.get(name, [name])):
            return bool(_conversions(model))
    return False


def _load_converted(
    cls: Any,
    config: Any,
    dtype: torch.dtype,
    model_kwargs: Dict[str, Any],
    checkpoint: str,
    storage_options: Optional[Dict[str, Any]],
    complex_ok: bool,
) -> Tuple[Any, List[str]]:
    """The model of concrete class ``cls`` built and filled by transformers' own
    ``from_pretrained`` from the checkpoint's zero-copy tensors (its public
    ``state_dict=`` path: renames, merges of experts, tying,
    ``_keep_in_fp32_modules``), held to :func:`_load_weights`' rules: what
    transformers refuses or would skip is a FormatError naming the checkpoint, a
    weight it would initialise at random an ObjectNotFoundError, a complex tensor for
    a model of real ones a FormatError (a cast would drop its imaginary part), and
    the model owns its memory (a parameter left a view of the file's mapping is
    copied).  transformers' load report and progress bar are kept off the caller's
    terminal: what they say is in the error or the warning."""
    state = load_file(checkpoint, storage_options=storage_options)
    if not complex_ok:
        for name, value in state.items():
            if value.is_complex():
                raise FormatError(
                    f"a complex tensor ({str(value.dtype).split('.')[1]}) for a model of "
                    "real parameters: its imaginary part would be lost",
                    path=checkpoint,
                    obj=name,
                )
    mapped = {t.untyped_storage().data_ptr() for t in state.values()}
    with _transformers_report() as report:
        try:
            with _config_refusals(checkpoint, "transformers refuses the checkpoint"):
                model, info = cls.from_pretrained(
                    None,
                    config=config,
                    state_dict=state,
                    dtype=dtype,
                    output_loading_info=True,
                    # a mismatch comes back in the report, refused below by name
                    ignore_mismatched_sizes=True,
                    **model_kwargs,
                )
        except FormatError as exc:
            found = _conversion_failure(report)
            if found is None:
                raise
            target, why = found
            raise FormatError(
                f"transformers cannot convert the checkpoint's tensors for it: {why}",
                path=checkpoint,
                obj=target,
            ) from exc.__cause__
    del state
    for module in model.modules():
        own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        for value in own:
            if value is not None and value.untyped_storage().data_ptr() in mapped:
                # a view of the file's mapping: the file may go once loaded
                value.data = value.data.clone()
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        first = mismatched[0]
        name = first[0] if isinstance(first, tuple) else str(first)
        raise FormatError(
            f"{len(mismatched)} tensor(s) of the checkpoint have another shape than "
            f"{type(model).__name__}'s: {', '.join(str(m) for m in mismatched[:4])}",
            path=checkpoint,
            obj=name,
        )
    missing = sorted(info.get("missing_keys") or ())
    unexpected = sorted(info.get("unexpected_keys") or ())
    _refuse_missing_and_warn_unexpected(model, checkpoint, missing, unexpected)
    return model, unexpected


@contextlib.contextmanager
def _transformers_report() -> Iterator[List[str]]:
    """transformers' load report (its log records) and progress bar held back while
    it loads: the messages, collected, for :func:`_conversion_failure`."""
    import logging

    from transformers.utils import logging as hf_logging

    messages: List[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("transformers.modeling_utils")
    handler, propagate = Collect(), logger.propagate
    bar = hf_logging.is_progress_bar_enabled()
    logger.addHandler(handler)
    logger.propagate = False
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        if bar:
            hf_logging.enable_progress_bar()


# transformers' report of a failed conversion: torch's refusal, then this line
_CONVERSION_FAILED = re.compile(r"^Error: (\w+) on tensors destined for (\S+?)\.? ", re.M)
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception): (.+)$", re.M)


def _conversion_failure(report: List[str]) -> Optional[Tuple[str, str]]:
    """(the parameter, what went wrong) of the first failed conversion in
    transformers' report, or None where it names none."""
    for message in report:
        failed = _CONVERSION_FAILED.search(message)
        if failed is None:
            continue
        cause = _EXCEPTION_LINE.findall(message[: failed.start()])
        why = f"{failed.group(1)}: {cause[-1]}" if cause else failed.group(1)
        return failed.group(2), why
    return None


def _tied_groups(model: Any) -> List[List[str]]:
    """The names of each parameter the built model holds under more than one name
    (tied while it was built): meta tensors have no storage to compare, so the
    parameter objects themselves are."""
    by_object: Dict[int, List[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_object.setdefault(id(param), []).append(name)
    return [names for names in by_object.values() if len(names) > 1]


def _retie(model: Any, groups: List[List[str]], loaded: Dict[str, torch.Tensor]) -> None:
    """Make each tied group one parameter again after loading replaced its members:
    the one the checkpoint gave, whichever name it came under.  A group given under
    two names with different values is left untied, with a warning (transformers'
    rule: the checkpoint says they are not the same weight)."""
    for names in groups:
        present = [n for n in names if n in loaded]
        if not present:
            continue  # reported missing
        if any(not torch.equal(loaded[present[0]], loaded[n]) for n in present[1:]):
            warnings.warn(
                f"{', '.join(present)} are tied in the model but differ in the "
                "checkpoint: they are loaded untied",
                stacklevel=4,
            )
            source_names, source = [n for n in names if n not in loaded], present[0]
        else:
            source_names, source = [n for n in names if n != present[0]], present[0]
        param = model.get_parameter(source)
        for name in source_names:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, param)


# ------------------------------------------------------------------ saving
def save_pretrained(
    model: Any,
    save_directory: Any,
    *,
    max_shard_size: Any = "5GB",
    compress: Any = None,
    checksum: Optional[str] = None,
    compression: Any = None,
    save_original_format: bool = True,
) -> List[str]:
    """Write ``model`` (a transformers ``PreTrainedModel``) into ``save_directory`` as
    :func:`from_pretrained` reads it: ``config.json`` (with the model's dtype and
    class, as transformers writes it), ``generation_config.json`` for a model that
    generates, the weights as ``.zt`` shards of at most ``max_shard_size`` (``"5GB"``,
    ``"500MiB"`` or bytes; one larger tensor alone) and ``model.zt.index.json``.

    A tied weight is stored once, under the name transformers keeps (the embedding,
    not the head: :func:`_stored_once`), a parameter that is a slice of a larger
    tensor as itself.  Shards of an earlier save that this one does not rewrite
    are removed after the new index is written.  ``compress``/``compression`` and
    ``checksum`` as for :func:`ztensor.torch.save_file`.  ``save_original_format``
    (the default, as in transformers 5): the names and layout of the checkpoint the
    model's design was published with, as transformers writes them (a mixture of
    experts' fused weights as one tensor an expert); False: the model's own
    ``state_dict``.  Returns the shard names."""
    if not isinstance(model, transformers.PreTrainedModel):
        # before anything is written: a torch module has no config to save (it
        # failed with an AttributeError after the folder was made)
        raise TypeError(f"model must be a transformers PreTrainedModel, not {type(model).__name__}")
    compress = _save.compress_option(compress, compression)
    folder = os.fspath(save_directory)
    if is_url(folder):
        # before anything is made: os.makedirs made ./s3:/bucket/... here
        raise UnsupportedError(
            "save_pretrained writes a local folder; save there, then upload the "
            "folder (or use ztensor.save_sharded for the weights alone)",
            path=url_without_secrets(folder),
        )
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ZTensorError("exists and is not a directory", path=folder)
    state_dict = model.state_dict()
    targets = _tied_targets(model)
    _check_sharing_is_tied(state_dict, targets, folder)
    os.makedirs(folder, exist_ok=True)

    metadata = {"format": "pt"}
    to_remove = _stored_once(state_dict, targets)
    for kept, dropped in to_remove.items():
        for name in dropped:
            metadata.setdefault(name, kept)
            del state_dict[name]
    if save_original_format:
        state_dict, metadata = _original_format(model, state_dict, metadata)

    config = copy.deepcopy(model.config)
    config.dtype = str(model.dtype).split(".")[1]
    config.architectures = [type(model).__name__]
    # the configs move in with the weights, all or none (save_sharded's
    # write_beside): a save whose weights failed left the new config.json beside the
    # old weights, and one whose config's move was refused the new weights beside
    # the old config, each loading under the other without a word
    generation = getattr(model, "generation_config", None)

    def configs(into: str) -> None:
        config.save_pretrained(into)
        if generation is not None and model.can_generate():
            generation.save_pretrained(into)

    files = save_sharded(
        state_dict,
        folder,
        max_shard_size=max_shard_size,
        prefix=WEIGHTS_PREFIX,
        metadata=metadata,
        compress=compress,
        checksum=checksum,
        write_beside=configs,
        # the new config.json describes these weights only: transformers' own
        # weights of an earlier save, left beside it, loaded under it without a word
        supersedes=sharded.transformers_weights,
    )
    # an earlier save's shards that this one does not rewrite went with the moves,
    # under the folder's lock (save_sharded: its index's shards, and its own names)
    return files


def _original_format(
    model: Any, state_dict: Dict[str, torch.Tensor], metadata: Dict[str, str]
) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """``state_dict`` under the names transformers saves (its conversions reversed),
    and ``metadata`` with each dropped tied name pointing at its kept tensor's new
    name (a pure rename keeps the tensor object)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers before 5 saves the model's own names
        return state_dict, metadata
    before = {id(t): name for name, t in state_dict.items()}
    reverted = revert_weight_conversion(model, state_dict)
    if reverted is state_dict:
        return state_dict, metadata
    renamed = {before[id(t)]: name for name, t in reverted.items() if id(t) in before}
    kept = {
        dropped: renamed[name] if name in renamed else name
        for dropped, name in metadata.items()
        if dropped == "format" or name in renamed or name in reverted
    }
    return dict(reverted), kept


def _stored_once(state_dict: Dict[str, torch.Tensor], targets: List[str]) -> Dict[str, List[str]]:
    """The tied names to leave out of the checkpoint: kept name -> the names whose
    tensors are the very same view of its memory (same start, shape, strides and
    dtype), which loading gives back by the model's own ties.  The kept name is one
    the model does not declare a tie target (the embedding, not the head), else the
    first in sorted order.  Tensors that merely overlap another's memory are each
    stored as themselves (nothing is lost), and so is a tensor over part of a larger
    one: transformers saves both, where ``ztensor.torch.save_model`` follows
    safetensors in refusing a name that does not cover its memory."""
    declared = set(targets)
    to_remove: Dict[str, List[str]] = {}
    for group in find_shared_tensors(state_dict):
        if len(group) < 2:
            continue
        keep, *others = sorted(group, key=lambda name: (name in declared, name))
        kept = state_dict[keep]
        same = [name for name in others if _same_view(state_dict[name], kept)]
        if same:
            to_remove[keep] = same
    return to_remove


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
    )


def _check_sharing_is_tied(
    state_dict: Dict[str, torch.Tensor], targets: List[str], folder: str
) -> None:
    """Tensors that share memory are stored once, and :func:`from_pretrained` gives
    the others back only where the model it builds ties them: the tie targets the
    model declares (``_tied_targets``).  A group sharing memory with more than one
    name outside those (two layers made to share a weight after the model was
    built) would be saved as a checkpoint missing a weight its own loader needs;
    it is refused, as transformers' ``save_pretrained`` refuses it, before
    anything is written."""
    declared = set(targets)
    for group in find_shared_tensors(state_dict):
        undeclared = sorted(name for name in group if name not in declared)
        if len(undeclared) > 1:
            raise FormatError(
                f"tensors {', '.join(map(repr, undeclared))} share memory but the model "
                "does not declare them tied (its tied weights: "
                f"{', '.join(map(repr, sorted(declared))) or 'none'}): a model built from "
                "the config would not share them, so one would be missing on loading; "
                "tie them in the model's config or clone one before saving",
                path=folder,
            )


def _tied_targets(model: Any) -> List[str]:
    """The names transformers drops when it saves tied weights (``lm_head.weight``
    for an embedding-tied head): transformers 5's ``all_tied_weights_keys`` (target ->
    source), else transformers 4's ``_tied_weights_keys`` (a list of targets)."""
    mapping = getattr(model, "all_tied_weights_keys", None)
    if isinstance(mapping, dict):
        return list(mapping)
    targets = getattr(model, "_tied_weights_keys", None)
    if isinstance(targets, dict):
        return list(targets)
    return list(targets or ())
