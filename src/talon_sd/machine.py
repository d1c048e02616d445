"""Which machine this process runs on, and the names keyed by it.

Timings are a property of the machine: ``talon tune`` profiles (:mod:`talon_sd.bench.profiles`) and the online
controller's memory (:mod:`talon_sd.controller_memory`) are stored per :func:`machine_key` and model pair, in
files named by :func:`key_file_stem`. ``--dtype auto`` reads the CPU's instruction-set class
(:func:`isa_of_cpuinfo`). Benchmark records (:mod:`talon_sd.bench.machine`) build on the same functions.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import platform
import re

import torch

from .config import DEFAULT_DRAFT, DEFAULT_TARGET


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> set[str]:
    """This CPU's feature flags (the first ``flags`` line of /proc/cpuinfo; empty off Linux)."""
    try:
        return flags_of_cpuinfo(pathlib.Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return set()


def flags_of_cpuinfo(cpuinfo: str) -> set[str]:
    """The feature flags of a /proc/cpuinfo text (its first ``flags`` line; empty where there is none)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[-1].split())
    return set()


def cpu_isa() -> str:
    """The instruction-set class that decides this CPU's matmul costs: ``amx``, ``avx512_bf16``,
    ``avx512``, ``avx2`` or ``other`` (``other`` also off Linux, where /proc/cpuinfo is absent)."""
    return _isa_of_flags(cpu_flags())


def isa_of_cpuinfo(cpuinfo: str) -> str:
    """:func:`cpu_isa` of a /proc/cpuinfo text (its first ``flags`` line)."""
    return _isa_of_flags(flags_of_cpuinfo(cpuinfo))


def _isa_of_flags(flags: set[str]) -> str:
    for name, needs in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"), ("avx2", "avx2")):
        if needs in flags:
            return name
    return "other"


def device_name(device: torch.device | str) -> str:
    """``cpu``, or the GPU's name for ``cuda``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def machine_key(device: torch.device | str, threads: int | None = None) -> dict:
    """What makes timings comparable: CPU model and instruction-set class (two AMD EPYC kinds of this
    project's machines share the model name "AMD EPYC", one with AVX512-BF16, one with AVX2 only, and
    their float32 / bfloat16 costs differ several-fold), thread count, device."""
    return {"cpu": cpu_model(), "isa": cpu_isa(), "threads": threads or torch.get_num_threads(),
            "device": device_name(device)}


def model_name(name: str | None, role: str) -> str:
    """The name a key records for a model: the default model for None, an absolute path for local files."""
    if name is None:
        return DEFAULT_TARGET if role == "target" else DEFAULT_DRAFT
    path = pathlib.Path(name).expanduser()
    if path.exists():
        return str(path.resolve())
    return name


def key_file_stem(key: dict, *extra: str) -> str:
    """A file name (no suffix) for a machine/model ``key``: target, draft, dtype, ``extra`` and a digest of
    the whole key, readable and safe on every file system (profiles, the controller memory)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    parts = [pathlib.Path(key["target"]).name, pathlib.Path(key["draft"]).name, key["dtype"], *extra, digest]
    return "--".join(re.sub(r"[^A-Za-z0-9._-]+", "_", part) for part in parts)
