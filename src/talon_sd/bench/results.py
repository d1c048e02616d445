"""Aggregate benchmark samples and write ``results.json`` (and ``outputs.jsonl``).

``results.json`` schema (``"schema": "talon-sd/bench/1"``)::

    {
      "schema": "talon-sd/bench/1",
      "kind": "bench" | "sweep",
      "command": str | null,            # the command line as typed (null from Python)
      "created": str,                   # UTC, ISO 8601
      "machine":  {"cpu", "logical_cores", "available_cores", "torch_threads", "memory_gib", "platform",
                   "cuda", "bf16_native", "load_average"},   # load average (1/5/15 min) when written
      "versions": {"python", "talon_sd", "torch", "transformers", "numpy", "tokenizers", "git_revision"},
      "settings": {                     # every run setting; the CLI adds its own arguments
        "mode": "greedy" | "sample", "temperature", "top_p": 1.0, "top_k": 0, "seed",
        "max_new_tokens", "threads", "dtype", "draft_dtype", "device", "attn_implementation",
        "target_parameters", "draft_parameters",
        "prompts", "samples",           # prompts, and prompt turns (MT-Bench counts 2 per prompt)
        "order", "conversation_reference",
        "hf_generation": {...},         # the GenerationConfig fields of the hf methods
        "hf_assistant": {...} | null,   # the assistant settings hf-assisted ran with
        # from the CLI: "datasets", "data_files", "limit", "warmup_tokens", "repeats" (timed runs per prompt
        # turn of every variant, ar too, each keeping its median run: "round_seconds" in each sample), "target",
        # "draft", "drafter", "requested_dtype",
        # "complete" (false when interrupted), "planned_samples", "resumed_samples" (prompt turns reloaded
        # from checkpoint.jsonl by --resume, timed by the earlier process), "load_average_before" (before the models
        # loaded), "profile" (the tuned profile file behind 'auto' variants, or null), "arguments" (every flag)
      },
      "variants": [{"label", "method", "tuned": bool,
                    "tree": {"method", "budget", "topk", "mu", "depth", "static_paths"} | null}],
      "summary": [                      # one row per dataset x variant, then dataset "all" (pooled)
        {"dataset", "label", "method", "samples", "new_tokens", "seconds",
         "tokens_per_s",                # sum of new tokens / sum of wall seconds
         "speedup",                     # tokens_per_s / ar's tokens_per_s on the same samples (for
                                        # equal output lengths, the ratio of total times)
         "speedup_median",              # median over samples of the per-sample tokens/s ratio to ar
         "speedup_same_length",         # ar's seconds over the variant's at ar's output lengths: each sample's
                                        # prefill plus its decoding seconds scaled by ar's new tokens over its own
                                        # (sampling ends answers at other lengths, and tokens/s then weighs a long
                                        # prompt's prefill by the length drawn); equals speedup where the outputs
                                        # are as long as ar's (greedy); null without prefill seconds (hf);
                                        # samples that wrote no token are left out
         "identical_to_ar",             # greedy: share of samples whose token ids equal ar's; else null
         # our loop's methods only (null for hf, hf-assisted):
         "mat", "delta",                # committed tokens / target forwards; draft forwards / target forwards
         "time_share": {"prefill", "draft", "build", "verify", "other"},   # shares of wall seconds
         "mean_tree_size", "mean_tree_depth",          # per verify step
         "mean_layer_width": [w0, w1, ...],            # mean nodes at depth 0 (root), 1, ... per step
         "depth_acceptance": [a1, a2, ...],            # P(accepted >= d | the tree reached depth d)
         "tree_depth_hist": {"d": steps},              # distribution of the tree depth per step
         "accepted_length_hist": {"k": steps}}         # drafts accepted per step
      ],
      "samples": [                      # one per prompt turn x variant: prompt turns in run order, variants
                                        # in listed order (the run order of variants rotates, see runner)
        {"index", "dataset", "question_id", "turn", "label", "method", "seed", "prompt_tokens",
         "new_tokens", "seconds", "tokens_per_s", "identical_to_ar",
         "stats": DecodeStats.to_dict() | null}
      ]
    }

``outputs.jsonl``: one line per sample, ``{"index", "dataset", "question_id", "turn", "label",
"text", "token_ids"}``, for reading what each method wrote.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import statistics
from collections import Counter, defaultdict
from typing import Sequence

from .methods import Decoding, Variant
from .runner import SampleRecord

SCHEMA = "talon-sd/bench/1"
ALL = "all"


def summarize(records: Sequence[SampleRecord], variants: Sequence[Variant], greedy: bool) -> list[dict]:
    """Summary rows, per dataset (in first-seen order) then pooled (``all``), variants in their order."""
    datasets = list(dict.fromkeys(r.dataset for r in records))
    groups: dict[tuple[str, str], list[SampleRecord]] = defaultdict(list)
    for record in records:
        groups[(record.dataset, record.label)].append(record)
        if len(datasets) > 1:
            groups[(ALL, record.label)].append(record)
    ar_label = next((v.label for v in variants if v.method == "ar"), None)
    rows = []
    for dataset in datasets + ([ALL] if len(datasets) > 1 else []):
        baseline = groups.get((dataset, ar_label)) if ar_label else None
        for variant in variants:
            group = groups.get((dataset, variant.label))
            if group:
                rows.append(_summary_row(dataset, variant, group, baseline, greedy))
    return rows


def _summary_row(dataset: str, variant: Variant, group: list[SampleRecord], baseline: list[SampleRecord] | None,
                 greedy: bool) -> dict:
    new_tokens = sum(r.new_tokens for r in group)
    seconds = sum(r.outcome.seconds for r in group)
    tokens_per_s = new_tokens / seconds if seconds > 0 else 0.0
    row = {
        "dataset": dataset, "label": variant.label, "method": variant.method, "samples": len(group),
        "new_tokens": new_tokens, "seconds": round(seconds, 4), "tokens_per_s": round(tokens_per_s, 4),
        "speedup": None, "speedup_median": None, "speedup_same_length": None,
        "identical_to_ar": None,
    }
    if baseline:
        base_tokens = sum(r.new_tokens for r in baseline)
        base_seconds = sum(r.outcome.seconds for r in baseline)
        if base_tokens and base_seconds > 0:
            row["speedup"] = round(tokens_per_s / (base_tokens / base_seconds), 4)
        base_rate = {(r.index, r.dataset): r.tokens_per_second for r in baseline}
        ratios = [r.tokens_per_second / base_rate[(r.index, r.dataset)] for r in group
                  if base_rate.get((r.index, r.dataset), 0) > 0]
        row["speedup_median"] = round(statistics.median(ratios), 4) if ratios else None
        row["speedup_same_length"] = _speedup_same_length(group, baseline)
    if greedy and all(r.identical_to_ar is not None for r in group):
        row["identical_to_ar"] = round(sum(bool(r.identical_to_ar) for r in group) / len(group), 4)
    row.update(_tree_metrics(group, seconds))
    return row


def _speedup_same_length(group: list[SampleRecord], baseline: list[SampleRecord]) -> float | None:
    """Sum of ar's seconds over the sum of the group's seconds at ar's lengths (``speedup_same_length`` above),
    over the samples both have and the group's sample wrote a token in; None where a sample has no prefill seconds
    (hf) or no pair is left. Everything after the prefill is scaled, a request's fixed costs too (a drafted request's
    first catch-up over its prompt): a short sampled answer with such a cost reads slower than it is."""
    if any(r.outcome.stats is None for r in group):
        return None
    base = {(r.index, r.dataset): r for r in baseline}
    pairs = [(r, base[(r.index, r.dataset)]) for r in group if (r.index, r.dataset) in base and r.new_tokens > 0]
    if not pairs:
        return None
    scaled = 0.0
    for record, ar in pairs:
        prefill = record.outcome.stats.seconds_prefill
        scaled += prefill + (record.outcome.seconds - prefill) * ar.new_tokens / record.new_tokens
    return round(sum(ar.outcome.seconds for _, ar in pairs) / scaled, 4) if scaled > 0 else None


def _tree_metrics(group: list[SampleRecord], seconds: float) -> dict:
    """MAT, delta, time split and tree shape pooled over the group's per-call stats (None for hf)."""
    stats = [r.outcome.stats for r in group]
    empty = {"mat": None, "delta": None, "time_share": None, "mean_tree_size": None, "mean_tree_depth": None,
             "mean_layer_width": None, "depth_acceptance": None, "tree_depth_hist": None,
             "accepted_length_hist": None, "reason_hist": None}
    if any(s is None for s in stats):
        return empty
    steps = sum(s.target_forwards for s in stats)
    if steps == 0:
        return empty
    parts = {
        "prefill": sum(s.seconds_prefill for s in stats), "draft": sum(s.seconds_draft for s in stats),
        "build": sum(s.seconds_build for s in stats), "verify": sum(s.seconds_verify for s in stats),
    }
    parts["other"] = max(seconds - sum(parts.values()), 0.0)
    widths = _summed([s.layer_width_sums for s in stats])
    reached, accepted = _summed([s.reached for s in stats]), _summed([s.accepted_at for s in stats])
    depth_hist = Counter(d for s in stats for d in s.tree_depths)
    length_hist, reason_hist = Counter(), Counter(r for s in stats for r in s.reasons if r)
    for s in stats:
        length_hist.update(s.accepted_lengths)
    return {
        "mat": round(sum(s.committed for s in stats) / steps, 4),
        "delta": round(sum(s.draft_forwards for s in stats) / steps, 4),
        "time_share": {k: round(v / seconds, 4) if seconds > 0 else 0.0 for k, v in parts.items()},
        "mean_tree_size": round(sum(sum(s.tree_sizes) for s in stats) / steps, 3),
        "mean_tree_depth": round(sum(sum(s.tree_depths) for s in stats) / steps, 3),
        "mean_layer_width": [round(w / steps, 3) for w in widths],
        "depth_acceptance": [round(a / r, 4) if r else 0.0 for a, r in zip(accepted, reached)],
        "tree_depth_hist": {str(d): n for d, n in sorted(depth_hist.items())},
        "accepted_length_hist": {str(k): n for k, n in sorted(length_hist.items())},
        "reason_hist": dict(sorted(reason_hist.items())) or None,  # online budgets: steps by the controller's reason
    }


def _summed(lists: list[list[int]]) -> list[int]:
    """Element-wise sum of lists of different lengths."""
    total: list[int] = []
    for values in lists:
        for i, value in enumerate(values):
            if i == len(total):
                total.append(0)
            total[i] += value
    return total


def sample_rows(records: Sequence[SampleRecord]) -> list[dict]:
    return [{
        "index": r.index, "dataset": r.dataset, "question_id": r.question_id, "turn": r.turn, "label": r.label,
        "method": r.method, "seed": r.seed, "prompt_tokens": r.prompt_tokens, "new_tokens": r.new_tokens,
        "seconds": round(r.outcome.seconds, 4), "tokens_per_s": round(r.tokens_per_second, 4),
        "identical_to_ar": r.identical_to_ar,
        "round_seconds": None if r.round_seconds is None else [round(x, 4) for x in r.round_seconds],
        "stats": r.outcome.stats.to_dict() if r.outcome.stats is not None else None,
    } for r in records]


def build_results(records: Sequence[SampleRecord], variants: Sequence[Variant], decoding: Decoding,
                  settings: dict, kind: str = "bench", command: str | None = None, generator=None) -> dict:
    """The results document (see the module docstring); ``settings`` adds to the recorded run settings."""
    from .machine import machine_info, model_settings, versions
    from .methods import assistant_settings, hf_settings

    run_settings = {
        "mode": "greedy" if decoding.greedy else "sample", "temperature": decoding.temperature,
        "top_p": 1.0, "top_k": 0, "seed": decoding.seed, "max_new_tokens": decoding.max_new_tokens,
        "prompts": len({(r.dataset, r.question_id) for r in records}),
        "samples": len({r.index for r in records}),
        "order": "interleaved: every variant per prompt turn, order rotated by one each turn",
        "conversation_reference": next((v.label for v in variants if v.method == "ar"), variants[0].label if variants else None),
    }
    if generator is not None:
        run_settings.update(model_settings(generator))
        run_settings["hf_generation"] = hf_settings(generator, decoding)
        run_settings["hf_assistant"] = assistant_settings(generator)
    run_settings.update(settings)
    return {
        "schema": SCHEMA, "kind": kind, "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(), "versions": versions(), "settings": run_settings,
        "variants": [v.describe() for v in variants],
        "summary": summarize(records, variants, decoding.greedy),
        "samples": sample_rows(records),
    }


def write_results(results: dict, records: Sequence[SampleRecord], out_dir: pathlib.Path) -> pathlib.Path:
    """Write ``results.json`` and ``outputs.jsonl`` into ``out_dir``; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(results, indent=1, default=_jsonable) + "\n")
    with open(out_dir / "outputs.jsonl", "w", encoding="utf-8") as stream:
        for r in records:
            stream.write(json.dumps({"index": r.index, "dataset": r.dataset, "question_id": r.question_id,
                                     "turn": r.turn, "label": r.label, "text": r.text,
                                     "token_ids": r.outcome.token_ids}, ensure_ascii=False) + "\n")
    return path


def _jsonable(value):
    """JSON fallback for tuples of tuples, torch dtypes, paths."""
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
