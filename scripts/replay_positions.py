"""Replay the online controller on the real pair's recorded trees: the budget's effect without timing noise.

Reads the per-position trees of ``scripts/record_positions.py`` and runs, request after request in the recorded
order, the online controller (carried from request to request, after an 8-token warm-up) and every fixed budget of
``--fixed`` on the same text, charging each step what ``--hardware`` measured (:data:`talon_sd.bench.simulate.HARDWARE`)
with ``--noise`` relative jitter (:mod:`talon_sd.bench.simulate`). Prints, per dataset, auto's tokens per second over
the best fixed budget of ``--bar`` (median, mean and worst over ``--seeds``), over plain decoding, and each policy's
median tokens per second; then auto's steps by reason.

    python scripts/replay_positions.py data/replays/xeon-bf16-all.jsonl.gz --hardware epyc-bf16
    python scripts/replay_positions.py data/replays/avx2-fp32-int8-all.jsonl.gz \
        --hardware avx2-fp32-int8 --fixed 1,4,8,16,24 --bar 1
    python scripts/replay_positions.py --all --fixed 1,2,4,8,16,24 --bar 1,2,4,8,16,24   # every pair of ALL

``--all`` replays every recording at each machine of :data:`ALL` (about a minute at 8 seeds) and ends with
one line per pair and dataset: the table to compare before and after a controller change.

Recordings: ``data/replays/`` (its README says what each holds). Budgets above the recorded tree size are cut to it
(the controller's ``max_budget`` is the recorded size).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import dataclasses
from collections import Counter, defaultdict

from talon_sd.bench.simulate import HARDWARE, first_questions, load_turns, replay
from talon_sd.control import BudgetController, ControllerSettings
from talon_sd.drafters import DRAFTERS

REPLAYS = pathlib.Path(__file__).resolve().parent.parent / "data" / "replays"
ALL = (  # (recording, the machines its costs are replayed at): the recording's own machine first
    ("avx2-fp32-int8-t1", ("avx2-fp32-int8-loop", "avx2-fp32-int8", "epyc-bf16")),
    ("avx2-fp32-int8-all", ("avx2-fp32-int8-loop", "avx2-fp32-int8", "avx2-int4")),
    ("xeon-bf16-all", ("intel-bf16",)),
    ("epyc-bf16-sum-qa", ("epyc-bf16",)),
    ("epyc-bf16-chat", ("epyc-bf16",)),
    ("avx2-int4-ngram", ("avx2-int4-ngram",)),
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("positions", type=pathlib.Path, nargs="*")
    parser.add_argument("--all", action="store_true", help="every recording at each machine of ALL (module docstring)")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="intel-bf16")
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--fixed", default="1,4,8,12,16,24,32")
    parser.add_argument("--bar", default="8,12,16", help="auto is scored against the best of these fixed budgets")
    parser.add_argument("--initial-budget", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--order", default=None, metavar="DATASETS",
                        help="replay only these datasets, in this order (comma-separated)")
    parser.add_argument("--limit", type=int, default=None, metavar="K", help="each dataset's first K questions")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ControllerSettings field (repeatable)")
    parser.add_argument("--context-slope", type=float, default=None, metavar="SECONDS",
                        help="verify seconds per node per context token (default: --hardware's)")
    parser.add_argument("--trace", type=int, default=0, metavar="SEEDS",
                        help="print auto's budget at every step of every turn for the first SEEDS seeds")
    args = parser.parse_args(argv)
    if bool(args.positions) == args.all:
        parser.error("give the recordings to replay, or --all: one of the two")
    runs = [([REPLAYS / f"{name}.jsonl.gz"], name, kind) for name, kinds in ALL for kind in kinds] if args.all else \
        [(args.positions, " ".join(map(str, args.positions)), args.hardware)]
    summary = []
    for paths, name, kind in runs:
        print(f"== {name} at {kind}")
        for dataset, bars, plain in score(args, paths, kind, parser):
            summary.append(f"| {name} | {kind} | {dataset} | {statistics.median(bars):.3f} | {min(bars):.3f} | "
                           f"{statistics.median(plain):.3f} |")
    if args.all:
        print(f"\n| recording | costs of | dataset | auto / best of {args.bar} (median) | (worst seed) | auto / plain |")
        print("|---|---|---|---|---|---|")
        print("\n".join(summary))
    return 0


def score(args, paths: list[pathlib.Path], kind: str, parser) -> list[tuple[str, list[float], list[float]]]:
    """Replay ``paths`` at machine ``kind``, print the per-dataset table; (dataset, auto / best fixed per seed,
    auto / plain per seed) for each dataset."""
    turns = load_turns(paths)
    if args.order is not None:
        order = args.order.split(",")
        unknown = sorted(set(order) - {turn.dataset for turn in turns})
        if unknown or len(set(order)) < len(order):
            parser.error(f"--order: {args.order!r} names a dataset twice or one not recorded ({unknown})")
        turns = [turn for dataset in order for turn in turns if turn.dataset == dataset]
    if args.limit is not None:
        turns = first_questions(turns, args.limit)
    hardware = HARDWARE[kind]
    if args.context_slope is not None:
        hardware = dataclasses.replace(hardware, verify_context_slope=args.context_slope)
    recorded = max(len(p["tokens"]) for t in turns for p in t.positions)
    fixed = [int(k) for k in args.fixed.split(",")]
    bar = [int(k) for k in args.bar.split(",")]
    follows = any(DRAFTERS[turn.drafter].follows_confidence for turn in turns)  # kind_floor as the generator sets it
    overrides = {} if follows else {"kind_floor": 0.0}
    overrides |= {name: json.loads(value) for name, value in (item.split("=", 1) for item in args.set)}
    settings = ControllerSettings(max_budget=recorded, initial_budget=args.initial_budget, **overrides)
    policies = {"auto": lambda: BudgetController(settings), **{k: k for k in fixed}}
    ratios, rates, reasons = defaultdict(list), defaultdict(lambda: defaultdict(list)), Counter()
    for seed in range(args.seeds):
        trace = []
        totals = replay(turns, seed, policies, args.noise, args.max_new_tokens, hardware, trace)
        for turn, steps in trace:
            reasons.update(steps["auto"][1])
            if seed < args.trace:
                print(f"seed {seed} turn {turn.index} {turn.dataset}: "
                      + " ".join(f"{label}:{seconds:.2f}" for label, (_, _, seconds) in steps.items()) + " | "
                      + " ".join(f"{b}{'' if r == 'choice' else r[0]}" for b, r in zip(*steps["auto"][:2])))
        for dataset, by_policy in totals.items():
            rate = {label: tokens / seconds for label, (tokens, seconds) in by_policy.items()}
            for label, value in rate.items():
                rates[dataset][label].append(value)
            ratios[dataset].append((rate["auto"] / max(rate[k] for k in bar), rate["auto"] / rate.get(1, math.nan)))
    print(f"{len(turns)} turns, trees of {recorded} nodes, {args.seeds} seeds, noise {args.noise}, {kind}")
    print(f"{'dataset':10} {'auto / best of ' + args.bar + ' (median mean min)':>36} {'/ plain':>8}  "
          f"median tok/s: auto | " + " ".join(map(str, fixed)))
    for dataset, pairs in ratios.items():
        bars, plain = [p[0] for p in pairs], [p[1] for p in pairs]
        row = " ".join(f"{statistics.median(rates[dataset][k]):.2f}" for k in fixed)
        print(f"{dataset:10} {statistics.median(bars):22.3f} {statistics.mean(bars):6.3f} {min(bars):6.3f} "
              f"{statistics.median(plain):8.3f}  {statistics.median(rates[dataset]['auto']):.2f} | {row}")
    print("auto's steps by reason:", dict(reasons.most_common()))
    return [(dataset, [p[0] for p in pairs], [p[1] for p in pairs]) for dataset, pairs in ratios.items()]


if __name__ == "__main__":
    raise SystemExit(main())
