"""Bytes in and out, below every format: bounds-checked sources (files, mappings,
URLs), one component's stored bytes <-> arrays (zstd, the seekable layout,
digests), storage elements <-> logical values, atomic replacement, uploads."""
