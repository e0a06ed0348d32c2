"""Loading neuron_lab's compiled extensions, which the package build made (``hatch_build.py``).

Some of the device contract is only reachable from C++: PyTorch looks up a backend's streams and
events through ``c10::impl::DeviceGuardImplInterface`` (``csrc/guard.cpp``), pinned memory and
generators through the PrivateUse1 hooks (``csrc/hooks.cpp``), and the eager path's kernel runs
in C++ (``csrc/direct.cpp``). The device's sources build into ``neuron_lab.device._device_ext``;
the runtime's (``runtime/csrc``) into ``neuron_lab.runtime._runtime_ext``, loaded through
``extension`` here too. ``csrc/python_objects.h`` holds the CPython helpers both share.

The extensions are compiled by ``pip install`` (wheel or editable), never at import. They link
against libtorch, whose C++ ABI changes between minor releases, so the build records the torch it
was built against (``neuron_lab/_native_build.json``); loading checks it against the running
torch, and any failure (a missing file, an unresolved symbol, another torch) raises
``NativeLibraryError`` (an ``ImportError``) naming the cause and the fix. In a checkout whose C++
sources changed since the last build, loading warns once and names the rebuild command.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import warnings
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
PACKAGE = Path(__file__).resolve().parent.parent
BUILD_INFO = PACKAGE / "_native_build.json"
DEVICE_MODULE = "neuron_lab.device._device_ext"

REBUILD = ("reinstall neuron_lab against the installed torch: `pip install --no-build-isolation "
           "--force-reinstall --no-deps neuron_lab` (in a checkout: `pip install "
           "--no-build-isolation -e .`, which scripts/setup.sh runs)")


class NativeLibraryError(ImportError):
    """neuron_lab's compiled extension cannot be loaded into this process."""


_modules: dict[str, object] = {}
_checked = False


def _minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def build_info() -> dict | None:
    """What the build recorded (torch, python, sources digest, modules), or None if absent."""
    try:
        return json.loads(BUILD_INFO.read_text())
    except (OSError, ValueError):
        return None


def _sources_digest() -> str | None:
    """``hatch_build.sources_digest`` recomputed, when the sources are here (a checkout; a wheel
    ships no C++): each extension's sources, then the headers on its include path."""
    dev, rt = CSRC, PACKAGE / "runtime" / "csrc"
    if not (dev.is_dir() and rt.is_dir()):
        return None
    files = [*sorted(dev.glob("*.cpp")), *sorted(dev.glob("*.h")),
             *sorted(rt.glob("*.cpp")), *sorted([*rt.glob("*.h"), *dev.glob("*.h")])]
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(PACKAGE.parent).as_posix().encode() + b"\0" + p.read_bytes()
                 + b"\0")
    return h.hexdigest()[:16]


def _check_build() -> None:
    """Raise if the build is missing or for another torch; warn if its sources changed."""
    global _checked
    if _checked:
        return
    info = build_info()
    if info is None:
        raise NativeLibraryError(
            f"neuron_lab: the compiled extension is missing ({BUILD_INFO.name} not found in "
            f"{PACKAGE}): the package was not built. Fix: {REBUILD}.")
    if _minor(info["torch"]) != _minor(torch.__version__):
        raise NativeLibraryError(
            f"neuron_lab: the compiled extension was built for torch {info['torch']}, and this "
            f"process runs torch {torch.__version__} (the C++ ABI differs between minor "
            f"releases). Fix: {REBUILD}.")
    digest = _sources_digest()
    if digest is not None and digest != info.get("sources"):
        warnings.warn(
            "neuron_lab: the C++ sources under neuron_lab/*/csrc changed since the compiled "
            "extension was built, which still runs the old code; rebuild with `pip install "
            "--no-build-isolation -e .`", RuntimeWarning, stacklevel=3)
    _checked = True


def extension(module: str):
    """The compiled extension ``module`` (imported once), or ``NativeLibraryError``."""
    mod = _modules.get(module)
    if mod is not None:
        return mod
    _check_build()
    try:
        mod = importlib.import_module(module)
    except ImportError as e:       # a missing file, an unresolved symbol (another libtorch)
        raise NativeLibraryError(
            f"neuron_lab: the compiled extension {module} cannot be loaded: {e}. Fix: "
            f"{REBUILD}.") from e
    _modules[module] = mod
    return mod


def load():
    """The device's extension module."""
    return extension(DEVICE_MODULE)
