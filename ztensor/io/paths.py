"""Local paths as the system resolves them.

``os.path.abspath`` and ``normpath`` remove ``link/..`` by string rules, while the
system goes through the link first: ``lk/../x.zt``, with ``lk`` a link to
``real/sub``, is ``real/x.zt`` to ``open`` and ``./x.zt`` to ``abspath``.  A writer
that computed its target by string rules replaced a different file from the one a
read of the same name opens, and a reader that looked for a model's neighbours
(ONNX external data, a checkpoint's config.json) looked in another folder.  Every
path whose folder matters is made absolute here.
"""

from __future__ import annotations

import os


def resolve_folder(path) -> str:
    """``path`` made absolute with its folder resolved as the system resolves it
    (links and ``..`` in order); its last name is kept as given, so a link there
    stays a link (a Hugging Face snapshot's weights are links into ``blobs/``, and
    their config.json is beside the link, not the blob)."""
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(os.path.realpath(folder or os.curdir), name)


def folder_of(path) -> str:
    """The folder that holds ``path``, as the system resolves it."""
    return os.path.dirname(resolve_folder(path))
