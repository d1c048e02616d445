"""The exploration behind design 29: can a prompt's draft/target agreement start a request plain?

Replays the online controller on sweep 13's recorded trees as ``scripts/replay_positions.py`` does (same clock, same
order, same warm-up), with one addition at each first-turn prompt whose agreement is known (``--agreement``, written
by ``scripts/prompt_agreement.py --json``; ``--measure`` picks which): a prediction of the prompt's speed over plain
decoding from the turns before it, either a least-squares line through all of them (``--rule line``) or the mean of
those within 0.05 of its agreement (``--rule near``, what design 29 kept), each turn's speed being fixed N = 16's
noise-free replay of its whole answer (``--pairs replay``, an optimistic stand-in) or what auto's own drafted steps
measured over its plain rate (``--pairs measured``, what a loop has). When the prediction is below ``1 - margin``,
the carried acceptance samples are dropped and the choice set to plain decoding (rates are ratios of sums: scaling
the carried samples down, design 8's release, leaves its first step drafting). It reaches into the controller's
private state and ignores the heads' cost; the design as built (``talon_sd/control/``, design 29) is replayed with
``scripts/replay_positions.py --agreement``. Prints auto over the best fixed budget (plain included) per dataset,
median over ``--seeds``.

    python scripts/replay_prompt_prior.py docs/bench/online-sweep13/positions.jsonl.gz --hardware avx2-fp32
    python scripts/replay_prompt_prior.py ... --rule near --pairs measured --margins 0
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

import replay_positions as replay  # noqa: E402

from talon_sd.control import BudgetController, ControllerSettings  # noqa: E402

FIXED = {"avx2-fp32": [1, 4, 8, 16, 24, 32], "intel-bf16": [8, 16, 24]}  # the columns each reading scores against


def predicted_speed(pairs: list[tuple[float, float]], agreement: float) -> float | None:
    """The least-squares line through ``pairs`` (agreement, speed over plain) at ``agreement``; None below 4 pairs."""
    if len(pairs) < 4:
        return None
    mean_x, mean_y = statistics.mean(x for x, _ in pairs), statistics.mean(y for _, y in pairs)
    spread = sum((x - mean_x) ** 2 for x, _ in pairs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in pairs) / spread if spread > 0 else 0.0
    return mean_y + slope * (agreement - mean_x)


def predicted_near(pairs: list[tuple[float, float]], agreement: float, width: float = 0.05) -> float | None:
    """The mean speed of the earlier prompts within ``width`` of ``agreement``; None below 2 of them."""
    near = [y for x, y in pairs if abs(x - agreement) <= width]
    return statistics.mean(near) if len(near) >= 2 else None


def start_plain(controller: BudgetController) -> None:
    """Drop the acceptance samples carried from before this sequence and choose plain decoding."""
    for samples in controller._samples:
        own = [sample for sample in samples if sample.index >= controller._sequence_start]
        samples.clear()
        samples.extend(own)
    controller._choice = 1
    controller._version += 1


def measured_speed(steps: list, controller: BudgetController, least: int = 8) -> float | None:
    """What a loop can measure of a request: its drafted steps' tokens/s over the controller's plain rate (None
    below ``least`` drafted tokens)."""
    drafted = [(tokens, seconds) for budget, tokens, seconds in steps if budget > 1]
    plain = controller._plain_rate()
    if sum(t for t, _ in drafted) < least or not plain:
        return None
    return sum(t for t, _ in drafted) / sum(s for _, s in drafted) / plain


def run(turns, agreements: dict, speeds: dict, hardware: replay.Hardware, fixed: list[int], margin: float | None,
        seed: int, rule: str = "line", pairs_from: str = "replay") -> dict:
    """Per dataset: auto's tokens/s over the best fixed budget's, one noise seed (margin None: no prior);
    ``speeds``: by turn index, N = 16's noise-free speed over plain decoding (what a turn teaches the line)."""
    totals: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    controller = BudgetController(ControllerSettings(max_budget=32, initial_budget=16))
    replay.replay_turn(turns[0], controller, replay.make_clock(hardware, 0.03, f"warm-up {seed}"), 128, tokens=8)
    pairs: list[tuple[float, float]] = []
    for turn in turns:
        controller = controller.for_next_sequence()
        agreement = agreements.get(turn.index)
        if margin is not None and agreement is not None:
            speed = (predicted_speed if rule == "line" else predicted_near)(pairs, agreement)
            if speed is not None and speed < 1.0 - margin:
                start_plain(controller)
        steps: list = []
        for policy in [controller] + fixed:
            label = "auto" if isinstance(policy, BudgetController) else policy
            clock = replay.make_clock(hardware, 0.03, f"{seed} {turn.index} {label}")
            tokens, seconds, _, _ = replay.replay_turn(turn, policy, clock, 128,
                                                       steps=steps if label == "auto" else None)
            for key in (turn.dataset, "all"):
                totals[key][label][0] += tokens
                totals[key][label][1] += seconds
        if agreement is not None:
            speed = speeds[turn.index] if pairs_from == "replay" else measured_speed(steps, controller)
            if speed is not None:
                pairs.append((agreement, speed))
    ratios = {}
    for dataset, by_policy in totals.items():
        rate = {label: tokens / seconds for label, (tokens, seconds) in by_policy.items()}
        ratios[dataset] = rate["auto"] / max(rate[k] for k in fixed)
    return ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("positions", type=pathlib.Path, nargs="+")
    parser.add_argument("--agreement", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1]
                        / "docs/bench/online-sweep13/prompt_agreement.json")
    parser.add_argument("--hardware", choices=sorted(replay.HARDWARE), default="avx2-fp32")
    parser.add_argument("--measure", choices=("agree", "tail", "soft"), default="agree")
    parser.add_argument("--margins", default="0,0.05", help="predicted speed below 1 - margin starts a request plain")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--rule", choices=("line", "near"), default="line",
                        help="line: least squares over all earlier prompts; near: the mean of those within 0.05")
    parser.add_argument("--pairs", choices=("replay", "measured"), default="replay",
                        help="an earlier prompt's speed: N = 16's noise-free replay of its answer, or what auto's own "
                             "drafted steps measured over its plain rate (>= 8 drafted tokens)")
    args = parser.parse_args(argv)
    turns = replay.load_turns(args.positions)
    agreements = {row["index"]: row[args.measure] for row in json.loads(args.agreement.read_text())}
    hardware, fixed = replay.HARDWARE[args.hardware], FIXED[args.hardware]
    noise_free = replay.make_clock(hardware, 0.0, 0)
    speeds = {turn.index: replay.speed_over_plain(turn, 16, noise_free, 128) for turn in turns
              if turn.index in agreements}  # the same for every seed and margin: replayed once
    print(f"auto / best of {fixed} (median of {args.seeds} seeds), {args.hardware}, prior from '{args.measure}'")
    for margin in [None] + [float(m) for m in args.margins.split(",")]:
        by_dataset = defaultdict(list)
        for seed in range(args.seeds):
            for dataset, ratio in run(turns, agreements, speeds, hardware, fixed, margin, seed, args.rule,
                                      args.pairs).items():
                by_dataset[dataset].append(ratio)
        print(f"  {'no prior' if margin is None else f'margin {margin}':12} "
              + "  ".join(f"{dataset} {statistics.median(values):.3f}" for dataset, values in by_dataset.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
