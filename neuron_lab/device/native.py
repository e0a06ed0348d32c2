"""Native extensions: the device's (every ``neuron_lab/device/csrc/*.cpp`` built into one module)
and any other layer's (``build(name, csrc_dir)``; the runtime's deferral hot path is one).

Some of the device contract is only reachable from C++: PyTorch looks up a backend's streams and
events through ``c10::impl::DeviceGuardImplInterface`` (``csrc/guard.cpp``), and a Python
PrivateUse1 backend can only register a guard that knows its device type. The files are small
and include only c10, CPython and pybind11 headers, so the build takes seconds, not a full
``torch/extension.h`` compile. ``csrc/python_objects.h`` holds the CPython helpers every
extension's C callables share.

Convention (every extension): ``csrc/NAME.cpp`` defines
``void neuron_lab::init_NAME(pybind11::module_&)``, which adds its functions to the module;
``build`` generates the ``PYBIND11_MODULE`` that calls every ``init_*``. Each is built once with
``torch.utils.cpp_extension.load`` (needs a C++ compiler and ninja, both installed by
``scripts/setup.sh``/the package's dependencies) and cached under
``~/.cache/neuron_lab/native/<hash>``, the hash covering the sources, the headers it can
include, the torch version and the Python version, so worktrees and versions never share a stale
build.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
_lock = threading.Lock()
_modules: dict = {}                  # csrc directory -> built module
_errors: dict = {}                   # csrc directory -> the build's exception


def _sources(csrc: Path) -> list[Path]:
    return sorted(csrc.glob("*.cpp"))


def _entry(sources: list[Path]) -> str:
    names = [p.stem for p in sources]
    decls = "".join(f"void init_{n}(pybind11::module_&);\n" for n in names)
    calls = "".join(f"  neuron_lab::init_{n}(m);\n" for n in names)
    return ("#include <pybind11/pybind11.h>\n"
            f"namespace neuron_lab {{\n{decls}}}\n"
            f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{calls}}}\n")


def _key(files: list[Path], entry: str) -> str:
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(entry.encode() + torch.__version__.encode() + sys.version.encode())
    return h.hexdigest()[:16]


def _ninja_on_path() -> None:
    """The ``ninja`` wheel puts its binary next to the venv's Python, which is not on PATH when
    the venv's interpreter is run without activating it."""
    try:
        import ninja
        bindir = ninja.BIN_DIR
    except (ImportError, AttributeError):
        bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if bindir not in path.split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + path


def load():
    """The device's extension module (built on first use, then loaded from the cache)."""
    return build("neuron_lab_native", CSRC)


def build(name: str, csrc: Path, includes: tuple[Path, ...] = ()):
    """The extension built from ``csrc/*.cpp`` (on first use; then from the cache). ``name``
    prefixes the module's name, which also carries the hash of the sources and of the headers
    of ``csrc`` and ``includes`` (directories on the include path: the device's ``csrc``
    holds headers other extensions share)."""
    mod = _modules.get(csrc)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(csrc)
        if mod is not None:
            return mod
        err = _errors.get(csrc)
        if err is not None:
            raise RuntimeError(f"neuron: the native extension {name} failed to build earlier: {err}")
        from torch.utils import cpp_extension
        dirs = [csrc, *includes]
        sources = _sources(csrc)
        entry = _entry(sources)
        key = _key(sources + sorted(h for d in dirs for h in d.glob("*.h")), entry)
        out = Path(os.path.expanduser("~")) / ".cache" / "neuron_lab" / "native" / key
        out.mkdir(parents=True, exist_ok=True)
        main = out / "neuron_lab_module.cpp"
        if not main.exists() or main.read_text() != entry:
            main.write_text(entry)
        _ninja_on_path()
        try:
            mod = cpp_extension.load(
                name=f"{name}_{key}", sources=[str(main)] + [str(p) for p in sources],
                build_directory=str(out), extra_cflags=["-O2"],
                extra_include_paths=[str(d) for d in dirs], verbose=False)
        except Exception as e:          # a missing compiler: say so once, clearly
            _errors[csrc] = e
            raise RuntimeError(
                f"neuron: building the native extension {name} "
                f"({', '.join(p.name for p in sources)}) in {out} failed: {e}. It needs a C++ "
                f"compiler (g++) and ninja (pip install ninja); scripts/setup.sh installs "
                f"both.") from e
        _modules[csrc] = mod
        return mod
