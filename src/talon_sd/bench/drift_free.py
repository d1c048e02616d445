"""A finished bench or sweep repriced at one set of costs: the methods' decisions without the host's drift.

On a shared 2-core host the same computation runs up to 15-30% slower in spells (docs/BENCHMARKS.md
section 5), and a sweep's variants of one prompt turn run minutes apart, so a per-dataset ratio of 5 requests
moves by several percent between runs of identical code. What the methods decided is exact and recorded:
every request's verify steps and their tree sizes (``stats["budgets"]``), its draft forwards and its prompt.
This script fits ONE linear cost model to all requests of the run by least squares (non-negative terms
only, dropping any that fit negative),

    verify seconds = v_step x steps + v_node x sum(tree sizes) + v_ctx x sum(tree sizes) x mean context
                     + v_square x sum(tree sizes squared)
    draft seconds  = d_forward x draft forwards + d_node x sum(drafted tree sizes) + d_catch x prompt tokens (if drafted)
                     + d_step x drafted steps

and reprices every request at it (prefill, tree building and the loop's other seconds kept as measured: a median 7.5%
of a request in sweep 28, a fifth on long summary prompts, so their drift stays in). Without the two last terms the
fit priced small trees high in every bf16 sweep (N = 8's measured over modelled seconds 0.957-0.988 over 7 runs;
0.967-1.001 with them). The identification rests on the variants of a prompt turn meeting the same spells (the
sweep rotates their order every turn): drift that followed one variant through a whole run would be read as a cost of
its tree sizes.

It prints, per dataset, each variant's speedup over ``ar`` measured and modelled, auto over the best fixed
column both ways, and each variant's measured / modelled seconds (drift or an unmodelled cost that hit one
variant more than the others shows there). The model is a linear fit of one run, not a replay: the
controller's choices were made on the measured, drifting costs; this only asks what those choices cost on a
steady machine.

    python scripts/drift_free.py docs/bench/sweep-int8-greedy/results.json [--auto-label 'talon(N=auto,K=4,mu=0.03)']
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from .datasets import DATASETS


def request_terms(sample: dict) -> tuple[list[float], list[float]]:
    """The verify and draft regressors of one request (see the module docstring)."""
    stats = sample["stats"]
    # one per verify step (1 = a plain step); fixed budgets record only the histogram
    budgets = [int(b) for b in stats["budgets"]] or [int(size) for size, count in (stats.get("budget_hist") or {}).items()
                                                     for _ in range(int(count))]
    context = int(sample["prompt_tokens"]) + int(sample["new_tokens"]) / 2  # the mean cache length over the answer
    drafted = [b for b in budgets if b > 1]
    forwards = int(stats["draft_forwards"])
    verify = [len(budgets), float(sum(budgets)), float(sum(budgets)) * context, float(sum(b * b for b in budgets))]
    draft = [forwards, float(sum(drafted)), float(sample["prompt_tokens"]) if forwards else 0.0, float(len(drafted))]
    return verify, draft


def fit_nonnegative(rows: list[list[float]], targets: list[float]) -> np.ndarray:
    """Least squares with every coefficient >= 0: refit without the terms that came out negative."""
    matrix, y = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    keep = list(range(matrix.shape[1]))
    while True:
        if not keep:
            raise SystemExit("results: every cost term fits negative (too few requests, or no time in them)")
        coefficients = np.zeros(matrix.shape[1])
        solution, *_ = np.linalg.lstsq(matrix[:, keep], y, rcond=None)
        coefficients[keep] = solution
        negative = [k for k in keep if coefficients[k] < 0]
        if not negative:
            return coefficients
        keep = [k for k in keep if k not in negative]


@dataclass
class Repriced:
    """What :func:`reprice` found: the fitted coefficients (seconds per regressor of :func:`request_terms`) and,
    per (dataset or "all", label), [committed tokens, measured seconds, modelled seconds] over the priced requests."""

    verify: np.ndarray  # [4]: s per step, per node, per node x context token, per squared node count
    draft: np.ndarray  # [4]: s per forward, per drafted node, per prompt token of a drafted request, per drafted step
    totals: dict[tuple[str, str], list[float]]
    labels: list[str]
    priced: int
    fitted: int

    def speedups(self, dataset: str) -> dict[str, tuple[float, float]]:
        """label -> (measured, modelled) speedup over ``ar`` on ``dataset`` (labels without requests there left out)."""
        base_tokens, base_seconds, base_modelled = self.totals[(dataset, "ar")]
        out = {}
        for label in self.labels:
            tokens, seconds, modelled = self.totals.get((dataset, label), (0, 0.0, 0.0))
            if tokens:
                out[label] = (tokens / seconds / (base_tokens / base_seconds),
                              tokens / modelled / (base_tokens / base_modelled))
        return out


def reprice(results: dict, same_length: bool = False) -> Repriced:
    """Fit the cost model to every request of ``results`` (a results.json document) and reprice them; with
    ``same_length`` only the prompt turns whose variants all committed as many tokens are priced."""
    samples = [s for s in results["samples"]
               if s.get("stats") and (s["stats"].get("budgets") or s["stats"].get("budget_hist"))]
    if not any(s["label"] == "ar" for s in samples):
        raise SystemExit("results: no 'ar' requests to take speedups against")
    terms = [request_terms(sample) for sample in samples]
    lengths = defaultdict(set)  # prompt turn -> the answer lengths of its variants
    for sample in samples:
        lengths[(sample["dataset"], sample["question_id"], sample["turn"])].add(int(sample["new_tokens"]))
    verify_rows, draft_rows, verify_y, draft_y = [], [], [], []
    for sample, (verify, draft) in zip(samples, terms):
        verify_rows.append(verify)
        verify_y.append(float(sample["stats"]["seconds_verify"]))
        if draft[0] > 0:
            draft_rows.append(draft)
            draft_y.append(float(sample["stats"]["seconds_draft"]))
    v = fit_nonnegative(verify_rows, verify_y)
    d = fit_nonnegative(draft_rows, draft_y) if draft_rows else np.zeros(4)
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    priced = [(s, t) for s, t in zip(samples, terms)
              if not same_length or len(lengths[(s["dataset"], s["question_id"], s["turn"])]) == 1]
    for sample, (verify, draft) in priced:
        stats = sample["stats"]
        parts = [float(stats[f"seconds_{part}"]) for part in ("prefill", "draft", "build", "verify")]
        other = max(float(stats.get("seconds_total", sum(parts))) - sum(parts), 0.0)  # the loop's own bookkeeping
        modelled = (parts[0] + parts[2] + other
                    + float(np.dot(v, verify)) + (float(np.dot(d, draft)) if draft[0] > 0 else 0.0))
        for dataset in (sample["dataset"], "all"):
            row = totals[(dataset, sample["label"])]
            row[0] += int(sample["new_tokens"])
            row[1] += float(sample["seconds"])
            row[2] += modelled
    labels = list(dict.fromkeys(s["label"] for s in samples))
    return Repriced(v, d, dict(totals), labels, len(priced), len(samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results.json of talon bench or talon sweep")
    parser.add_argument("--auto-label", default=None, help="the online variant's label (default: the one with N=auto)")
    parser.add_argument("--same-length", action="store_true",
                        help="price only the prompt turns where every variant committed as many tokens (in bf16 a "
                             "near-tie can give a variant another answer; the fit still uses every request)")
    args = parser.parse_args()
    results = json.loads(pathlib.Path(args.results).read_text())
    found = reprice(results, args.same_length)
    v, d, labels = found.verify, found.draft, found.labels
    auto = args.auto_label or next((label for label in labels if "auto" in label), None)
    method = auto.split("(")[0] if auto else None  # the fixed columns of the online variant's own method
    fixed = [label for label in labels if label not in ("ar", auto) and label.split("(")[0] == method]
    print(f"fit over {found.fitted} requests: verify = {v[0] * 1e3:.1f} ms/step + {v[1] * 1e3:.2f} ms/node"
          f" + {v[2] * 1e6:.3f} us/(node x context token) + {v[3] * 1e6:.1f} us/node^2; draft = {d[0] * 1e3:.1f}"
          f" ms/forward + {d[1] * 1e3:.2f} ms/drafted node + {d[2] * 1e3:.2f} ms/prompt token + {d[3] * 1e3:.1f}"
          f" ms/drafted step")
    present = list(dict.fromkeys(dataset for dataset, _ in found.totals if dataset != "all"))
    datasets = [name for name in DATASETS if name in present] + [n for n in present if n not in DATASETS]
    print("\nspeedup over ar, measured / modelled (measured seconds over modelled seconds in brackets)")
    header = ["dataset"] + labels + ([f"{auto} / best fixed (measured / modelled)"] if auto and fixed else [])
    print(" | ".join(header))
    for dataset in datasets + ["all"]:
        speed = found.speedups(dataset)
        cells = [dataset]
        for label in labels:
            if label not in speed:
                cells.append("-")
                continue
            tokens, seconds, modelled = found.totals[(dataset, label)]
            cells.append(f"{speed[label][0]:.3f} / {speed[label][1]:.3f} [{seconds / modelled:.3f}]")
        if auto in speed and any(label in speed for label in fixed):
            best_measured = max(speed[label][0] for label in fixed if label in speed)
            best_modelled = max(speed[label][1] for label in fixed if label in speed)
            cells.append(f"{speed[auto][0] / best_measured:.3f} / {speed[auto][1] / best_modelled:.3f}")
        print(" | ".join(cells))
    measured = statistics.fsum(found.totals[("all", label)][1] for label in labels if ("all", label) in found.totals)
    print(f"\n{found.priced} of {found.fitted} requests priced, {measured:.0f} s measured")


if __name__ == "__main__":
    main()
