"""Per-machine tuning profiles written by ``talon tune`` and read by ``--budget auto``.

A profile is one JSON file ``<cache>/profiles/<target>--<draft>--<dtype>--t<temperature>--<hash>.json``
where ``<cache>`` is :func:`talon_sd.models.cache_dir` (``$TALON_SD_CACHE`` or ``~/.cache/talon-sd``)
and ``<hash>`` hashes the key::

    {"cpu": "<CPU model>", "isa": "avx2" | "avx512" | "avx512_bf16" | "amx" | "other",
     "threads": <torch threads>, "device": "cpu" | "cuda:<GPU name>",
     "target": "<model name>", "draft": "<model name>", "dtype": "bfloat16" | "float32" | ...,
     "temperature": 0.0 | <the sampling temperature the acceptance was calibrated at>}

The instruction-set class is part of the key because one CPU model name ("AMD EPYC") has served both
an AVX512-BF16 kind and an AVX2-only kind here, whose costs differ several-fold; a profile saved
before the key had it is not used. The temperature is part of the key because acceptance is: sampled drafts are accepted far less often
than greedy ones, so the best budget at temperature 1 is not the best greedy budget.

Profile file::

    {"format": 1, "key": {...}, "created", "machine", "versions", "settings": {...tune settings},
     "cost_curve": {"verify": {"T": s}, "draft": {"w": s}, "draft_root": {"w": s}},
     "ar": {AcceptancePoint, "predicted_tokens_per_s"} | null,
     "methods": {"talon": {"best": {TreeConfig fields}, "predicted_tokens_per_s",
                           "candidates": [{AcceptancePoint..., "predicted_tokens_per_s"}]}, ...}}

Lookup (:func:`find_profile`) wants the same key; otherwise it takes the profile of the same CPU,
device, models, dtype and decoding mode (greedy, or sampling) with the nearest temperature, then the
nearest thread count (ties: current format before older, newest first). A greedy profile never serves
a sampled run, nor the other way round. Profiles written before the key had a temperature count as
greedy. Saving merges with an existing profile of the same key (for a greedy key, also one written in the older format): methods
not re-tuned are kept.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib

from ..machine import key_file_stem, model_name  # noqa: F401 (re-exported)

PROFILE_FORMAT = 1


def cache_root() -> pathlib.Path:
    """:func:`talon_sd.models.cache_dir`, or the same rule when that module is unavailable."""
    try:
        from ..models import cache_dir

        return cache_dir()
    except (ImportError, AttributeError):
        configured = os.environ.get("TALON_SD_CACHE")
        return pathlib.Path(configured).expanduser() if configured else pathlib.Path.home() / ".cache" / "talon-sd"


def profiles_dir() -> pathlib.Path:
    return cache_root() / "profiles"


def dtype_name(dtype, device=None, quantize: str = "none") -> str:
    """``"auto"``/None resolved as the loader would (for ``quantize``); ``bf16`` -> ``bfloat16``; a torch.dtype ->
    its name."""
    import torch

    from .. import models

    if not isinstance(dtype, torch.dtype):
        dtype = models.resolve_dtype(dtype or "auto", models.resolve_device(device), quantize)
    return str(dtype).replace("torch.", "")


def profile_key(target: str | None, draft: str | None, dtype, device=None, threads: int | None = None,
                temperature: float = 0.0, quantize: str = "none") -> dict:
    """The key of the profile for this machine, model pair, dtype (``auto`` as a run with ``quantize`` loads it)
    and decoding temperature (0 = greedy)."""
    from .. import models
    from ..machine import machine_key

    resolved_device = models.resolve_device(device)
    return {**machine_key(resolved_device, threads), "target": model_name(target, "target"),
            "draft": model_name(draft, "draft"), "dtype": dtype_name(dtype, resolved_device, quantize),
            "temperature": float(temperature)}


def _temperature(key: dict) -> float:
    return float(key.get("temperature", 0.0))


def profile_path(key: dict) -> pathlib.Path:
    """Where the profile of ``key`` lives (a key without a temperature gets the older file name)."""
    temperature = [f"t{_temperature(key):g}"] if "temperature" in key else []
    return profiles_dir() / f"{key_file_stem(key, *temperature)}.json"


def _read(path: pathlib.Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == PROFILE_FORMAT else None


def find_profile(key: dict) -> tuple[dict, pathlib.Path] | None:
    """(profile, path) for ``key``: exact, else the same decoding mode (everything else equal) at the
    nearest temperature, then the nearest thread count, then a current-format key before an older
    one, then the newest; None if none."""
    path = profile_path(key)
    exact = _read(path)
    if exact is not None and exact.get("key") == key:
        return exact, path
    folder = profiles_dir()
    if not folder.is_dir():
        return None
    sampling = _temperature(key) > 0
    others = []
    for candidate in sorted(folder.glob("*.json")):
        data = _read(candidate)
        other = (data or {}).get("key") or {}
        if (other and all(other.get(k) == v for k, v in key.items() if k not in ("threads", "temperature"))
                and (_temperature(other) > 0) == sampling):
            distance = (abs(_temperature(other) - _temperature(key)),
                        abs(int(other.get("threads", 0)) - int(key["threads"])),
                        "temperature" not in other, -_created(data), candidate.name)
            others.append((distance, data, candidate))
    if not others:
        return None
    _, data, candidate = min(others, key=lambda item: item[0])
    return data, candidate


def _created(profile: dict) -> float:
    try:
        return datetime.datetime.fromisoformat(profile.get("created", "")).timestamp()
    except (TypeError, ValueError):
        return 0.0


def _previous(key: dict, path: pathlib.Path) -> dict | None:
    """The saved profile a new one of ``key`` merges with: same key, or for a greedy key the same
    key written in the older format (without a temperature)."""
    previous = _read(path)
    if previous is not None and previous.get("key") == key:
        return previous
    if _temperature(key) == 0:
        legacy_key = {k: v for k, v in key.items() if k != "temperature"}
        legacy = _read(profile_path(legacy_key))
        if legacy is not None and legacy.get("key") == legacy_key:
            return legacy
    return None


def save_profile(profile: dict, path: pathlib.Path | None = None) -> pathlib.Path:
    """Write ``profile`` atomically, keeping the methods of a previous profile of the same key that
    it does not re-tune (:func:`_previous`); returns its path."""
    path = path or profile_path(profile["key"])
    previous = _previous(profile["key"], path)
    if previous is not None:
        methods = {**previous.get("methods", {}), **profile.get("methods", {})}
        profile = {**profile, "methods": methods}
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(profile, indent=1) + "\n")
    os.replace(temporary, path)
    return path


def tune_command(key: dict) -> str:
    """The ``talon tune`` command that writes the profile of ``key``."""
    command = f"talon tune --target {key['target']} --draft {key['draft']} --dtype {key['dtype']} --threads {key['threads']}"
    return command + (f" --temperature {_temperature(key):g}" if _temperature(key) > 0 else "")
