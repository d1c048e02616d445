"""What the online budget controller learned, kept between processes (issue 11: a fresh process must not
pay again for what the last one measured on the same machine).

A :class:`~talon_sd.generator.SpeculativeGenerator` carries its controllers from one call to the next
(:meth:`~talon_sd.generator.SpeculativeGenerator.controller_memory`); ``talon generate`` and ``talon serve``
run one process per command, so without this file each command would start afresh: first steps at the
initial budget, trials, plain-step measurements. On the AVX2-only EPYC of issue 11 (float32, where a
16-node verify costs 2.2x a plain step) README command (1) read 0.76x and 0.91x of plain decoding in two
fresh processes, while requests run after others in one process read 0.99x (docs/BENCHMARKS.md section
5, which also shows that this memory halved the draft seconds of later processes there but that their
wall-time ratios stayed within that machine's process-to-process noise). So the commands save the
carried controllers at exit and load them at start, for the same:

    machine (:func:`talon_sd.machine.machine_key`: CPU model and instruction-set class, torch
    threads, device), target, draft, dtype, whether the draft runs int8 (``--draft-quantization``: its forwards
    cost a third of float32's on the AVX2-only EPYC), torch and talon-sd versions

(:func:`memory_key`). Not the CPU kernels that ``--cpu-kernels auto`` picked: it times both at load,
and for the 0.5B draft on that EPYC its pick flipped between two processes in a row (packed and
default are close there), which would have split one machine's memory in two; the costs a memory
starts from are re-measured as the run goes anyway. Anything else finds no memory and starts afresh, as does a file written by
another layout of :class:`~talon_sd.control.BudgetController`. The file is
``<cache>/controllers/<target>--<draft>--<dtype>--<hash>.pkl`` (``<cache>``: :func:`talon_sd.models.cache_dir`),
a pickle read back by an unpickler that only builds the controller's own classes and plain containers
(never arbitrary callables). A cost measured under other load is corrected online: the controller
re-measures its verify costs every ``cost_refresh_interval`` steps (design 21 of :mod:`talon_sd.control`).

A command is another prompt: each loaded controller goes through
:meth:`~talon_sd.control.BudgetController.for_new_command` (design 27), which keeps the costs and, unless drafting
clearly paid, starts from plain decoding rather than from the last command's drafted choice.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
import sys
import tempfile
import warnings

from . import control
from .errors import TalonWarning

MEMORY_FORMAT = 3  # bump when what a memory file holds changes meaning (2: design 44's prompt measure in the pairs;
# 3: the controller's classes live in the modules of the talon_sd.control package)
_BUILTINS = {"set", "frozenset", "dict", "list", "tuple", "float", "int", "bool", "str", "complex"}
_COLLECTIONS = {"deque", "Counter", "OrderedDict"}


def memory_key(generator, target: str | None, draft: str | None) -> dict:
    """What a memory file must match to serve ``generator`` (``target`` / ``draft``: the names it was loaded
    from, as on the command line; None for the packaged defaults)."""
    import torch

    from . import __version__
    from .machine import machine_key, model_name

    return {**machine_key(generator.target.device),
            "target": model_name(target, "target"), "draft": model_name(draft, "draft"),
            "dtype": str(generator.target.dtype).replace("torch.", ""),
            "draft_int8": (getattr(generator, "cpu_kernels", None) or {}).get("draft") == "int8",
            "torch": str(torch.__version__), "talon_sd": str(__version__),
            "format": MEMORY_FORMAT}


def memory_path(key: dict) -> pathlib.Path:
    """Where the memory of ``key`` lives."""
    from .machine import key_file_stem
    from .models import cache_dir

    return cache_dir() / "controllers" / f"{key_file_stem(key)}.pkl"


def save_memory(generator, key: dict) -> pathlib.Path | None:
    """Write ``generator``'s carried controllers for ``key`` (atomically: a reader sees the old file or the
    new one). Returns the path, or None when there is nothing learned yet or the cache cannot be written
    (a :class:`TalonWarning` says why: a lost memory costs speed, never output)."""
    memory = generator.controller_memory()
    if not memory:
        return None
    path = memory_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as handle:
            pickle.dump({"key": key, "memory": memory}, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(handle.name, path)
    except OSError as error:
        warnings.warn(f"controller memory: cannot write {path} ({error}); the next run starts afresh",
                      TalonWarning, stacklevel=2)
        return None
    return path


def load_memory(key: dict) -> dict | None:
    """The carried controllers saved for ``key``, each made ready for a new command
    (:meth:`~talon_sd.control.BudgetController.for_new_command`), as a dict for
    :meth:`~talon_sd.generator.SpeculativeGenerator.restore_controller_memory`; or None: no file, a file of
    another key, or one this version cannot use (a :class:`TalonWarning` when the file is damaged)."""
    path = memory_path(key)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        warnings.warn(f"controller memory: cannot read {path} ({error}); starting afresh", TalonWarning, stacklevel=2)
        return None
    try:
        saved = _Unpickler(io.BytesIO(data)).load()
    except Exception as error:  # a damaged or foreign file: any unpickling error means the same
        warnings.warn(f"controller memory: {path} is not a memory file this version can read ({error}); "
                      "starting afresh", TalonWarning, stacklevel=2)
        return None
    if not isinstance(saved, dict) or saved.get("key") != key or not _valid(saved.get("memory")):
        return None
    return {kind: controller.for_new_command() for kind, controller in saved["memory"].items()}


def _valid(memory) -> bool:
    """A non-empty {(method, drafter, sampled): BudgetController} whose controllers have today's layout."""
    if not isinstance(memory, dict) or not memory:
        return False
    fresh = control.BudgetController()
    return all(isinstance(key, tuple) and len(key) == 3 and _same_layout(value, fresh) for key, value in memory.items())


def _same_layout(value, fresh, seen: set[int] | None = None) -> bool:
    """``value`` is of ``fresh``'s class with the same attributes, and so is every attribute of a class of
    :mod:`talon_sd.control` (settings, cost curves, calibration, predictability): a file written by a version
    whose settings lacked a field would otherwise load and fail at its first use. (Objects inside containers, the
    acceptance samples, are not compared.)"""
    seen = set() if seen is None else seen
    if id(fresh) in seen:
        return True
    seen.add(id(fresh))
    if type(value) is not type(fresh) or set(vars(value)) != set(vars(fresh)):
        return False
    return all(_same_layout(getattr(value, name), part, seen) for name, part in vars(fresh).items()
               if _controller_class(type(part).__module__, type(part).__name__) and hasattr(part, "__dict__"))


def _controller_class(module: str, name: str) -> type | None:
    """The class ``name`` defined in a module of the :mod:`talon_sd.control` package, or None (another module,
    not a class, or a class that module only imports)."""
    if not module.startswith(control.__name__ + "."):
        return None
    found = getattr(sys.modules.get(module), name, None)  # the package imports all of its modules
    return found if isinstance(found, type) and found.__module__ == module else None


class _Unpickler(pickle.Unpickler):
    """Builds only the controller's classes and plain containers."""

    def find_class(self, module: str, name: str):
        built = _controller_class(module, name)
        if built is not None:
            return built
        if (module == "builtins" and name in _BUILTINS) or (module == "collections" and name in _COLLECTIONS):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused to build {module}.{name}")
