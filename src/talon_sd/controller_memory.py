"""What the budget controllers learned, kept between processes as a small JSON file, so that a new ``talon
generate`` or ``talon serve`` does not pay again for what the last one measured on this machine:
``<cache>/controllers/<target>--<draft>--<dtype>--<hash>.json`` = ``{"key", "controllers": [{"method", "drafter",
"sampled", "state"}]}``, each state a :meth:`~talon_sd.control.BudgetController.to_dict`. A file of another key
(:func:`memory_key`), version or shape is ignored (a damaged one with a warning): a lost memory costs speed, never
output."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import warnings

from .control import BudgetController
from .errors import TalonWarning


def memory_key(generator, target: str | None, draft: str | None) -> dict:
    """What a memory must match: machine, models (as named; None = the packaged pair), dtype, kernels, versions."""
    import torch

    from . import __version__
    from .machine import machine_key, model_name

    return {**machine_key(generator.target.device), "target": model_name(target, "target"),
            "draft": model_name(draft, "draft"), "dtype": str(generator.target.dtype).replace("torch.", ""),
            "kernels": "/".join(map(str, (getattr(generator, "cpu_kernels", None) or {}).values())),  # e.g. int4/int4
            "torch": str(torch.__version__), "talon_sd": str(__version__), "format": "json-1"}


def memory_path(key: dict) -> pathlib.Path:
    from .machine import key_file_stem
    from .models import cache_dir
    return cache_dir() / "controllers" / f"{key_file_stem(key)}.json"


def save_memory(generator, key: dict) -> pathlib.Path | None:
    """Write ``generator``'s carried controllers atomically; the path, or None (nothing learned, or not writable)."""
    rows = [{"method": m, "drafter": d, "sampled": s, "state": c.to_dict()}
            for (m, d, s), c in generator.controller_memory().items()]
    path = memory_path(key)
    try:
        if rows:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as handle:
                json.dump({"key": key, "controllers": rows}, handle)
            os.replace(handle.name, path)
            return path
    except OSError as error:
        warnings.warn(f"controller memory: cannot write {path} ({error}); the next run starts afresh", TalonWarning)
    return None


def load_memory(key: dict) -> dict | None:
    """{(method, drafter, sampled): BudgetController} saved for ``key``, or None."""
    path = memory_path(key)
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or saved.get("key") != key:
            return None
        return {(row["method"], row["drafter"], bool(row["sampled"])): BudgetController.from_dict(row["state"])
                for row in saved["controllers"]} or None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        warnings.warn(f"controller memory: cannot use {path} ({error!r}); starting afresh", TalonWarning)
        return None
