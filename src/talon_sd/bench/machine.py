"""What a measurement ran on: machine, library versions, model settings, and the machine key of profiles.

Timings are a property of the machine, so every results file records :func:`machine_info` and
:func:`versions`, and the tuned budgets of ``talon tune`` are stored per :func:`machine_key`.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import subprocess
import sys

import torch


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_isa() -> str:
    """The instruction-set class that decides this CPU's matmul costs: ``amx``, ``avx512_bf16``,
    ``avx512``, ``avx2`` or ``other`` (``other`` also off Linux, where /proc/cpuinfo is absent)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return "other"
    return isa_of_cpuinfo(text)


def isa_of_cpuinfo(cpuinfo: str) -> str:
    """:func:`cpu_isa` of a /proc/cpuinfo text (its first ``flags`` line)."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[-1].split())
            for name, needs in (("amx", "amx_bf16"), ("avx512_bf16", "avx512_bf16"), ("avx512", "avx512f"),
                                ("avx2", "avx2")):
                if needs in flags:
                    return name
            return "other"
    return "other"


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_name(device: torch.device | str) -> str:
    """``cpu``, or the GPU's name for ``cuda``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return device.type


def memory_gib() -> float | None:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_info() -> dict:
    """The machine as recorded in results files."""
    from ..models import cpu_has_fast_bfloat16

    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "available_cores": available_cores(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": memory_gib(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "bf16_native": cpu_has_fast_bfloat16(),
        "isa": cpu_isa(),
        "load_average": load_average(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages: above ~0.5 before a run, other processes share the CPU
    and timings (with threads = cores) can be far slower and noisier."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def versions() -> dict:
    """Versions of Python and of the libraries that decide the timings."""
    result = {"python": sys.version.split()[0]}
    for name in ("talon-sd", "torch", "transformers", "numpy", "tokenizers"):
        try:
            result[name.replace("-", "_")] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            result[name.replace("-", "_")] = None
    result["torch"] = torch.__version__
    result["git_revision"] = git_revision()
    return result


def git_revision() -> str | None:
    """The checkout's commit (``+dirty`` with local changes) when the package runs from a git tree."""
    folder = pathlib.Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=5)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def model_settings(generator) -> dict:
    """dtype, device, attention backend, CPU kernels and thread count a generator runs with."""
    target = generator.target_model
    return {
        "dtype": str(generator.target.dtype).replace("torch.", ""),
        "draft_dtype": str(generator.draft.dtype).replace("torch.", "") if generator.draft is not None else None,
        "device": str(generator.target.device),
        "attn_implementation": getattr(target.config, "_attn_implementation", None),
        "threads": torch.get_num_threads(),
        "cpu_kernels": dict(generator.cpu_kernels),
        "target_parameters": _weights(target),
        "draft_parameters": _weights(generator.draft_model)
        if generator.draft_model is not None else None,
    }


def machine_key(device: torch.device | str, threads: int | None = None) -> dict:
    """What makes timings comparable: CPU model and instruction-set class (two AMD EPYC kinds of this
    project's machines share the model name "AMD EPYC", one with AVX512-BF16, one with AVX2 only, and
    their float32 / bfloat16 costs differ several-fold), thread count, device."""
    return {"cpu": cpu_model(), "isa": cpu_isa(), "threads": threads or torch.get_num_threads(),
            "device": device_name(device)}


def _weights(model) -> int:
    """Parameters, plus the weights oneDNN-packed linears keep as buffers."""
    return sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for name, b in model.named_buffers() if name.endswith("weight") and b.is_mkldnn)
