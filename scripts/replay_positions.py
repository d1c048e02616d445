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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("positions", type=pathlib.Path, nargs="+")
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
    turns = load_turns(args.positions)
    if args.order is not None:
        order = args.order.split(",")
        unknown = sorted(set(order) - {turn.dataset for turn in turns})
        if unknown or len(set(order)) < len(order):
            parser.error(f"--order: {args.order!r} names a dataset twice or one not recorded ({unknown})")
        turns = [turn for dataset in order for turn in turns if turn.dataset == dataset]
    if args.limit is not None:
        turns = first_questions(turns, args.limit)
    hardware = HARDWARE[args.hardware]
    if args.context_slope is not None:
        hardware = dataclasses.replace(hardware, verify_context_slope=args.context_slope)
    recorded = max(len(p["tokens"]) for t in turns for p in t.positions)
    fixed = [int(k) for k in args.fixed.split(",")]
    bar = [int(k) for k in args.bar.split(",")]
    overrides = {name: json.loads(value) for name, value in (item.split("=", 1) for item in args.set)}
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
    print(f"{len(turns)} turns, trees of {recorded} nodes, {args.seeds} seeds, noise {args.noise}, {args.hardware}")
    print(f"{'dataset':10} {'auto / best of ' + args.bar + ' (median mean min)':>36} {'/ plain':>8}  "
          f"median tok/s: auto | " + " ".join(map(str, fixed)))
    for dataset, pairs in ratios.items():
        bars, plain = [p[0] for p in pairs], [p[1] for p in pairs]
        row = " ".join(f"{statistics.median(rates[dataset][k]):.2f}" for k in fixed)
        print(f"{dataset:10} {statistics.median(bars):22.3f} {statistics.mean(bars):6.3f} {min(bars):6.3f} "
              f"{statistics.median(plain):8.3f}  {statistics.median(rates[dataset]['auto']):.2f} | {row}")
    print("auto's steps by reason:", dict(reasons.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
