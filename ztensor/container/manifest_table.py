"""READ 2, the fast path: the manifest as tables, checked over columns, specs on demand.

``csrc/manifest_scan.c`` reads the manifest shape every writer we know produces
into flat uint64 tables, column-major (``objects[FORMAT]`` is the format of every
object): one row per object, one per component, plus the dims.
Here every check :class:`ztensor.container.manifest_checks.Checker` runs per object runs over the
columns instead (alignment, bounds, sizes, limits, the dense rule, overlaps), and
an object's :class:`ObjectSpec` is built when it is first asked for.  Objects of
the other formats (sparse, quantized) and objects with attributes are checked one
by one at open, by the same code the general path uses.

The tables only ever *accept*: a manifest the scanner does not take, or any check
here that fails, goes to ``manifest.py``'s general path (cbor2 + Checker), which
then reports the first problem in manifest order.  So both paths give one verdict
and one message, and a differential fuzz target (tools/fuzz) holds them to it.
"""

from __future__ import annotations

import itertools
import threading

import cbor2
import numpy as np

from ztensor import attributes as attrs
from ztensor import dtypes, formats, kernels, spec
from ztensor.container.manifest_checks import (
    MAX_CBOR_DEPTH,
    Checker,
    Manifest,
    gc_paused,
    refuse_repeated_keys,
)
from ztensor.errors import ZTensorError
from ztensor.objects import ComponentSpec, ObjectSpec, Shape

# columns of the tables (csrc/manifest_scan.h, zt_mf_object / zt_mf_component: the
# compiled extension exports the structs' field order, HEADER_CONSTANTS, and
# tests/native/test_c_constants.py checks these names against it)
(
    NAME_OFF,
    NAME_LEN,
    FORMAT,
    ATTRS_OFF,
    ATTRS_LEN,
    DIMS_START,
    RANK,
    COMPS_START,
    NCOMPS,
    NUMEL,
    EXTENT_OK,
) = range(11)
(
    ROLE_OFF,
    ROLE_LEN,
    ROLE,
    DTYPE,
    TYPE,
    OFFSET,
    LENGTH,
    ENCODING,
    ULEN,
    DIGEST_OFF,
    DIGEST_LEN,
    OBJECT,
) = range(12)
NONE = (1 << 64) - 1  # ZT_MF_NONE

FORMATS = tuple(formats.HANDLERS)
DENSE = FORMATS.index("dense")
DTYPE_WORDS = tuple(dtypes.STORAGE) + tuple(dtypes.V11_DTYPE_ALIASES)
TYPE_WORDS = tuple(dtypes.LOGICAL) + tuple(dtypes.TYPE_ALIASES)
ENCODINGS = ("raw", "zstd")
ROLES = ("data",)
VOCABULARIES = (FORMATS, DTYPE_WORDS, TYPE_WORDS, ENCODINGS, ROLES)
# objects with more components are rare and checked the general way (the scanner's
# duplicate-role check is quadratic in this)
MAX_COMPONENTS = 64


def _resolve(dtype_word, type_word):
    """(storage, logical type, bytes per logical element) for a component's dtype and
    type words, as Checker.component_spec resolves them; None if it would refuse."""
    if dtype_word in dtypes.STORAGE:
        storage, ltype = dtype_word, type_word
    else:  # v1.1 dtypes that are really logical types
        storage, alias_type = dtypes.V11_DTYPE_ALIASES[dtype_word]
        ltype = type_word or alias_type
    if ltype is not None:
        ltype = dtypes.TYPE_ALIASES.get(ltype, ltype)
        known = dtypes.LOGICAL.get(ltype)
        if known is not None and known.storage != storage:
            return None
    return storage, ltype, dtypes.STORAGE[storage].itemsize * dtypes.element_ratio(storage, ltype)


# (dtype index, type index or len(TYPE_WORDS) for none) -> resolved, and its item size
# as a lookup array (0: refused)
_RESOLVED = {
    (d, t): _resolve(dw, TYPE_WORDS[t] if t < len(TYPE_WORDS) else None)
    for d, dw in enumerate(DTYPE_WORDS)
    for t in range(len(TYPE_WORDS) + 1)
}
_ITEMSIZE = np.zeros((len(DTYPE_WORDS), len(TYPE_WORDS) + 1), np.uint64)
for (_d, _t), _r in _RESOLVED.items():
    _ITEMSIZE[_d, _t] = 0 if _r is None else _r[2]


# the same, flat: code dtype * _PAIR_WIDTH + type -> (storage, logical type), and the
# reference's dtype name of that pair; the extra last entry (code -1) is None
_PAIR_WIDTH = len(TYPE_WORDS) + 1
_PAIRS = [None] * (len(DTYPE_WORDS) * _PAIR_WIDTH + 1)
for (_d, _t), _r in _RESOLVED.items():
    _PAIRS[_d * _PAIR_WIDTH + _t] = None if _r is None else _r[:2]
_DTYPE_NAMES = [None if _p is None else dtypes.REFERENCE_NAMES.get(_p[0], _p[0]) for _p in _PAIRS]


def _shape_list(starts, ranks, dims):
    """The shape of every object (its dims[start:start + rank], an objects.Shape), each
    distinct shape made once and shared.  Rows are grouped by a hash of (rank,
    dims) and every row is compared with its group's first, so a collision only
    means the plain way: one tuple per object."""
    count = len(ranks)
    top = int(ranks.max()) if count else 0
    if count >= 64 and top <= 8:
        columns = [ranks]
        for axis in range(top):
            has = ranks > axis
            column = np.zeros(count, np.uint64)
            column[has] = dims[(starts + np.uint64(axis))[has].astype(np.int64)]
            columns.append(column)
        key = np.zeros(count, np.uint64)
        with np.errstate(over="ignore"):
            for column in columns:
                key = (key ^ column) * np.uint64(0x9E3779B97F4A7C15)
        _, first, group = np.unique(key, return_index=True, return_inverse=True)
        group = group.reshape(-1)
        rep = first[group]
        if all((column == column[rep]).all() for column in columns):
            dims_list = dims.tolist()
            made = [
                Shape(dims_list[s : s + k])
                for s, k in zip(starts[first].tolist(), ranks[first].tolist())
            ]
            return list(map(made.__getitem__, group.tolist()))
    dims_list = dims.tolist()
    return [Shape(dims_list[s : s + k]) for s, k in zip(starts.tolist(), ranks.tolist())]


# dtype index -> numpy dtype of a plain view (None: never one: bf16, v1.1 aliases of
# logical types, multi-byte types on big-endian hosts, which need a swap, and bool,
# whose bytes must be checked on the way out: formats/dense.py view_plan)
_VIEW_DTYPES = [
    dtypes.STORAGE[w].numpy
    if w in dtypes.STORAGE
    and w not in dtypes.NOT_PLAIN_VIEWS
    and (dtypes.STORAGE[w].numpy.isnative or dtypes.STORAGE[w].itemsize == 1)
    else None
    for w in DTYPE_WORDS
]
_VIEWABLE = np.array([d is not None for d in _VIEW_DTYPES])


class _Slow(Exception):
    """This manifest goes the general way (which reports any problem in full)."""


def decode(raw, footer, path, limits, max_depth):
    """A :class:`ztensor.container.manifest.Manifest` read through the tables, or None when the
    manifest must take the general path."""

    if footer.family == 0 or not hasattr(kernels, "manifest_scan"):
        return None  # v0.1 is another shape; the numpy fallback has no scanner
    raw = bytes(raw)
    scanned = kernels.manifest_scan(raw, VOCABULARIES, max_depth, MAX_COMPONENTS)
    if scanned[0] is None:
        return None
    (version_off, version_len), (attrs_off, attrs_len), objects, comps, dims = scanned
    try:
        version = raw[version_off : version_off + version_len].decode("utf-8")
        parsed = spec.parse_version(version)
        if parsed is None or parsed[0] != 1:
            raise _Slow
        info = spec.version_info(*parsed)
        file_attributes = _attributes(raw, attrs_off, attrs_len, "file attributes", path)
        if objects.shape[1] > limits.max_objects:
            raise _Slow
        names = kernels.decode_spans(raw, objects[NAME_OFF], objects[NAME_LEN])
        index = dict(zip(names, range(len(names))))
        if len(index) != len(names):
            raise _Slow  # a repeated name: cbor2 keeps the last entry, in the first's place
        checker = Checker(path, info, footer.manifest_offset, limits)
        _derive_sizes(objects, comps, info)
        itemsize = _itemsizes(comps)
        _check_components(raw, comps, itemsize, checker)
        specs = TableSpecs(raw, names, index, objects, comps, dims)
        _check_objects(specs, itemsize, checker)
        _check_disjoint(comps)
    except (_Slow, ZTensorError, cbor2.CBORDecodeError):
        return None
    return Manifest(version, file_attributes, specs)


def _attributes(raw, off, length, what, path, name=None):
    if not length:
        return {}
    encoded = raw[off : off + length]
    value = cbor2.loads(encoded)
    _, items, _ = kernels.cbor_scan(encoded, MAX_CBOR_DEPTH, path)
    refuse_repeated_keys(value, encoded, items, path, obj=name)
    return attrs.check_optional_map(value, what, path=path, obj=name)


def _derive_sizes(objects, comps, info):
    """v1.1 zstd components may omit uncompressed_length: a dense object's data then
    decodes to its shape's bytes (formats/dense.py), written into the table as the
    general path writes it into the spec; any other component goes the general way."""
    missing = np.flatnonzero((comps[ENCODING] == ENCODINGS.index("zstd")) & (comps[ULEN] == NONE))
    if not len(missing):
        return
    owners = comps[OBJECT, missing].astype(np.int64)
    if (
        info.requires_uncompressed_length
        or (objects[FORMAT, owners] != DENSE).any()
        or (comps[ROLE, missing] != ROLES.index("data")).any()
        or not objects[EXTENT_OK, owners].all()
    ):
        raise _Slow
    comps[ULEN, missing] = objects[NUMEL, owners] * _itemsizes(comps[:, missing])


def _pair_codes(dtype, ctype):
    """The (dtype, type) code of components, from their DTYPE and TYPE columns:
    dtype * _PAIR_WIDTH + type, an absent type counting as len(TYPE_WORDS)."""
    return (
        dtype * np.uint64(_PAIR_WIDTH) + np.where(ctype == NONE, len(TYPE_WORDS), ctype)
    ).astype(np.int64)


def _itemsizes(rows):
    """Bytes per logical element of each component (columns of the component table;
    0: a dtype/type pair the general path refuses)."""
    return _ITEMSIZE.reshape(-1)[_pair_codes(rows[DTYPE], rows[TYPE])]


def _check_components(raw, comps, itemsize, checker):
    """Checker.component_spec over the component table (``itemsize``: _itemsizes of
    every row)."""
    limits = checker.limits
    offset, length, ulen = comps[OFFSET], comps[LENGTH], comps[ULEN]
    data_end = np.uint64(checker.data_end)
    if (
        not itemsize.all()
        or (offset % spec.ALIGNMENT).any()
        or (offset < spec.MAGIC_SIZE).any()
        or (offset > data_end).any()
        or (length > data_end - offset).any()
    ):
        raise _Slow
    raw_enc = comps[ENCODING] == ENCODINGS.index("raw")
    if (raw_enc & (ulen != NONE) & (ulen != length)).any() or (
        raw_enc & (length % itemsize != 0)
    ).any():
        raise _Slow
    zstd = ~raw_enc
    if zstd.any():
        z_ulen, z_length = ulen[zstd], length[zstd]
        if not z_length.all():  # no bytes: no zstd frame (Checker.check_zstd_size)
            raise _Slow
        if (z_ulen > limits.max_component_size).any():
            raise _Slow
        if len(z_ulen) * limits.max_component_size < (1 << 64):
            total = int(z_ulen.sum())  # exact: no uint64 overflow is possible
        else:
            total = sum(int(u) for u in z_ulen)
        if total > limits.max_total_decompressed:
            raise _Slow
        ratio = np.uint64(spec.ZSTD_MAX_RATIO)
        whole, part = z_ulen // ratio, z_ulen % ratio  # ulen <= length * ratio, no overflow
        if ((whole > z_length) | ((whole == z_length) & (part != 0))).any():
            raise _Slow
        if (z_ulen % itemsize[zstd] != 0).any():
            raise _Slow
    for row in np.flatnonzero(comps[DIGEST_OFF]).tolist():
        off, n = int(comps[DIGEST_OFF, row]), int(comps[DIGEST_LEN, row])
        checker.check_digest(None, None, raw[off : off + n].decode("utf-8"))


def _check_objects(specs, itemsize, checker):
    """Checker.object_spec's rules over the object table: rank, the dense rule over
    columns; objects of other formats and objects with attributes one by one."""
    objects, comps = specs.objects, specs.comps
    if (objects[RANK] > checker.limits.max_rank).any():
        raise _Slow
    dense = objects[FORMAT] == DENSE
    if dense.any():
        # formats/dense.py's check_entry over columns: the shape's bytes fit in memory,
        # a 'data' component holds exactly shape x element size bytes (decoded)
        rows = specs.data_component_rows()[dense]
        if (rows < 0).any() or not objects[EXTENT_OK, dense].all():
            raise _Slow
        # a dense object holds 'data' alone: one with another component goes the
        # general way, which refuses it
        if (dense[comps[OBJECT].astype(np.int64)] & (comps[ROLE] != ROLES.index("data"))).any():
            raise _Slow
        expected = objects[NUMEL, dense] * itemsize[rows]  # < 2**63: extent_ok bounds it
        decoded = np.where(
            comps[ENCODING, rows] == ENCODINGS.index("raw"), comps[LENGTH, rows], comps[ULEN, rows]
        )
        if (decoded != expected).any():
            raise _Slow
    # the rest, one by one with the general path's code (and attributes decoded once)
    special = np.flatnonzero(~dense | (objects[ATTRS_LEN] != 0)).tolist()
    for row in special:
        obj = specs.build(row, checker)
        if not dense[row]:
            formats.handler(obj.format).check_entry(checker, obj.name, obj.shape, obj.components)


def _check_disjoint(comps):
    """manifest._check_disjoint over columns: sorted by start, no component may begin
    before the one before it ends (empty components occupy nothing)."""
    used = comps[LENGTH] != 0
    start = comps[OFFSET, used]
    order = np.argsort(start, kind="stable")
    start = start[order]
    end = start + comps[LENGTH, used][order]
    if (start[1:] < end[:-1]).any():
        raise _Slow


class TableSpecs:
    """name -> :class:`ObjectSpec` in manifest order, each built from the tables on
    first access and kept."""

    def __init__(self, raw, names, index, objects, comps, dims):
        self.raw = raw
        self.names = names
        self.index = index
        self.objects = objects
        self.comps = comps
        self.dims = dims
        self.built = {}  # row -> ObjectSpec
        self._plain = None
        self._views = None
        # per object, in Python form, from one pass over the columns (_columns): what
        # a spec reports without building anything
        self.shapes = self.formats = self.data_pairs = self.dtype_names = None
        self._misses = 0
        self._lock = threading.Lock()

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)

    def __contains__(self, name):
        return name in self.index

    def get(self, name):
        row = self.index.get(name)
        if row is None:
            return None
        found = self.built.get(row)
        if found is None:
            if self.shapes is None:
                self._columns()
            with self._lock:  # threads sharing a Reader get one spec per object
                found = self.built.get(row)
                walking = False
                if found is None:
                    found = self.built[row] = TableObjectSpec(self, row)
                    self._misses += 1
                    walking = self._misses == _WALKING
            if walking:
                self._build_rest()
        return found

    def _build_rest(self):
        """A caller walking the manifest: every spec made now in one pass, and
        ``get`` becomes the lookup of a dict (measured: a third of the per-call cost;
        the specs are two references each, made in a C-level loop)."""
        with self._lock, gc_paused():  # 20k new objects, none cyclic: no collections
            made = list(map(TableObjectSpec, itertools.repeat(self), range(len(self.names))))
            for row, spec_ in list(self.built.items()):  # specs handed out stay the ones
                made[row] = spec_
            self.built = dict(enumerate(made))
            self.get = dict(zip(self.names, made)).get  # shadows the method: one C call

    def format_of(self, name):
        row = self.index.get(name)
        return None if row is None else FORMATS[int(self.objects[FORMAT, row])]

    def view_of(self, name):
        """(numpy dtype, count, offset, shape) when object ``name`` is a plain raw view
        (formats/dense.py view_plan), else None."""
        return self.plain_view_table().get(name)

    def plain_view_table(self):
        """name -> view_of(name) for every object that is a plain view, computed on
        the first call over the columns: a reader handing out many zero-copy views
        then builds no spec at all."""
        views = self._views
        if views is None:
            rows = np.arange(len(self.names))
            storage, offsets, lengths, shapes, mask = self.plain_views(rows)
            names = map(self.names.__getitem__, np.flatnonzero(mask).tolist())
            views = self._views = {
                name: (dt, ln // dt.itemsize, off, shape)
                for name, dt, off, ln, shape in zip(
                    names, storage, offsets.tolist(), lengths.tolist(), shapes
                )
            }
        return views

    def plain_views(self, rows, shapes=True):
        """For object rows: (numpy storage dtypes, offsets, byte counts, shapes) of the
        plain raw views among them, and the mask of which rows those are.  Column form
        of formats/dense.py's view_plan (dense, raw, no logical type, not bf16 or bool,
        bytes already in host order); a test holds the two to the same answers."""
        comp_rows = self._plain_rows()[rows]
        mask = comp_rows >= 0
        chosen = self.comps[:, comp_rows[mask]]
        dtypes_ = [_VIEW_DTYPES[code] for code in chosen[DTYPE].tolist()]
        if shapes:
            shapes = list(map(self.shape_list().__getitem__, rows[mask].tolist()))
        return dtypes_, chosen[OFFSET], chosen[LENGTH], shapes, mask

    def _plain_rows(self):
        """Per object: the row of its data component when it is a plain raw view
        (see plain_views), else -1."""
        if self._plain is None:
            objects, comps = self.objects, self.comps
            data_of = self.data_component_rows()
            safe = np.maximum(data_of, 0)
            plain = (
                (objects[FORMAT] == DENSE)
                & (data_of >= 0)
                & (comps[ENCODING, safe] == ENCODINGS.index("raw"))
                & (comps[TYPE, safe] == NONE)
                & _VIEWABLE[comps[DTYPE, safe]]
            )
            self._plain = np.where(plain, data_of, -1)
        return self._plain

    def plain_spans(self, rows):
        """For object rows: the mask of those that are plain raw views (see
        plain_views), and the file offset and byte length of each such one."""
        comp_rows = self._plain_rows()[rows]
        mask = comp_rows >= 0
        chosen = self.comps[:, comp_rows[mask]]
        return mask, chosen[OFFSET], chosen[LENGTH]

    def view_table(self, base, rows=None, at=None):
        """A :class:`kernels.ViewTable` over the buffer ``base`` (a uint8 array):
        read_numpy's zero-copy hot path over the mapping when ``rows`` is None (every
        plain view at its file offset), or a batch read's owned arrays (the plain
        object ``rows``, each at byte ``at`` of ``base``).  Column work only: the
        buffer is typed once per dtype, and each row keeps the index of its typed
        array and its element span."""
        comp_rows = self._plain_rows()
        if rows is None:
            rows = np.flatnonzero(comp_rows >= 0)
            at = self.comps[OFFSET, comp_rows[rows]]
        if (comp_rows[rows] < 0).any():
            raise ValueError("view_table: every row must be a plain view")
        chosen = self.comps[:, comp_rows[rows]]
        codes, kind = np.unique(chosen[DTYPE], return_inverse=True)
        kind = kind.reshape(-1)
        views = [_VIEW_DTYPES[code] for code in codes.tolist()]
        typed = [np.frombuffer(base, dt, len(base) // dt.itemsize) for dt in views]
        sizes = np.array([dt.itemsize for dt in views] or [1], np.uint64)[kind]
        count = len(comp_rows)
        which = np.full(count, -1, np.int64)
        which[rows] = kind
        starts = np.zeros(count, np.uint64)
        stops = np.zeros(count, np.uint64)
        # file offsets and batch positions are multiples of 64: whole elements
        starts[rows] = np.asarray(at, np.uint64) // sizes
        stops[rows] = starts[rows] + chosen[LENGTH] // sizes
        objects = self.objects
        return kernels.ViewTable(
            self.index,
            typed,
            which,
            starts,
            stops,
            np.ascontiguousarray(objects[DIMS_START]),
            np.ascontiguousarray(objects[RANK]),
            self.dims,
        )

    def build(self, row, checker=None):
        """The spec of object ``row``, its attributes decoded now (errors name
        ``checker``'s path); its components are read from the tables when first
        used."""
        found = self.built.get(row)
        if found is not None:
            return found
        if self.shapes is None:
            self._columns()
        o = self.objects[:, row].tolist()
        attributes = {}
        if o[ATTRS_LEN]:
            path = checker.path if checker is not None else None
            attributes = _attributes(
                self.raw, o[ATTRS_OFF], o[ATTRS_LEN], "attributes", path, self.names[row]
            )
        spec_ = self.built[row] = TableObjectSpec(self, row, attributes)
        return spec_

    def shape_list(self):
        """The shape of every object, by row (made on first use, see _columns)."""
        if self.shapes is None:
            self._columns()
        return self.shapes

    def _columns(self):
        """Shapes, format names and data (storage, type) of every object, in one
        pass over the columns: a caller listing the manifest then pays one small
        object per spec.  Values repeat (a model has few distinct shapes and
        dtypes), so each distinct one is made once and the lists share it."""
        with self._lock:  # readers may share a Reader across threads
            if self.shapes is not None:
                return
            objects = self.objects
            self.formats = list(map(FORMATS.__getitem__, objects[FORMAT].tolist()))
            codes = self._data_codes()
            self.data_pairs = list(map(_PAIRS.__getitem__, codes))
            self.dtype_names = list(map(_DTYPE_NAMES.__getitem__, codes))
            # last: other threads take a set `shapes` to mean all columns are set
            self.shapes = _shape_list(objects[DIMS_START], objects[RANK], self.dims)

    def _data_codes(self):
        """Per object: the (dtype, type) code of its data component when dense (an
        index into _PAIRS), else -1 (whose entry is None)."""
        data_of = self.data_component_rows()
        safe = np.maximum(data_of, 0)
        codes = _pair_codes(self.comps[DTYPE, safe], self.comps[TYPE, safe])
        dense = (data_of >= 0) & (self.objects[FORMAT] == DENSE)
        return np.where(dense, codes, -1).tolist()

    def data_component_rows(self):
        """Per object: the row of its 'data' component, or -1."""
        data_of = np.full(self.objects.shape[1], -1, np.int64)
        data_rows = np.flatnonzero(self.comps[ROLE] == ROLES.index("data"))
        data_of[self.comps[OBJECT, data_rows].astype(np.int64)] = data_rows
        return data_of

    def components_of(self, row):
        """role -> ComponentSpec of object ``row``."""
        raw, components = self.raw, {}
        start, count = int(self.objects[COMPS_START, row]), int(self.objects[NCOMPS, row])
        rows = (
            [self.comps[:, start].tolist()]
            if count == 1
            else self.comps[:, start : start + count].T.tolist()
        )
        for c in rows:
            role = raw[c[ROLE_OFF] : c[ROLE_OFF] + c[ROLE_LEN]].decode("utf-8")
            storage, ltype, _ = _RESOLVED[c[DTYPE], len(TYPE_WORDS) if c[TYPE] == NONE else c[TYPE]]
            encoding = ENCODINGS[c[ENCODING]]
            digest = (
                raw[c[DIGEST_OFF] : c[DIGEST_OFF] + c[DIGEST_LEN]].decode("utf-8")
                if c[DIGEST_OFF]
                else None
            )
            components[role] = ComponentSpec(
                role,
                storage,
                ltype,
                c[OFFSET],
                c[LENGTH],
                encoding,
                None if encoding == "raw" else c[ULEN],
                digest,
            )
        return components


# after this many specs made one by one, the caller is taken to be walking the
# manifest and the rest are made in one pass
_WALKING = 64


class TableObjectSpec(ObjectSpec):
    """An :class:`ObjectSpec` read from the tables: name, shape, format and (for
    dense objects) dtype come from TableSpecs' per-object lists, so a spec is two
    references; ``components`` is built on first access.  Opening a file and
    listing every tensor's shape and dtype costs one small object per tensor."""

    # two slots set per spec; what is rarely set (components once built, attributes,
    # the reader's cached plan) lives in the instance dict, made only when set
    __slots__ = ("_specs", "_row", "__dict__")
    _components = None
    _attributes = None  # None: the object has none (decoded at open if any)
    plan = None

    def __init__(self, specs, row, attributes=None):
        self._specs, self._row = specs, row
        if attributes:  # decoded by TableSpecs.build; none: the class default
            self._attributes = attributes

    name = property(lambda self: self._specs.names[self._row])
    shape = property(lambda self: self._specs.shapes[self._row])
    format = property(lambda self: self._specs.formats[self._row])
    legacy = property(lambda self: None)  # v0.1 files never come through the tables

    @property
    def attributes(self):
        if self._attributes is None:
            self._attributes = {}
        return self._attributes

    @property
    def components(self):
        if self._components is None:
            self._components = self._specs.components_of(self._row)
        return self._components

    def _data(self):
        if self._components is not None:
            return None
        return self._specs.data_pairs[self._row]  # None unless dense

    @property
    def dtype(self):
        if self._components is None:  # the listing call: a name made in _columns
            name = self._specs.dtype_names[self._row]
            if name is not None:
                return name
        return ObjectSpec.dtype.__get__(self)

    @property
    def storage_dtype(self):
        data = self._data()
        return ObjectSpec.storage_dtype.__get__(self) if data is None else data[0]

    @property
    def type(self):
        data = self._data()
        return ObjectSpec.type.__get__(self) if data is None else data[1]
