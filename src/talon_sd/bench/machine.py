"""What a measurement ran on: machine, library versions, model settings.

Timings are a property of the machine, so every results file records :func:`machine_info` and
:func:`versions`. Which machine this is (CPU model, instruction-set class, device) and the key that tuned
budgets and the controller's memory are stored by live in the core :mod:`talon_sd.machine`, re-exported here.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import subprocess
import sys

import torch

from ..machine import cpu_isa, cpu_model, device_name, isa_of_cpuinfo, machine_key  # noqa: F401 (re-exported)


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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


def _weights(model) -> int:
    """Parameters, plus the weights oneDNN-packed linears keep as buffers and quantized linears keep packed; an int8 output
    head tied to the input embedding is its int8 copy, not parameters of its own, and is not counted again."""
    from ..lm import is_int8_linear
    from ..quantize import Int4Linear, Int8Linear

    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    head = model.get_output_embeddings() if tied and hasattr(model, "get_output_embeddings") else None
    quantized = sum(m.weight().numel() + (m.bias().numel() if m.bias() is not None else 0)
                    for m in model.modules() if is_int8_linear(m) and m is not head)
    quantized += sum(m.in_features * m.out_features + (m.bias.numel() if m.bias is not None else 0)
                     for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear)) and m is not head)
    return sum(p.numel() for p in model.parameters()) + quantized + sum(
        b.numel() for name, b in model.named_buffers() if name.endswith("weight") and b.is_mkldnn)
