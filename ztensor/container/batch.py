"""READ 6: many dense objects at once, into owned arrays, copied in parallel threads.

``Reader.read_numpy([names], copy=True)`` (and ``read_tensors``, ``load_file``)
come here.  Reading object by object pays Python work per object and copies one
after another; here the plain raw objects (dense.view_plan's rule) are planned in
one pass, small ones share one allocation (each array a separate, writable view of
it, as safetensors' numpy loader hands out), large ones get their own, and the
copies run in ``threads`` threads with the GIL released: copying into fresh pages
is bound by page faults, which proceed in parallel.  Unmapped sources (URLs, file
objects, ``mmap=False``) fetch every planned range at once: neighbours coalesced,
fetches concurrent (Source.read_ranges).  Everything else (zstd, logical types, byte
swaps, bool, whose bytes io/values.check_bools checks, ``verify=True``) takes the
per-object path.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ztensor import kernels
from ztensor.container.manifest_table import TableSpecs
from ztensor.formats import dense

# objects below this share one allocation; larger ones get their own (so that freeing
# one frees its memory) and are copied in pieces of _PIECE, spread over the threads
_SHARED_BELOW = 1 << 20
_PIECE = 16 << 20
_ALIGN = 64


def default_threads() -> int:
    """The CPUs this process may use (kernels.cpu_threads, the one definition)."""
    return kernels.cpu_threads()


def read_owned(reader, names, threads=None):
    """name -> owned native array for ``names`` (dense objects), in order."""
    threads = default_threads() if threads is None else int(threads)
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    plans, out = {}, {}
    internals = reader.internals  # the Reader's source and manifest (reader.py)
    source, specs = internals.source, internals.specs
    if not internals.verify and internals.foreign is None:
        if isinstance(specs, TableSpecs) and source.mapped:
            out = _copy_columns(source, specs, names, threads)
        else:
            plans = _plan(reader, specs, names)
    if plans:
        out = (
            _copy_planned(source, plans, threads)
            if source.mapped
            else _fetch_planned(source, plans, threads)
        )
    return {
        name: out[name] if name in out else reader.read_numpy(name, copy=True) for name in names
    }


def _copy_columns(source, specs, names, threads):
    """_plan and _copy_planned over the manifest's columns (a mapped file whose
    manifest came as tables): no Python work per small object but its view, made by
    a kernels.ViewTable over the shared allocation."""
    index = specs.index
    found = [n for n in dict.fromkeys(names) if n in index]  # missing: raised in order later
    rows = np.fromiter(map(index.__getitem__, found), np.int64, len(found))
    mask, offsets, lengths = specs.plain_spans(rows)
    chosen = list(itertools.compress(found, mask.tolist()))
    rows = rows[mask]
    small = lengths < _SHARED_BELOW
    padded = np.where(small, -(-lengths // _ALIGN) * _ALIGN, 0).astype(np.uint64)
    at = np.cumsum(padded) - padded
    shared = np.empty(int(padded.sum()), np.uint8)
    view = specs.view_table(shared, rows[small], at[small]).view
    small_list = small.tolist()
    out = {name: view(name) for name in itertools.compress(chosen, small_list)}
    jobs = []
    large = ~small
    if large.any():  # few: one allocation each, copied in pieces
        storage, _, _, shapes, _ = specs.plain_views(rows[large])
        for name, dt, shape, offset, n in zip(
            itertools.compress(chosen, large.tolist()),
            storage,
            shapes,
            offsets[large].tolist(),
            lengths[large].tolist(),
        ):
            dst = np.empty(n, np.uint8)
            out[name] = dst.view(dt).reshape(shape)
            jobs.extend(_pieces(dst, offset, n, name))
    jobs.extend(_split(shared, (offsets[small], at[small], lengths[small]), threads))
    _run(source, jobs, threads)
    return out


def _plan(reader, specs, names):
    """name -> ((storage dtype, count, offset), shape) for the plain raw objects."""
    if isinstance(specs, TableSpecs):  # over columns: no spec built per object
        found = [n for n in dict.fromkeys(names) if n in specs.index]
        rows = np.fromiter((specs.index[n] for n in found), np.int64, len(found))
        storage, offsets, lengths, shapes, mask = specs.plain_views(rows)
        chosen = [n for n, ok in zip(found, mask.tolist()) if ok]
        return {
            n: ((dt, ln // dt.itemsize, off), shape)
            for n, dt, off, ln, shape in zip(
                chosen, storage, offsets.tolist(), lengths.tolist(), shapes
            )
        }
    plans = {}
    for name in names:
        if name in plans or name not in reader:
            continue  # a missing name raises in the per-object path, in order
        obj = reader.metadata(name)
        plan = obj.plan
        if plan is None:
            plan = obj.plan = dense.view_plan(obj)
        if plan:
            plans[name] = (plan, obj.shape)
    return plans


def _copy_planned(source, plans, threads):
    names = list(plans)
    nbytes = [count * storage.itemsize for (storage, count, _), _ in plans.values()]
    offsets = [offset for (_, _, offset), _ in plans.values()]
    small = [n < _SHARED_BELOW for n in nbytes]
    padded = np.array(
        [-(-n // _ALIGN) * _ALIGN if s else 0 for n, s in zip(nbytes, small)], np.uint64
    )
    at = (np.cumsum(padded) - padded).tolist()
    shared = np.empty(int(padded.sum()), np.uint8)
    out, jobs = {}, []
    small_spans = ([], [], [])
    for name, n, offset, is_small, where in zip(names, nbytes, offsets, small, at):
        (storage, _, _), shape = plans[name]
        if is_small:
            out[name] = np.ndarray(shape, storage, shared, where)
            small_spans[0].append(offset)
            small_spans[1].append(where)
            small_spans[2].append(n)
            continue
        dst = np.empty(n, np.uint8)
        out[name] = dst.view(storage).reshape(shape)
        jobs.extend(_pieces(dst, offset, n, name))
    jobs.extend(_split(shared, small_spans, threads))
    _run(source, jobs, threads)
    return out


def _fetch_planned(source, plans, threads):
    """Unmapped sources (a URL, a file object, mmap=False): every range in one
    coalesced, concurrent fetch (Source.read_ranges), then into owned arrays."""
    out = {}
    # a large tensor is one request of its own, read straight into its array (no copy
    # to spare); the small ones are coalesced, their requests concurrent
    small = [
        n
        for n, ((storage, count, _), _) in plans.items()
        if count * storage.itemsize < _SHARED_BELOW
    ]
    for name, ((storage, count, offset), shape) in plans.items():
        if count * storage.itemsize >= _SHARED_BELOW:
            out[name] = source.array(storage, count, offset, **_where(name)).reshape(shape)
    ranges = [(plans[n][0][2], plans[n][0][1] * plans[n][0][0].itemsize) for n in small]
    wheres = [_where(n) for n in small]
    for name, blob in zip(small, source.read_ranges(ranges, threads, wheres)):
        (storage, count, _), shape = plans[name]
        arr = np.empty(count, storage)
        arr.view(np.uint8)[:] = np.frombuffer(blob, np.uint8)
        out[name] = arr.reshape(shape)
    return out


def _where(name):
    """What a read error names: the object (every plan here is a dense object's one
    component, ``data``)."""
    return {"obj": name, "component": "data"}


def _pieces(dst, offset, n, name):
    """Read jobs for object ``name``: n bytes at file ``offset`` into ``dst``, in
    pieces of _PIECE that the threads share.  Each is a Source.read_into: ``pread``
    straight into the array for a mapped file (from a cold page cache, faulting the
    mapping in reads in readahead-sized pieces: bench/bench_cold.py)."""
    return [(dst[start : start + _PIECE], offset + start, name) for start in range(0, n, _PIECE)]


def _split(dst, spans, parts):
    """The small spans as at most ``parts`` jobs of about equal bytes."""
    src_offsets, dst_offsets, lengths = (np.asarray(a, np.uint64) for a in spans)
    if not len(lengths):
        return []
    # no more jobs than spans: ``parts`` is the caller's thread count, and its cut
    # points were an array of that size (threads=10**9: 8 GB, the process killed)
    parts = min(parts, len(lengths))
    cuts = np.searchsorted(np.cumsum(lengths), np.arange(1, parts) * (lengths.sum() / parts))
    return [
        (dst, s, d, n)
        for s, d, n in zip(
            np.split(src_offsets, cuts), np.split(dst_offsets, cuts), np.split(lengths, cuts)
        )
        if len(n)
    ]


def _run(source, jobs, threads):
    """Run the jobs in ``threads`` threads: (dst, offset, name) reads of a large
    object's pieces (Source.reading), and (dst, src offsets, dst offsets, lengths) copies of
    small spans out of the mapping (kernels.copy_spans, the GIL released)."""
    src = source.all_bytes() if any(len(job) == 4 for job in jobs) else None
    with source.reading() as read_into:

        def one(job):
            if len(job) == 3:
                read_into(job[1], job[0], **_where(job[2]))
                return
            dst, s, d, n = job
            kernels.copy_spans(
                src,
                dst,
                np.asarray(s, np.uint64),
                np.asarray(d, np.uint64),
                np.asarray(n, np.uint64),
            )

        if threads == 1 or len(jobs) < 2:
            for job in jobs:
                one(job)
            return
        with ThreadPoolExecutor(max_workers=min(threads, len(jobs))) as pool:
            list(pool.map(one, jobs))


__all__ = ["read_owned", "default_threads"]
