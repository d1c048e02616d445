"""Replay the online controller on the real pair's recorded trees: issue 11's bar without the timing noise.

Reads the per-position trees of ``scripts/record_positions.py`` (the real draft LM's TALON trees at every
position of the target's greedy answers) and runs, request after request in the sweep's order, (a) the
online controller (:class:`talon_sd.control.BudgetController`, carried from request to request as the
generator does, after the bench's 8-token warm-up) and (b) every fixed budget of ``--fixed``. A step of budget
k at position t is the first k nodes of the tree recorded at t (the prefix property); it accepts the longest
path that spells the answer from t, exactly what greedy verification accepts, and costs what ``--hardware``
measured (:data:`HARDWARE`: verify by tree size, draft by forward width, other work a step, the draft's catch-up
per token, the target's prefill by prompt length; the Intel Xeon in bf16 by default, the AMD EPYC with AVX512-BF16
in bf16 (``epyc-bf16``: 16 nodes verify at 1.35x one), the AVX2-only AMD EPYC in float32, where a 2-token verify
costs 1.6x one token (``avx2-fp32``, ``avx2-fp32-steep``; ``avx2-fp32-int8`` with the draft's linears in int8), the
AVX512-BF16 EPYC in float32 with torch's default kernels (``epyc-fp32-default``), or an H200) with ``--noise`` relative jitter per measured time.
Acceptance is the real pair's, positions and all; only the clock is modelled. ``--fixed 1,... --bar 1`` scores auto
against plain decoding (issue 11's no-loss bar on a hostile CPU). Prints, per dataset, auto over the best
fixed budget of ``--bar`` (the sweep's columns; median, mean and worst over ``--seeds`` noise seeds) and of every
fixed budget (median), and auto's reasons.

    python scripts/replay_positions.py docs/bench/online-sweep13/positions.jsonl.gz [--seeds 8] [--set lean_reach=1] [--hindsight]
    python scripts/replay_positions.py docs/bench/online-sweep13/positions.jsonl.gz --hardware avx2-fp32 --fixed 1,4,8,16,24,32 --bar 1
    python scripts/replay_positions.py ... --order humaneval,qa   # only these datasets, in this order (chat after code)
    python scripts/replay_positions.py ... --hardware epyc-fp32-default --limit 2 --bar 1 --fixed 1,4,8,16   # the hostile bench

(``docs/bench/online-sweep13/positions.jsonl.gz``: the 35 prompt turns of sweep 13, trees of 32 nodes, bf16 on the
Intel Xeon; recorded in 70 minutes. ``docs/bench/online-avx2-fp32-int8-positions/positions.jsonl.gz``: the float32
answers of the AVX2-only EPYC with the int8 draft, 18 prompts (6 datasets x 3), 21 turns with MT-Bench's second
turns, trees of 32 nodes, with its ``prompt_agreement.json`` for ``--agreement``; replay it with ``--hardware
avx2-fp32-int8``.)

Budgets above the recorded tree size are cut to it (the controller's ``max_budget`` is the recorded size).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import pathlib
import random
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from controller_scenarios import INTEL_BF16_MS  # noqa: E402
from test_control import AVX2_FP32_MS, AVX2_INT8_MS, measured_curve  # noqa: E402

from talon_sd.bench.datasets import check_limit  # noqa: E402
from talon_sd.control import BudgetController, ControllerSettings, StepRecord  # noqa: E402
from talon_sd.decoding import AGREEMENT_POSITIONS  # noqa: E402


@dataclass(frozen=True)
class Hardware:
    """What a step costs on one measured CPU kind: target verify (ms by tree size), draft forward (ms by width),
    the rest of a step, the draft LM's catch-up per token and the target's prefill by prompt length."""

    verify_ms: dict
    draft_ms: dict
    other_seconds: float  # tree building, cache commit, bookkeeping per step
    catch_up_seconds: float  # draft LM seconds per token forwarded beside the root (prompt, plain steps' tokens)
    prefill_base: float  # the target's prefill of a request: base + per_token x prompt tokens
    prefill_per_token: float
    agreement_seconds: float = 0.0  # both output heads, a prompt position (design 29's agreement)
    verify_context_slope: float = 0.0  # verify seconds per tree node per context token beyond the reference
    verify_context_reference: int = 200  # the context verify_ms was measured at (scripts/forward_costs.py)

    def verify_seconds(self, curve, size: int, context: int) -> float:
        """A verify of ``size`` nodes over ``context`` cached tokens: the measured curve, plus or minus the
        attention's share of the context's difference from the reference (design 33)."""
        return max(curve(size) + self.verify_context_slope * size * (context - self.verify_context_reference),
                   0.5 * curve(size))

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return self.prefill_base + self.prefill_per_token * prompt_tokens


EPYC_BF16_MS = {"target": {1: 136, 2: 127, 4: 135, 8: 152, 12: 159, 16: 184, 20: 193, 24: 203, 32: 231, 48: 291,
                           64: 366},
                "draft": {1: 48, 2: 52, 4: 51, 8: 60, 12: 64, 16: 70, 20: 75, 24: 79, 32: 94, 48: 121, 64: 151}}
H200_EAGER_BF16_MS = {"target": {1: 22, 2: 24, 4: 23, 8: 24, 16: 24, 32: 26, 64: 28},
                      "draft": {1: 19, 2: 19, 4: 19, 8: 19, 16: 19, 32: 19, 64: 19}}

HARDWARE = {
    # sweep 13 on the 2-core Intel Xeon with AMX, bf16 (seconds_build / steps; prefill 0.24 s at 36 tokens, 1.9 s
    # at 918)
    "intel-bf16": Hardware(INTEL_BF16_MS["target"], INTEL_BF16_MS["draft"], 0.004, 0.0008, 0.2, 0.0017,
                           0.001),  # (the heads: a guess from the 64-node verify's 300 ms)
    # the 2-core AVX2-only AMD EPYC, float32 packed (docs/BENCHMARKS.md section 5: scripts/forward_costs.py; the
    # draft's catch-up of a 709-token sum prompt 5.2-5.8 s; the target's prefill of it 17.7-21.0 s; 10-30 ms of
    # other work a drafted step)
    "avx2-fp32": Hardware(AVX2_FP32_MS["target"], AVX2_FP32_MS["draft"], 0.015, 0.008, 0.3, 0.027,
                          0.009),  # (the heads: 0.35 s over a 39-token prompt's 38 rows, target 0.26 + draft 0.09)
    # the same CPU kind on a faster host (2026-11-30): one token cheaper, trees as dear, so a 16-node verify costs 3x one
    # token (the loop's fitted curves on a T = 1 gsm8k -> humaneval run; 32 and 64 nodes and the draft's widths scaled from
    # scripts/forward_costs.py there): drafting loses on gsm8k here and wins on humaneval, as timed runs read
    "avx2-fp32-steep": Hardware({1: 290, 2: 540, 4: 668, 8: 760, 16: 880, 32: 1200, 64: 2150},
                                {1: 160, 2: 204, 4: 239, 8: 288, 16: 320, 32: 440, 64: 720}, 0.015, 0.008, 0.3, 0.027,
                                0.009),
    # the same CPU kind, float32 packed target and the draft's linears in int8 (2026-12-03: scripts/forward_costs.py
    # --variants float32:auto:int8; scripts/prompt_measure_cost.py: a 709-token prompt's draft forward 2.8 s (4 ms a
    # token), its target prefill 17.1 s (1.3 s at 39 tokens, 3.0 s at 134: the linear fit reads 3.5 there), both heads
    # 6-8 ms a prompt row, each timed apart). On sweep 13's trees the acceptance replayed is the float32 draft's (the
    # int8 draft agrees with the target a little less often: 61% of argmaxes against 66%); the trees of
    # docs/bench/online-avx2-fp32-int8-positions were drafted by the int8 draft itself
    "avx2-fp32-int8": Hardware(AVX2_INT8_MS["target"], AVX2_INT8_MS["draft"], 0.015, 0.004, 0.3, 0.024, 0.007),
    # the same AVX512-BF16 EPYC in float32 with the default kernels (issue 11's hostile case; 2026-12-02:
    # scripts/forward_costs.py --variants float32:default; the target's prefill fitted to the hostile run's ar
    # requests (docs/bench/online-fp32-hostile-d45: 1.3-1.6 s at 36-44 tokens, 13.6-15.2 s at 664-709); the draft's
    # catch-up 11 ms a token and the heads 12 ms a prompt row, from the measured prompts' extra prefill there)
    "epyc-fp32-default": Hardware({1: 448, 2: 837, 4: 786, 8: 787, 12: 1002, 16: 1064, 20: 1209, 24: 1184, 32: 1315,
                                   48: 1772, 64: 2147},
                                  {1: 137, 2: 278, 4: 252, 8: 251, 12: 281, 16: 316, 20: 373, 24: 390, 32: 460,
                                   48: 554, 64: 621}, 0.015, 0.011, 0.8, 0.019, 0.012),
    # the 2-core AMD EPYC with AVX512-BF16, bf16 (docs/BENCHMARKS.md section 5, sweep 21: scripts/forward_costs.py
    # --variants bfloat16:auto; 4 ms of tree building a drafted step; the target's prefill 0.02 s + 4.1 ms a prompt
    # token, fitted to the sweep's ar requests; the draft's catch-up a third of that; the heads 2 ms a prompt row, target
    # 0.9-1.7 + draft 0.7-1.0, timed with prefill_logits against prefill)
    # (verify by context: the fixed budgets' steps of sweeps 21 and 23 took a median 179-188 ms at 16 nodes over
    # contexts under 150 tokens and 191-209 ms over 600 or more (8 nodes: 140-154 / 154-171 ms; 1: no change), about
    # 2 us a node per context token; one trace had read 4.5: --context-slope 4.5e-6)
    "epyc-bf16": Hardware(EPYC_BF16_MS["target"], EPYC_BF16_MS["draft"], 0.004, 0.0014, 0.02, 0.0041, 0.002,
                           verify_context_slope=2e-6),
    # an NVIDIA H200 through transformers' eager forward, bf16, the pair's shapes with random weights (docs/
    # BENCHMARKS.md section 5, "On a GPU": scripts/forward_costs.py --device cuda; 5.6 ms of tree building a drafted
    # step; a catch-up rides on the draft's first forward at no measurable cost; prefill 0.02 s)
    "h200-eager-bf16": Hardware(H200_EAGER_BF16_MS["target"], H200_EAGER_BF16_MS["draft"], 0.0056, 0.0002, 0.02,
                                0.00002, 0.00003),
}


@dataclass
class Turn:
    """One recorded prompt turn: the answer, the target's confidence before each token, a tree per position."""

    index: int
    dataset: str
    prompt_tokens: int
    answer: list[int]
    confidence: list[float]
    positions: list[dict]
    question_id: str = ""  # the dataset's question (an MT-Bench question has two turns)
    children: list[dict] = field(default_factory=list)  # per position: (parent, token) -> inclusion position

    def __post_init__(self) -> None:
        self.children = [{(parent, token): place for place, (parent, token) in
                          enumerate(zip(p["parents"], p["tokens"])) if parent >= 0} for p in self.positions]


@dataclass
class Clock:
    verify: object
    draft: object
    hardware: Hardware
    noise: float
    draws: random.Random

    def measured(self, seconds: float) -> float:
        return max(0.0, seconds * (1 + self.noise * self.draws.gauss(0, 1)))


def make_clock(hardware: Hardware, noise: float, seed: str | int) -> Clock:
    """``hardware``'s measured verify and draft curves, with ``noise`` relative jitter drawn from ``seed``."""
    return Clock(measured_curve(hardware.verify_ms), measured_curve(hardware.draft_ms), hardware, noise,
                 random.Random(seed))


def replay_step(turn: Turn, start: int, budget: int, pending: int, clock: Clock, tokens_left: int) -> StepRecord:
    """The step of ``budget`` nodes at answer position ``start`` (``pending`` tokens wait in the drafter)."""
    context = turn.prompt_tokens - 1 + start  # the target's cache before the step
    if budget == 1:
        return StepRecord(node_log_p=(0.0,), node_parent=(-1,), accepted=(), forward_widths=(),
                          prefix_after_forward=(), draft_seconds=(),
                          verify_seconds=clock.measured(clock.hardware.verify_seconds(clock.verify, 1, context)),
                          other_seconds=clock.measured(clock.hardware.other_seconds), budget=1, complete=False,
                          confidence=(turn.confidence[start],), context_tokens=context)
    tree = turn.positions[start]
    size = min(budget, len(tree["tokens"]))
    forwards = [j for j in range(len(tree["widths"])) if j == 0 or tree["prefix"][j - 1] < budget]
    prefix = [min(tree["prefix"][j], size) for j in forwards]
    accepted, node = [], 0
    while start + len(accepted) < len(turn.answer):
        child = turn.children[start].get((node, turn.answer[start + len(accepted)]))
        if child is None or child >= size:
            break
        accepted.append(child)
        node = child
    accepted = accepted[:max(tokens_left - 1, 0)]
    draft_seconds = [clock.measured(clock.draft(tree["widths"][j])) for j in forwards]
    draft_seconds[0] += clock.hardware.catch_up_seconds * (pending - 1)
    return StepRecord(node_log_p=tuple(tree["log_p"][:size]), node_parent=tuple(tree["parents"][:size]),
                      accepted=tuple(accepted), forward_widths=tuple(tree["widths"][j] for j in forwards),
                      prefix_after_forward=tuple(prefix), draft_seconds=tuple(draft_seconds),
                      verify_seconds=clock.measured(clock.hardware.verify_seconds(clock.verify, size, context)),
                      other_seconds=clock.measured(clock.hardware.other_seconds),
                      budget=budget, complete=size < budget,
                      confidence=tuple(turn.confidence[start:start + len(accepted) + 1]), context_tokens=context)


def replay_turn(turn: Turn, policy: BudgetController | int | Callable[[int, float], int], clock: Clock,
                max_new_tokens: int, tokens: int | None = None, steps: list | None = None,
                agreement: float | None = None, agreement_positions: int = AGREEMENT_POSITIONS,
                tell_context: bool = True, tell_prompt_context: bool = True) -> tuple[int, float, list[int], list[str]]:
    """(tokens, seconds, budgets, reasons) of one request: a controller, a fixed budget, or a rule giving each step's
    budget from the last step's committed tokens (0 before the first) and the target's confidence there.
    ``steps``, if given, receives each step's (budget, committed tokens, seconds). ``agreement``: the prompt's
    draft/target agreement over up to ``agreement_positions`` positions, told to a controller that asks for it as the
    loop does (design 29: both heads' cost and the draft's prompt forward are then paid before the first step).
    ``tell_context``: give the controller each step's context, as the loop does (design 33); ``tell_prompt_context``:
    and the first step's with the prompt agreement (design 34)."""
    controller = policy if isinstance(policy, BudgetController) else None
    length = len(turn.answer) if tokens is None else min(tokens, len(turn.answer))
    position, pending, budgets, reasons = 0, turn.prompt_tokens, [], []
    seconds = clock.hardware.prefill_seconds(turn.prompt_tokens)
    context = (turn.prompt_tokens - 1,) if tell_context and tell_prompt_context else ()  # design 34
    if (controller is not None and agreement is not None
            and controller.prompt_agreement_due(pending - 1, max_new_tokens, *context)):
        controller.observe_prompt(agreement, *context)
        positions = min(turn.prompt_tokens - 1, agreement_positions)
        seconds += clock.hardware.agreement_seconds * positions + clock.hardware.catch_up_seconds * (pending - 1)
        pending = 1
    committed = 0
    while position < length:
        if controller is not None:
            budget = controller.next_budget(pending - 1, max_new_tokens - position,
                                            turn.prompt_tokens - 1 + position if tell_context else None)
            reasons.append(controller.reason)
        elif callable(policy):
            budget = policy(committed, turn.confidence[position])
        else:
            budget = policy
        record = replay_step(turn, position, budget, pending, clock, length - position)
        if controller is not None:
            controller.observe(record)
        committed = len(record.accepted) + 1
        position += committed
        pending = 1 if record.forward_widths else pending + committed
        step_seconds = sum(record.draft_seconds) + record.verify_seconds + record.other_seconds
        seconds += step_seconds
        budgets.append(budget)
        if steps is not None:
            steps.append((budget, committed, step_seconds))
    return length, seconds, budgets, reasons


def speed_over_plain(turn: Turn, budget: int, clock: Clock, max_new_tokens: int) -> float:
    """Tokens per second of fixed ``budget`` over plain decoding's on the whole of ``turn``'s answer."""
    tokens, seconds, _, _ = replay_turn(turn, budget, clock, max_new_tokens)
    plain_tokens, plain_seconds, _, _ = replay_turn(turn, 1, clock, max_new_tokens)
    return (tokens / seconds) / (plain_tokens / plain_seconds)


def load_turns(paths: list[pathlib.Path]) -> list[Turn]:
    """The recorded turns of ``paths`` (JSON lines, or gzipped ones ending in .gz), in the sweep's order."""
    rows = {}
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["index"]] = row
    return [Turn(index=r["index"], dataset=r["dataset"], prompt_tokens=r["prompt_tokens"], answer=r["answer"],
                 confidence=r["confidence"], positions=r["positions"], question_id=str(r.get("question_id", "")))
            for _, r in sorted(rows.items())]


def first_questions(turns: list[Turn], limit: int) -> list[Turn]:
    """The turns of each dataset's first ``limit`` questions, in order (an MT-Bench question's turns together), as
    ``talon bench --limit`` picks them."""
    check_limit(limit)
    firsts: dict = defaultdict(list)
    for turn in turns:
        if turn.question_id not in firsts[turn.dataset] and len(firsts[turn.dataset]) < limit:
            firsts[turn.dataset].append(turn.question_id)
    return [turn for turn in turns if turn.question_id in firsts[turn.dataset]]


def replay(turns: list[Turn], seed: int, fixed: list[int], noise: float, max_new_tokens: int,
           settings: ControllerSettings, hardware: Hardware,
           agreements: dict | None = None, agreement_positions: int = AGREEMENT_POSITIONS,
           tell_context: bool = True, tell_prompt_context: bool = True,
           trace: list | None = None) -> tuple[dict, Counter]:
    """Per dataset and policy ('auto' and each fixed budget): [tokens, seconds]; auto's reasons. ``agreements``:
    prompt agreements by turn index (design 29), told to auto where it asks; ``tell_context``,
    ``tell_prompt_context``: see replay_turn. ``trace``, if given, receives per turn (turn, auto's budgets, auto's
    reasons, seconds by policy)."""
    totals: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    reasons: Counter = Counter()
    controller = BudgetController(settings)
    warm_up = make_clock(hardware, noise, f"warm-up {seed}")
    replay_turn(turns[0], controller, warm_up, max_new_tokens, tokens=8, tell_context=tell_context)  # warm-up
    for turn in turns:
        controller = controller.for_next_sequence()
        seconds_by = {}
        for policy in [controller] + fixed:
            label = "auto" if isinstance(policy, BudgetController) else policy
            clock = make_clock(hardware, noise, f"{seed} {turn.index} {label}")
            tokens, seconds, budgets, why = replay_turn(turn, policy, clock, max_new_tokens,
                                                  agreement=(agreements or {}).get(turn.index),
                                                  agreement_positions=agreement_positions,
                                                  tell_context=tell_context,
                                                  tell_prompt_context=tell_prompt_context)
            for key in (turn.dataset, "all"):
                totals[key][label][0] += tokens
                totals[key][label][1] += seconds
            reasons.update(why)
            seconds_by[label] = seconds
            if label == "auto":
                auto_budgets, auto_reasons = budgets, why
        if trace is not None:
            trace.append((turn, auto_budgets, auto_reasons, seconds_by))
    return totals, reasons


REASON_CODES = {"choice": "", "trial": "T", "lean": "L", "plain-measure": "m", "cost-refresh": "r", "catch-up-skip": "k",
                "trial-short": "s"}  # other reasons print as "?"


def print_trace(seed: int, trace: list) -> None:
    """One line per turn of one seed: auto's and each fixed budget's seconds, then auto's budget at every step with a
    letter for why (none: the choice; T trial, L lean, m plain-measure, r cost-refresh, k catch-up skip, s trial-short,
    ? another trial reason)."""
    for turn, budgets, reasons, seconds_by in trace:
        times = " ".join(f"{label}:{seconds:.2f}" for label, seconds in seconds_by.items())
        steps = " ".join(f"{b}{REASON_CODES.get(r, '?')}" for b, r in zip(budgets, reasons))
        print(f"seed {seed} turn {turn.index} {turn.dataset} ({len(turn.answer)} tokens) {times} | {steps}")


def hindsight(turns: list[Turn], fixed: list[int], max_new_tokens: int, hardware: Hardware) -> None:
    """What a budget chosen with hindsight could gain over the best fixed N (noise-free clock): per request, and by
    a two-context rule (``lo`` or ``hi`` nodes by the last step's committed tokens or the target's confidence)."""
    clock = make_clock(hardware, 0.0, 0)
    rules: dict = {f"N={k}": k for k in fixed}
    for low in (4, 8, 12, 16):
        for high in (k for k in (16, 24, 32) if k > low):
            for least in (2, 3, 4, 6):
                rules[f"{low}/{high} by last >= {least}"] = (lambda lo, hi, t: lambda last, c: hi if last >= t else lo)(
                    low, high, least)
            for least in (0.5, 0.7, 0.9):
                rules[f"{low}/{high} by confidence >= {least}"] = (
                    lambda lo, hi, t: lambda last, c: hi if c >= t else lo)(low, high, least)
    totals: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for turn in turns:
        per_request = {name: replay_turn(turn, rule, clock, max_new_tokens)[:2] for name, rule in rules.items()}
        best = min((v for k, v in per_request.items() if k.startswith("N=")), key=lambda v: v[1])
        for key in (turn.dataset, "all"):
            for name, (tokens, seconds) in list(per_request.items()) + [("per-request best N", best)]:
                totals[key][name][0] += tokens
                totals[key][name][1] += seconds
    print("hindsight: over the best fixed N of the dataset, per-request best N / the best two-context rule")
    for dataset, by_rule in totals.items():
        rate = {name: tokens / seconds for name, (tokens, seconds) in by_rule.items()}
        best_fixed = max(rate[f"N={k}"] for k in fixed)
        rule = max((k for k in rate if " by " in k), key=rate.get)
        print(f"  {dataset:10} {rate['per-request best N'] / best_fixed:.3f}  {rate[rule] / best_fixed:.3f} ({rule})")


def check(turns: list[Turn], checkpoint: pathlib.Path, max_new_tokens: int, hardware: Hardware) -> None:
    """Per dataset and fixed budget of the sweep: replayed / measured tokens per second, and how many requests whose
    output equals plain decoding's took exactly the replayed number of steps."""
    rows = [json.loads(line) for line in checkpoint.read_text().splitlines()[1:] if line.strip()]
    measured = {(row["index"], row["stats"]["budgets"][0] if row["stats"].get("budgets") else None): row
                for row in rows if "(N=" in row["label"] and "N=auto" not in row["label"]}
    table: dict = defaultdict(lambda: [0, 0.0, 0, 0.0, 0, 0])
    for turn in turns:
        for (index, budget), row in measured.items():
            if index != turn.index:
                continue
            tokens, seconds, budgets, _ = replay_turn(turn, budget, make_clock(hardware, 0.0, 0), max_new_tokens)
            cell = table[(turn.dataset, budget)]
            cell[0] += tokens
            cell[1] += seconds
            cell[2] += len(row["token_ids"])
            cell[3] += row["seconds"]
            if row["identical_to_ar"]:
                cell[4] += 1
                cell[5] += len(budgets) == row["stats"]["target_forwards"]
    print("replay check: dataset N replayed/measured tok/s, requests with the measured step count / identical to ar")
    for (dataset, budget), (tokens, seconds, real_tokens, real_seconds, identical, same) in sorted(table.items()):
        print(f"  {dataset:10} {budget:3} {tokens / seconds / (real_tokens / real_seconds):.3f}  {same}/{identical}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("positions", type=pathlib.Path, nargs="+")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="intel-bf16",
                        help="whose measured costs the clock charges (the recorded acceptance is the same)")
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--fixed", default="4,6,8,10,12,16,20,24,32")
    parser.add_argument("--bar", default="8,16,24", help="the sweep's fixed columns: auto is scored against their best")
    parser.add_argument("--initial-budget", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--check", type=pathlib.Path, default=None, metavar="CHECKPOINT",
                        help="the sweep checkpoint the trees were recorded from: compare each fixed budget's steps and "
                             "tokens/s (noise-free replay) with what the sweep measured")
    parser.add_argument("--hindsight", action="store_true",
                        help="also print what budgets chosen with hindsight (per request, or by a two-context rule) "
                             "gain over the best fixed N")
    parser.add_argument("--agreement", type=pathlib.Path, default=None, metavar="JSON",
                        help="prompt agreements by turn (scripts/prompt_agreement.py --json) for design 29's prior "
                             "(default: none, the prior never acts)")
    parser.add_argument("--measure", default="soft",
                        help="which measure of --agreement is the agreement (soft, the default: what the loop measures "
                             "since design 44; spread: before it; agree: over every prompt position, "
                             "its heads' cost charged so; the others over 64, the loop's AGREEMENT_POSITIONS)")
    parser.add_argument("--order", default=None, metavar="DATASETS",
                        help="replay only these datasets, in this order (comma-separated, e.g. humaneval,qa: a chat "
                             "dataset right after code); default: every turn in the sweep's order")
    parser.add_argument("--limit", type=int, default=None, metavar="K",
                        help="replay only each dataset's first K questions (an MT-Bench question's two turns both), "
                             "as ``talon bench --limit K`` runs them")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ControllerSettings field for this replay (e.g. lean_margin=0.05); repeatable")
    parser.add_argument("--blind-context", action="store_true",
                        help="do not tell the controller each step's context (before design 33)")
    parser.add_argument("--trace", type=int, default=0, metavar="SEEDS",
                        help="print every turn's seconds and auto's budgets step by step for the first SEEDS seeds")
    parser.add_argument("--blind-prompt-context", action="store_true",
                        help="do not tell the controller the first step's context with the prompt agreement (before "
                             "design 34)")
    parser.add_argument("--context-slope", type=float, default=None, metavar="SECONDS",
                        help="the hardware's verify seconds per node per context token (default: --hardware's)")
    args = parser.parse_args(argv)
    turns = load_turns(args.positions)
    if args.order is not None:
        order = args.order.split(",")
        unknown = sorted(set(order) - {turn.dataset for turn in turns})
        if unknown:
            parser.error(f"--order: no recorded turns of {unknown}")
        if len(set(order)) < len(order):
            parser.error(f"--order: a dataset named twice in {args.order!r} (each is replayed once)")
        turns = [turn for dataset in order for turn in turns if turn.dataset == dataset]
    if args.limit is not None:
        try:
            turns = first_questions(turns, args.limit)
        except ValueError as error:
            parser.error(str(error))
    hardware = HARDWARE[args.hardware]
    if args.context_slope is not None:
        hardware = dataclasses.replace(hardware, verify_context_slope=args.context_slope)
    recorded = max(len(p["tokens"]) for t in turns for p in t.positions)
    fixed = [int(k) for k in args.fixed.split(",")]
    bar = [int(k) for k in args.bar.split(",")]
    if args.check is not None:
        check(turns, args.check, args.max_new_tokens, hardware)
    if args.hindsight:
        hindsight(turns, fixed, args.max_new_tokens, hardware)
    overrides = {name: json.loads(value) for name, value in (item.split("=", 1) for item in args.set)}
    settings = ControllerSettings(max_budget=recorded, initial_budget=args.initial_budget, **overrides)
    agreements = None
    if args.agreement is not None:
        agreements = {row["index"]: row[args.measure] for row in json.loads(args.agreement.read_text())}
    ratios, rates, reasons = defaultdict(list), defaultdict(lambda: defaultdict(list)), Counter()
    for seed in range(args.seeds):
        trace = [] if seed < args.trace else None
        totals, why = replay(turns, seed, fixed, args.noise, args.max_new_tokens, settings, hardware, agreements,
                             10 ** 6 if args.measure == "agree" else AGREEMENT_POSITIONS, not args.blind_context,
                             not args.blind_prompt_context, trace)
        if trace is not None:
            print_trace(seed, trace)
        reasons.update(why)
        for dataset, by_policy in totals.items():
            rate = {label: tokens / seconds for label, (tokens, seconds) in by_policy.items()}
            for label, value in rate.items():
                rates[dataset][label].append(value)
            ratios[dataset].append((rate["auto"] / max(rate[k] for k in bar),
                                    rate["auto"] / max(rate[k] for k in fixed)))
    print(f"{len(turns)} turns, trees of {recorded} nodes, {args.seeds} seeds, noise {args.noise}")
    print(f"{'dataset':10} {'auto / best of ' + args.bar + ' (median mean min)':>40} {'/ best any':>10}  "
          f"median tok/s: auto | " + " ".join(map(str, fixed)))
    for dataset, pairs in ratios.items():
        bars, anys = [p[0] for p in pairs], [p[1] for p in pairs]
        row = " ".join(f"{statistics.median(rates[dataset][k]):.2f}" for k in fixed)
        print(f"{dataset:10} {statistics.median(bars):26.3f} {statistics.mean(bars):6.3f} {min(bars):6.3f} "
              f"{statistics.median(anys):10.3f}  {statistics.median(rates[dataset]['auto']):.2f} | {row}")
    print("auto's reasons:", dict(reasons.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
