"""Human-readable views of a results document: the terminal table and ``report.md``.

Both read only the results dict of :mod:`talon_sd.bench.results`, so a report can be rebuilt from a
saved ``results.json`` (``talon_sd.bench.report.write_markdown(json.load(...), folder, plots)``).
The markdown report carries the exact command, the machine, every variant's configuration, the
tables, per-depth acceptance, the plots (relative links) and the issue's goals as measured:
TALON vs EAGLE per dataset, TALON vs hf-assisted, and the share of wall time spent building trees,
with MAT, delta and the time split shown wherever TALON does not win.
"""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

from ..control import REASONS
from .results import ALL

GOAL_TALON_OVER_HF_ASSISTED = 1.6
GOAL_BUILD_SHARE = 0.05
GOAL_EAGLE_WINS = 5  # of the six datasets


def _fmt(value, pattern: str = "{:.2f}", missing: str = "-") -> str:
    return missing if value is None else pattern.format(value)


def _share(row: dict, part: str) -> float | None:
    return (row.get("time_share") or {}).get(part)


def _widths(row: dict, limit: int = 6) -> str:
    widths = row.get("mean_layer_width")
    if not widths:
        return "-"
    shown = "/".join(f"{w:.1f}" for w in widths[1:limit + 1])
    return shown + ("/…" if len(widths) > limit + 1 else "")


COLUMNS = (
    ("dataset", lambda r: r["dataset"]),
    ("method", lambda r: r["label"]),
    ("tok/s", lambda r: _fmt(r["tokens_per_s"])),
    ("speedup", lambda r: _fmt(r["speedup"], "{:.2f}x")),
    ("median", lambda r: _fmt(r["speedup_median"], "{:.2f}x")),
    ("same len", lambda r: _fmt(r.get("speedup_same_length"), "{:.2f}x")),
    ("MAT", lambda r: _fmt(r["mat"])),
    ("delta", lambda r: _fmt(r["delta"])),
    ("draft", lambda r: _fmt(_share(r, "draft"), "{:.0%}")),
    ("build", lambda r: _fmt(_share(r, "build"), "{:.1%}")),
    ("verify", lambda r: _fmt(_share(r, "verify"), "{:.0%}")),
    ("depth", lambda r: _fmt(r["mean_tree_depth"], "{:.1f}")),
    ("width d1/d2/...", _widths),
    ("same as ar", lambda r: _fmt(r["identical_to_ar"], "{:.0%}")),
)


def summary_table(rows: Sequence[dict]) -> str:
    """A fixed-width text table of summary rows, one blank line between datasets."""
    cells = [[name for name, _ in COLUMNS]] + [[str(cell(row)) for _, cell in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = []
    previous = None
    for index, line in enumerate(cells):
        dataset = rows[index - 1]["dataset"] if index else None
        if index > 1 and dataset != previous:
            lines.append("")
        previous = dataset
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _speedup_matrix(results: dict) -> str:
    rows = results["summary"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    index = {(r["dataset"], r["label"]): r for r in rows}
    body = []
    for dataset in datasets:
        line = [dataset]
        for label in labels:
            row = index.get((dataset, label))
            line.append("-" if row is None else f"{_fmt(row['speedup'], '{:.2f}x')} ({row['tokens_per_s']:.2f} tok/s)")
        body.append(line)
    return markdown_table(["dataset"] + [f"`{label}`" for label in labels], body)


def _details_table(rows: Sequence[dict]) -> str:
    body = [[str(cell(row)) for _, cell in COLUMNS] for row in rows]
    return markdown_table([name for name, _ in COLUMNS], body)


def _acceptance_table(rows: Sequence[dict], max_depth: int = 8) -> str:
    tree_rows = [r for r in rows if r.get("depth_acceptance")]
    if not tree_rows:
        return "_No tree method in this run._"
    depth = min(max_depth, max(len(r["depth_acceptance"]) for r in tree_rows))
    body = [[r["dataset"], r["label"]] + [_fmt(a, "{:.0%}") for a in r["depth_acceptance"][:depth]]
            + ["-"] * (depth - len(r["depth_acceptance"][:depth])) for r in tree_rows]
    return markdown_table(["dataset", "method"] + [f"d{d}" for d in range(1, depth + 1)], body)


def decision_lines(results: dict) -> list[str]:
    """Online-budget variants only: steps by the controller's reason (:data:`talon_sd.control.REASONS`) per
    dataset, then per request (budget chosen, tok/s and reasons), so a reading shows why a trial ran or not."""
    rows = [r for r in results["summary"] if r.get("reason_hist")]
    if not rows:
        return []
    seen = {reason for r in rows for reason in r["reason_hist"]}
    reasons = [reason for reason in REASONS if reason in seen] + sorted(seen - set(REASONS))
    lines = ["Steps by why the controller chose their budget (`" + "`, `".join(reasons) + "`; "
             "see `talon_sd.control.REASONS`):", "",
             markdown_table(["dataset", "method"] + reasons,
                            [[r["dataset"], r["label"]] + [str(r["reason_hist"].get(k, 0)) for k in reasons]
                             for r in rows])]
    body = []
    for sample in results.get("samples", []):
        stats = sample.get("stats") or {}
        if not stats.get("reason_hist"):
            continue
        budgets = stats.get("budgets") or [round(stats.get("mean_budget", 0))] * stats.get("target_forwards", 0)
        shown = ", ".join(f"{k} {n}" for k, n in sorted(stats["reason_hist"].items(), key=lambda kv: -kv[1]))
        body.append([sample["dataset"], f"{sample['question_id']}/{sample['turn']}", sample["label"],
                     str(sample["new_tokens"]), _fmt(sample["tokens_per_s"]), _fmt(stats.get("mean_budget"), "{:.1f}"),
                     " ".join(str(b) for b in _runs(budgets)) or "-", shown])
    lines += ["", "Per request (budgets: N per run of equal steps, `N×k`):", "",
              markdown_table(["dataset", "request/turn", "method", "tokens", "tok/s", "mean N", "budgets", "reasons"],
                             body)]
    return lines


def _runs(values: Sequence[int]) -> list[str]:
    """``[8, 8, 8, 16, 16, 1]`` -> ``['8×3', '16×2', '1']``."""
    runs: list[list] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return [f"{value}×{count}" if count > 1 else str(value) for value, count in runs]


def goal_lines(results: dict) -> list[str]:
    """The issue's goals, measured (never asserted): one markdown bullet each, plus explanations."""
    rows = results["summary"]
    index = {(r["dataset"], r["method"]): r for r in rows}
    datasets = [d for d in dict.fromkeys(r["dataset"] for r in rows) if d != ALL]
    lines = []
    talon_eagle = [(d, index[(d, "talon")], index[(d, "eagle")]) for d in datasets
                   if (d, "talon") in index and (d, "eagle") in index]
    if talon_eagle:
        wins = [d for d, t, e in talon_eagle if (t["speedup"] or 0) > (e["speedup"] or 0)]
        needed = min(GOAL_EAGLE_WINS, len(talon_eagle))
        verdict = "met" if len(wins) >= needed else "not met"
        lines.append(f"- TALON beats EAGLE on **{len(wins)} of {len(talon_eagle)}** datasets "
                     f"(goal: at least {needed}; {verdict}). Wins: {', '.join(wins) or 'none'}.")
    pooled = ALL if (ALL, "talon") in index else (datasets[0] if len(datasets) == 1 else None)
    if pooled and (pooled, "talon") in index and (pooled, "hf-assisted") in index:
        talon, assisted = index[(pooled, "talon")], index[(pooled, "hf-assisted")]
        ratio = talon["tokens_per_s"] / assisted["tokens_per_s"] if assisted["tokens_per_s"] else None
        verdict = "met" if ratio and ratio >= GOAL_TALON_OVER_HF_ASSISTED else "not met"
        lines.append(f"- TALON / hf-assisted tokens/s over all prompts: **{_fmt(ratio, '{:.2f}x')}** "
                     f"(goal: at least {GOAL_TALON_OVER_HF_ASSISTED}x; {verdict}).")
    builds = [(d, index[(d, "talon")]) for d in datasets if (d, "talon") in index]
    if builds:
        worst = max(_share(r, "build") or 0.0 for _, r in builds)
        verdict = "met" if worst < GOAL_BUILD_SHARE else "not met"
        lines.append(f"- TALON tree construction takes at most **{worst:.1%}** of wall time on any dataset "
                     f"(goal: under {GOAL_BUILD_SHARE:.0%}; {verdict}).")
    losses = []
    for dataset in datasets:
        talon = index.get((dataset, "talon"))
        rivals = [r for r in rows if r["dataset"] == dataset and r["method"] not in ("talon", "ar")
                  and r["speedup"] is not None]
        if talon is None or not rivals:
            continue
        winner = max(rivals, key=lambda r: r["speedup"])
        if (talon["speedup"] or 0) <= winner["speedup"]:
            shown = [talon, winner]
            if (dataset, "eagle") in index and winner["method"] != "eagle":
                shown.append(index[(dataset, "eagle")])
            losses.append((dataset, shown))
    if losses:
        lines += ["", "Where TALON is not the fastest (a step costs one verification plus delta draft forwards; "
                  "speedup follows MAT / step cost):", ""]
        body = []
        for dataset, shown in losses:
            for row in shown:
                body.append([dataset, row["label"], _fmt(row["speedup"], "{:.2f}x"), _fmt(row["mat"]),
                             _fmt(row["delta"]), _fmt(row["mean_tree_size"], "{:.1f}"),
                             _fmt(row["mean_tree_depth"], "{:.1f}"), _fmt(_share(row, "draft"), "{:.0%}"),
                             _fmt(_share(row, "build"), "{:.1%}"), _fmt(_share(row, "verify"), "{:.0%}")])
        lines.append(markdown_table(["dataset", "method", "speedup", "MAT", "delta", "tree size", "depth", "draft",
                                     "build", "verify"], body))
    return lines


def _variant_lines(results: dict) -> list[str]:
    lines = []
    for variant in results["variants"]:
        tree = variant.get("tree")
        if tree is None:
            detail = {"llamacpp": "llama.cpp plain decoding of the same GGUF (llama-cpp-python)",
                      "llamacpp-lookup": "llama.cpp with its prompt-lookup drafter (llama-cpp-python)",
                      "hf-assisted": "transformers generate with assistant_model = the draft"}.get(variant["method"],
                                                                                               "transformers generate")
        else:
            detail = ", ".join(f"{k}={v}" for k, v in tree.items() if k not in ("method", "static_paths") or v)
        lines.append(f"- `{variant['label']}`: {detail}" + (" (tuned profile)" if variant.get("tuned") else ""))
    if results["settings"].get("profile"):
        lines.append(f"- tuned options (`auto`) from the profile `{results['settings']['profile']}`")
    assistant = results["settings"].get("hf_assistant")
    if assistant:
        lines.append("- hf-assisted assistant settings (transformers defaults): "
                     + ", ".join(f"{k}={v}" for k, v in assistant.items()))
    return lines


def machine_lines(results: dict) -> list[str]:
    machine, versions, settings = results["machine"], results["versions"], results["settings"]
    return [
        f"- CPU: {machine['cpu']} ({machine['available_cores']} cores available, "
        f"{settings.get('threads', machine['torch_threads'])} torch threads, {machine['memory_gib']} GiB RAM"
        f"{', bf16 native' if machine.get('bf16_native') else ''}); GPU: {machine['cuda'] or 'none'}",
        f"- {machine['platform']}; Python {versions['python']}, torch {versions['torch']}, "
        f"transformers {versions['transformers']}, talon-sd {versions['talon_sd']}"
        + (f" ({versions['git_revision']})" if versions.get("git_revision") else ""),
        f"- target `{settings.get('target')}`, draft `{settings.get('draft')}`, dtype {settings.get('dtype')}, "
        f"device {settings.get('device')}, attention {settings.get('attn_implementation')}",
        f"- {settings['mode']} decoding (temperature {settings['temperature']}, seed {settings['seed']}), "
        f"{settings['max_new_tokens']} new tokens max, {settings['prompts']} prompts / {settings['samples']} "
        f"prompt turns, warm-up {settings.get('warmup_tokens', '?')} tokens per method; {settings['order']}"
        + (f"; every variant (ar too) ran {settings['repeats']} times per prompt turn, each keeping its median run"
           if settings.get("repeats", 1) > 1 else ""),
        f"- created {results['created']}; load average (1/5/15 min) before the run "
        f"{settings.get('load_average_before')}, after {machine.get('load_average')}"
        + ("" if settings.get("complete", True) else
           f"; **interrupted**: {settings['samples']} of {settings.get('planned_samples')} prompt turns"),
    ]


def write_markdown(results: dict, out_dir: pathlib.Path, plot_files: Sequence[pathlib.Path] = ()) -> pathlib.Path:
    """Write ``report.md`` for a bench results dict; plot links are relative to ``out_dir``."""
    rows = results["summary"]
    parts = [f"# talon {results['kind']}: results", ""]
    if results.get("command"):
        parts += ["Command:", "", "```", results["command"], "```", ""]
    parts += ["## Machine and settings", ""] + machine_lines(results) + ["", "Methods:", ""] + _variant_lines(results)
    parts += ["", "## Speedup over `ar` (tokens/s ratio; `ar` is our loop's plain decoding)", "", _speedup_matrix(results)]
    parts += ["", "## Details", "",
              "tok/s = new tokens / wall seconds (prefill included); median = median of per-prompt ratios to "
              "`ar`; same len = `ar`'s seconds over the method's at `ar`'s output lengths (each sample's prefill "
              "kept, the rest scaled by `ar`'s tokens over its own; the speedup where the outputs are as long); "
              "MAT = committed tokens per target forward (bonus included); delta = draft forwards per "
              "target forward; draft / build / verify = shares of wall time; width = mean nodes per depth "
              "per step; same as ar = greedy outputs identical to `ar`.", "", _details_table(rows)]
    parts += ["", "## Acceptance per depth", "",
              "P(the accepted path reaches depth d | the tree reaches depth d).", "", _acceptance_table(rows)]
    decisions = decision_lines(results)
    if decisions:
        parts += ["", "## Online budget decisions", ""] + decisions
    goals = goal_lines(results)
    if goals:
        parts += ["", "## Goals (measured, not asserted)", ""] + goals
    return _write_report(parts, out_dir, plot_files)


def write_sweep_markdown(results: dict, out_dir: pathlib.Path, plot_files: Sequence[pathlib.Path] = ()) -> pathlib.Path:
    """Write ``report.md`` for a sweep: speedup of every configuration on every dataset, best marked."""
    rows = results["summary"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    index = {(r["dataset"], r["label"]): r for r in rows}
    best: dict[tuple[str, str], str] = {}
    for (dataset, label), row in index.items():
        key = (dataset, row["method"])
        if row["speedup"] is not None and (key not in best or row["speedup"] > index[(dataset, best[key])]["speedup"]):
            best[key] = label
    body = []
    for label in labels:
        line = [f"`{label}`"]
        for dataset in datasets:
            row = index.get((dataset, label))
            cell = "-" if row is None else f"{_fmt(row['speedup'], '{:.2f}x')} (MAT {_fmt(row['mat'])}, δ {_fmt(row['delta'])})"
            if row is not None and best.get((dataset, row["method"])) == label and row["method"] != "ar":
                cell = f"**{cell}**"
            line.append(cell)
        body.append(line)
    parts = [f"# talon {results['kind']}: results", ""]
    if results.get("command"):
        parts += ["Command:", "", "```", results["command"], "```", ""]
    parts += ["## Machine and settings", ""] + machine_lines(results)
    parts += ["", "## Speedup over `ar` (best per method and dataset in bold)", "",
              markdown_table(["configuration"] + datasets, body)]
    decisions = decision_lines(results)
    if decisions:
        parts += ["", "## Online budget decisions", ""] + decisions
    return _write_report(parts, out_dir, plot_files)


def _write_report(parts: list[str], out_dir: pathlib.Path, plot_files: Sequence[pathlib.Path]) -> pathlib.Path:
    """Append the plot links (relative to ``out_dir``) and write ``out_dir/report.md``."""
    if plot_files:
        parts += ["", "## Plots", ""]
        for path in plot_files:
            relative = pathlib.Path(os.path.relpath(pathlib.Path(path).resolve(), out_dir.resolve()))
            parts += [f"![{relative.stem}]({relative.as_posix()})", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path
