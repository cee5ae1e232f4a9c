"""The names code written against the reference implementation imports from its
native module (``ztensor._ztensor``), so that code keeps running.

* ``_Reader``: in the reference, the object that owns a file's mapping and that
  zero-copy arrays keep alive through their ``base``.  Here that object is the
  memory map itself, so ``_Reader`` is :class:`mmap.mmap`:
  ``any(isinstance(b, _Reader) for b in base chain)`` tells a zero-copy array from
  a copy exactly as it did there.
* ``remove_tensors``, ``replace_tensor``: see :mod:`ztensor.container.edit`.
"""

from mmap import mmap as _Reader  # noqa: F401 - re-exported for compatibility

from ztensor.container.edit import remove_tensors, replace_tensor  # noqa: F401

__all__ = ["_Reader", "remove_tensors", "replace_tensor"]
