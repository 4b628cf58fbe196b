"""OpenCV (``cv2``), imported so that the import leaves ``os.environ`` as it found it.

opencv-python's ``cv2/__init__.py`` prepends its library folder and a ``:`` to
``LD_LIBRARY_PATH`` (``PATH`` on Windows) in the importing process. packer imports OpenCV while a
call runs (the image reader, the transforms, the report), and README promises that a call leaves
the process as it found it: every subprocess a notebook or an orchestrator's worker started
afterwards inherited the variable, and its trailing empty element makes the dynamic loader search
the current folder. The variable does nothing for the process that set it (the loader reads it at
start-up), so it is put back as it was. Only the loader's variables: the non-headless wheels'
``QT_QPA_PLATFORM_PLUGIN_PATH`` and ``QT_QPA_FONTDIR`` are read when Qt starts, at the first
``cv2.imshow``, long after the import, so they stay as OpenCV set them. A process that imported
OpenCV before packer keeps what that import did: it is the caller's.

Every module of packer takes OpenCV from here (``from packer.opencv import cv2``), never with
``import cv2``: the first import of the process is whichever module loads first.
"""

from __future__ import annotations

import os

__all__ = ["cv2"]

_BEFORE = dict(os.environ)

import cv2  # noqa: E402  - after the snapshot of os.environ, which it changes

#: The variables the dynamic loader reads at a process's start (and OpenCV's import changes)
_LOADER_VARIABLES = ("LD_LIBRARY_PATH", "PATH")


def _restore(before: dict[str, str]) -> None:
    """Put back each of :data:`_LOADER_VARIABLES` that is not as ``before`` holds it."""
    for name in _LOADER_VARIABLES:
        was = before.get(name)
        if os.environ.get(name) != was:
            if was is None:
                del os.environ[name]
            else:
                os.environ[name] = was


_restore(_BEFORE)
del _BEFORE
