"""``talon tune``: measure this machine, calibrate acceptance, pick each method's options, build the profile.

Steps (the cost model is in :mod:`talon_sd.bench.tune`):

1. forward costs: target verification for :data:`~talon_sd.bench.tune.VERIFY_SIZES`, draft expansion
   for :data:`~talon_sd.bench.tune.DRAFT_WIDTHS`, draft root expansion for ``ROOT_WIDTHS``;
2. calibration of ``ar`` (the reference speed) and, per method, a :func:`coordinate_search` over its
   stages, each configuration decoded (greedy, or sampled at ``temperature`` with fixed seeds) on
   ``calibration_prompts`` prompts x ``calibration_tokens`` tokens with the real loop;
3. the profile dict (schema in :mod:`talon_sd.bench.profiles`), saved by the caller.

Run time is about (configurations + 1) x prompts x (prefill + tokens / speed) plus ~1 minute of
forward timings: with the CLI defaults (about 30 configurations, 3 prompts x 24 tokens greedy) about
10 minutes for the packaged Qwen pair in bfloat16 on 2 CPU cores; sampled (3 prompts x 64 tokens) about
21 minutes.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict, dataclass, field
from typing import Sequence

import torch

from ..config import TreeConfig
from .tune import (DEFAULT_STAGES, DRAFT_WIDTHS, ROOT_WIDTHS, VERIFY_SIZES, AcceptancePoint, ForwardCosts,
                   choose_budget, coordinate_search, count_configs, predicted_tokens_per_s, tuned_options)


@dataclass(frozen=True)
class TuneSettings:
    """What ``talon tune`` measures and how long it takes."""

    verify_sizes: tuple[int, ...] = VERIFY_SIZES
    draft_widths: tuple[int, ...] = DRAFT_WIDTHS
    root_widths: tuple[int, ...] = ROOT_WIDTHS
    context: int = 200  # cache length the forwards are timed on
    repeats: int = 5  # timed forwards per size (median)
    calibration_datasets: tuple[str, ...] = ("mt_bench", "gsm8k", "humaneval")
    calibration_prompts: int = 3
    calibration_tokens: int = 24
    tolerance: float = 0.0  # see choose_budget
    temperature: float = 0.0  # calibration decoding: 0 = greedy, > 0 samples (acceptance depends on it)
    seed: int = 0  # calibration prompt i samples with seed + i
    stages: dict = field(default_factory=lambda: dict(DEFAULT_STAGES))


def calibration_prompt_ids(generator, settings: TuneSettings) -> list[torch.Tensor]:
    """The first turn of prompt 0, 1, ... of the calibration datasets, taken round-robin."""
    from .datasets import load_prompts

    names = list(settings.calibration_datasets)
    per_set = -(-settings.calibration_prompts // len(names))
    prompts = load_prompts(names, limit=per_set)
    by_set = {name: [p for p in prompts if p.dataset == name] for name in names}
    chosen = [by_set[names[i % len(names)]][i // len(names)] for i in range(settings.calibration_prompts)]
    return [generator.encode_prompt([{"role": "user", "content": p.turns[0]}]) for p in chosen]


def measure_costs(generator, settings: TuneSettings, progress: bool = True) -> ForwardCosts:
    """Step 1: the forward cost curves of the generator's target and draft."""
    from tqdm import tqdm

    from .measure import measure_forward_costs

    jobs = [("verify", generator.target, settings.verify_sizes)]
    if generator.draft is not None:
        jobs += [("draft", generator.draft, settings.draft_widths), ("draft_root", generator.draft, settings.root_widths)]
    total = sum(len(set(sizes)) for _, _, sizes in jobs) * settings.repeats
    curves = {}
    with tqdm(total=total, desc="tune: forward costs", unit="fwd", file=sys.stderr, disable=not progress,
              dynamic_ncols=True, mininterval=1.0) as bar:
        for role, lm, sizes in jobs:
            curves[role] = measure_forward_costs(lm, sizes, role, settings.context, settings.repeats, tick=bar.update)
    return ForwardCosts(verify=curves["verify"], draft=curves.get("draft", {}), draft_root=curves.get("draft_root", {}))


def run_tune(generator, methods: Sequence[str], settings: TuneSettings, key: dict,
             prompt_ids: Sequence[torch.Tensor] | None = None, progress: bool = True) -> dict:
    """Steps 1-3; returns the profile dict. ``prompt_ids`` replaces the calibration prompts (tests).

    ``key`` (:func:`talon_sd.bench.profiles.profile_key`) must name the temperature the settings
    calibrate at: a profile is only ever used by runs of that decoding mode."""
    if float(key.get("temperature", 0.0)) != settings.temperature:
        raise ValueError(f"key temperature {key.get('temperature')} != settings.temperature {settings.temperature}")
    from tqdm import tqdm

    from .machine import machine_info, versions
    from .measure import calibrate

    cost = measure_costs(generator, settings, progress)
    prompts = list(prompt_ids) if prompt_ids is not None else calibration_prompt_ids(generator, settings)
    total = 1 + sum(count_configs(settings.stages[m]) for m in methods)
    with tqdm(total=total, desc="tune: calibration", unit="config", file=sys.stderr, disable=not progress,
              dynamic_ncols=True, mininterval=1.0) as bar:
        def calibrated(config: TreeConfig):
            bar.set_postfix_str(config.label)
            point = calibrate(generator, config, prompts, settings.calibration_tokens, settings.temperature,
                              settings.seed)
            bar.update(1)
            return point

        reference = calibrated(TreeConfig("ar"))
        results = {}
        for method in methods:
            choice = coordinate_search(method, settings.stages[method], cost, calibrated, settings.tolerance)
            results[method] = {
                "best": choice.options,
                "predicted_tokens_per_s": round(choice.tokens_per_s, 4),
                "candidates": [{**point.to_dict(), "predicted_tokens_per_s": round(rate, 4)}
                               for point, rate in choice.ranking],
            }
        bar.total = bar.n
        bar.refresh()
    from .profiles import PROFILE_FORMAT

    stages = {m: [[name, list(values)] for name, values in settings.stages[m]] for m in methods}
    return {
        "format": PROFILE_FORMAT, "key": key,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "versions": versions(),
        "settings": {**{k: v for k, v in asdict(settings).items() if k != "stages"}, "stages": stages,
                     "calibration_prompt_tokens": [int(p.numel()) for p in prompts]},
        "cost_curve": cost.to_dict(),
        "draft_kernels": (getattr(generator, "cpu_kernels", None) or {}).get("draft"),  # its draft curve's draft
        "ar": {**reference.to_dict(), "predicted_tokens_per_s": round(predicted_tokens_per_s(cost, reference), 4)},
        "methods": results,
    }


def profile_table(profile: dict) -> str:
    """Every calibrated configuration with its prediction, best of each method marked ``*``."""
    reference = (profile.get("ar") or {}).get("predicted_tokens_per_s") or 0.0
    header = f"{'method':8} {'options':32} {'MAT':>5} {'size':>5} {'delta':>5} {'pred tok/s':>10} {'speedup':>7} {'meas tok/s':>10}"
    lines = [header, "-" * len(header)]
    rows = [("ar", profile["ar"], True)] if profile.get("ar") else []
    for method, entry in profile["methods"].items():
        for candidate in entry["candidates"]:
            rows.append((method, candidate, candidate["options"] == entry["best"]))
    for method, row, best in rows:
        options = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in tuned_options(method, row["options"]).items())
        predicted = row["predicted_tokens_per_s"]
        measured = row.get("measured_tokens_per_s")
        lines.append(f"{method:8} {(options or '-'):32} {row['mat']:5.2f} {row['mean_tree_size']:5.1f} "
                     f"{row['delta']:5.2f} {predicted:10.2f} {predicted / reference if reference else 0:6.2f}x "
                     f"{measured if measured is not None else float('nan'):10.2f}{' *' if best and method != 'ar' else ''}")
    return "\n".join(lines)


def best_choice(profile: dict, method: str):
    """Re-derive the choice of ``method`` from a saved profile (pure; for reports and checks)."""
    cost = ForwardCosts.from_dict(profile["cost_curve"])
    points = [AcceptancePoint.from_dict(c) for c in profile["methods"][method]["candidates"]]
    return choose_budget(cost, points, profile.get("settings", {}).get("tolerance", 0.0))
