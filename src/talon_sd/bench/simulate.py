"""The budget controller without models or clocks: synthetic worlds, and replays of the real pair's recorded trees.

Both drive any *policy*: a fixed budget (an int) or a controller with the protocol of
:class:`talon_sd.control.BudgetController` (``next_budget(catch_up_tokens, tokens_left)``, ``reason``, ``choice``,
``observe(StepRecord)``, ``for_next_sequence()``), so budgets held fixed and the controller are scored on the
same text. Used by the controller's tests and by ``scripts/controller_scenarios.py`` and
``scripts/replay_positions.py``.

Synthetic worlds (:class:`World`, :func:`simulate`). Per step and per depth d, the draft's top-1 probability
conf_d is drawn from ``confidence``; every node at depth d - 1 proposes children of probabilities conf,
(1 - conf)/2, (1 - conf)/4, (1 - conf)/8 by rank. The target's token at depth d is the draft's rank-r child with
probability ``agree`` * c_r and a token the draft did not rank otherwise. Trees follow TALON's rule (top-K root
children, then a gate mu relative to the layer pool's maximum, the overflow cut to the budget) and are accepted
greedily. Costs are functions of the tree size and the forward width with seeded multiplicative noise, optional
slow spells of the machine, and the draft LM's catch-up (the first forward after plain steps also forwards the
tokens they committed). The draws of step s depend only on (seed, s) and the depth, never on the budget (common
random numbers).

Replays (:class:`Turn`, :func:`replay`): ``scripts/record_positions.py`` records the draft LM's TALON tree at every
position of the target's greedy answers; a step of budget k at position t is the first k nodes of the tree
recorded at t (the prefix property), accepts the longest path spelling the answer from t, and costs what a
:class:`Hardware` measured.
"""

from __future__ import annotations

import gzip
import json
import math
import pathlib
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from ..control import LADDER, StepRecord
from .datasets import check_limit

RANKS = 4  # children the synthetic draft ranks under each node


def measured_curve(table: dict[int, float]) -> Callable[[float], float]:
    """Seconds by size from a table of milliseconds: linear between its sizes and past the last, flat below the first."""
    sizes = sorted(table)

    def seconds(size: float) -> float:
        right = next((i for i, s in enumerate(sizes) if s >= size), len(sizes) - 1)
        if sizes[right] == size or right == 0:
            return table[sizes[right]] / 1000
        x0, x1 = sizes[right - 1], sizes[right]
        return (table[x0] + (table[x1] - table[x0]) * (size - x0) / (x1 - x0)) / 1000

    return seconds


# ------------------------------------------------------------------------------------------ measured machines
PAIR_WEIGHT_SHARE = 0.273  # the 0.5B draft's linear weights over the 1.5B target's (talon_sd.lm.linear_weights)
CPU_FACTS_MS = {  # one target forward over T tokens, the 1.5B target on the project's CPU (shared/reference)
    "bf16": {1: 163, 2: 137, 4: 138, 8: 161, 16: 195, 32: 273, 64: 432},
    "fp32": {1: 317, 2: 653, 4: 596, 8: 558, 16: 696, 32: 943, 64: 1439},
}
# AVX2-only AMD EPYC, float32 packed target (scripts/forward_costs.py), with the draft's linears in float32 / in int8
AVX2_FP32_MS = {"target": {1: 550, 2: 868, 4: 979, 8: 1031, 16: 1214, 32: 1596, 64: 2300},
                "draft": {1: 199, 2: 318, 4: 357, 8: 371, 16: 489, 32: 627, 64: 900}}
AVX2_INT8_MS = {"target": {1: 406, 2: 610, 4: 647, 8: 688, 16: 875, 24: 971, 32: 1130, 64: 1913},
                "draft": {1: 54, 2: 58, 4: 61, 8: 72, 16: 112, 24: 148, 32: 192, 64: 364}}
# the same machine (2026-12-06) as the decoding loop pays it: plain steps as docs/bench/sweep-avx2-t1's plain decoding
# (284 ms a step), trees as scripts/forward_costs.py --variants float32:auto:auto times them x 0.92, which matches
# that run's fixed N = 4 and 16 verify steps (540, 790 ms)
AVX2_LOOP_MS = {"target": {1: 284, 2: 474, 4: 531, 8: 594, 12: 678, 16: 811, 24: 929, 32: 1124, 64: 1885},
                "draft": {1: 63, 2: 61, 4: 67, 8: 78, 12: 98, 16: 142, 24: 165, 32: 216, 64: 443}}
# the same machine with --quantize int4 (talon-sd's AVX2 kernels, float32 activations; 2026-12-06,
# scripts/forward_costs.py --variants float32:auto:int4 --sizes 1,2,4,8,16,32,64 --repeats 3): verify rows cost
# ~18 ms each past 4 (the int8 dot product is compute-bound there), a draft forward half a target step
AVX2_INT4_MS = {"target": {1: 60, 2: 69, 4: 92, 8: 152, 16: 293, 32: 557, 64: 1071},
                "draft": {1: 32, 2: 33, 4: 50, 8: 74, 16: 118, 32: 218, 64: 438}}
NGRAM_MS = {1: 0.4, 2: 0.6, 4: 1.0, 8: 1.8, 16: 3.5, 32: 7, 64: 14}  # prompt lookup: ~0.2 ms a node, estimated from
# the draft seconds per step of the AVX2 int4 n-gram run of 2026-12-06 (0.4-1.1 ms; docs/bench/int4-ngram-avx2 in
# git history, commit 9ff7b5a), not timed by width
# Intel Xeon with AMX: float32 with torch's own kernels (a 2-token verify 1.04x one token, 4 tokens 1.9x), and bf16
INTEL_FP32_MS = {"target": {1: 232, 2: 243, 4: 450, 8: 636, 16: 656, 32: 752, 64: 1100},
                 "draft": {1: 88, 2: 91, 4: 178, 8: 216, 16: 248, 32: 284, 64: 420}}
INTEL_BF16_MS = {"target": {1: 209, 2: 204, 4: 205, 8: 213, 16: 220, 32: 241, 64: 300},
                 "draft": {1: 92, 2: 93, 4: 95, 8: 100, 16: 105, 32: 119, 64: 140}}
# AMD EPYC with AVX512-BF16, bf16 (scripts/forward_costs.py --variants bfloat16:auto)
EPYC_BF16_MS = {"target": {1: 136, 2: 127, 4: 135, 8: 152, 12: 159, 16: 184, 20: 193, 24: 203, 32: 231, 48: 291,
                           64: 366},
                "draft": {1: 48, 2: 52, 4: 51, 8: 60, 12: 64, 16: 70, 20: 75, 24: 79, 32: 94, 48: 121, 64: 151}}


@dataclass(frozen=True)
class Hardware:
    """What a step costs on one measured machine: verify (ms by tree size), draft forward (ms by width), the
    rest of a step, the draft LM's catch-up per token, and the target's prefill by prompt length."""

    verify_ms: dict
    draft_ms: dict
    other_seconds: float
    catch_up_seconds: float  # draft LM seconds per token forwarded beside the root (prompt, plain steps' tokens)
    prefill_base: float
    prefill_per_token: float
    verify_context_slope: float = 0.0  # verify seconds per tree node per context token beyond 200

    def verify_seconds(self, curve, size: int, context: int) -> float:
        return max(curve(size) + self.verify_context_slope * size * (context - 200), 0.5 * curve(size))

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return self.prefill_base + self.prefill_per_token * prompt_tokens


HARDWARE = {  # the sources of each are in git history (docs/BENCHMARKS.md before the rewrite, section 5)
    "intel-bf16": Hardware(INTEL_BF16_MS["target"], INTEL_BF16_MS["draft"], 0.004, 0.0008, 0.2, 0.0017),
    "avx2-fp32": Hardware(AVX2_FP32_MS["target"], AVX2_FP32_MS["draft"], 0.015, 0.008, 0.3, 0.027),
    "avx2-fp32-steep": Hardware({1: 290, 2: 540, 4: 668, 8: 760, 16: 880, 32: 1200, 64: 2150},
                                {1: 160, 2: 204, 4: 239, 8: 288, 16: 320, 32: 440, 64: 720}, 0.015, 0.008, 0.3, 0.027),
    "avx2-fp32-int8": Hardware(AVX2_INT8_MS["target"], AVX2_INT8_MS["draft"], 0.015, 0.004, 0.3, 0.024),
    "avx2-fp32-int8-loop": Hardware(AVX2_LOOP_MS["target"], AVX2_LOOP_MS["draft"], 0.015, 0.004, 0.3, 0.024),
    "avx2-int4": Hardware(AVX2_INT4_MS["target"], AVX2_INT4_MS["draft"], 0.005, 0.006, 0.1, 0.02),
    "avx2-int4-ngram": Hardware(AVX2_INT4_MS["target"], NGRAM_MS, 0.005, 0.0, 0.1, 0.02),  # n-gram recordings
    "epyc-fp32-default": Hardware({1: 448, 2: 837, 4: 786, 8: 787, 12: 1002, 16: 1064, 20: 1209, 24: 1184, 32: 1315,
                                   48: 1772, 64: 2147},
                                  {1: 137, 2: 278, 4: 252, 8: 251, 12: 281, 16: 316, 20: 373, 24: 390, 32: 460,
                                   48: 554, 64: 621}, 0.015, 0.011, 0.8, 0.019),
    "epyc-bf16": Hardware(EPYC_BF16_MS["target"], EPYC_BF16_MS["draft"], 0.004, 0.0014, 0.02, 0.0041,
                          verify_context_slope=2e-6),
    "h200-eager-bf16": Hardware({1: 22, 2: 24, 4: 23, 8: 24, 16: 24, 32: 26, 64: 28},
                                {1: 19, 2: 19, 4: 19, 8: 19, 16: 19, 32: 19, 64: 19}, 0.0056, 0.0002, 0.02, 0.00002),
}


# ------------------------------------------------------------------------------------------ synthetic worlds
@dataclass(frozen=True)
class World:
    """A synthetic drafter, target and machine (module docstring). Seconds are arbitrary units."""

    verify: Callable[[int], float]  # tree size -> seconds of the verify forward
    draft: Callable[[int], float]  # forward width -> seconds of one draft forward
    other: float = 0.02  # seconds of the rest of each step
    agree: float = 0.9
    confidence: tuple[float, float] = (0.5, 0.95)
    topk: int = 4
    mu: float = 0.03
    noise: float = 0.05  # relative standard deviation of every measured time
    spell_share: float = 0.0  # share of blocks of spell_steps steps in which the machine runs slow
    spell_steps: int = 8
    spell_slowdown: float = 1.3
    catch_up: float = 0.0  # extra seconds of a step's first draft forward per token committed without drafting
    report_confidence: bool = True  # steps report the target's confidence per committed token
    sampled: bool = False  # sampled decoding (temperature-1-like acceptance): prices an unmeasured catch-up


def world_on(costs: dict, catch_up: float = 0.0, other: float = 0.005, **acceptance) -> World:
    """A world on a measured machine: ``costs`` {"target": ms by size, "draft": ms by width}, or a target table
    alone (the draft forward then costs 0.3 x the target's at its width, a 0.5B draft beside a 1.5B target)."""
    verify = measured_curve(costs.get("target", costs))
    draft = measured_curve(costs["draft"]) if "draft" in costs else (lambda width: 0.3 * verify(width))
    return World(verify=verify, draft=draft, other=other, catch_up=catch_up, **acceptance)


@dataclass
class Run:
    budgets: list[int] = field(default_factory=list)  # [steps] budget each step was given
    choices: list[int] = field(default_factory=list)  # [steps] the controller's choice then (controller runs)
    reasons: list[str] = field(default_factory=list)  # [steps] why (controller runs)
    tokens: list[int] = field(default_factory=list)  # [steps] committed tokens (bonus included)
    seconds: list[float] = field(default_factory=list)  # [steps] simulated wall time

    def rate(self, start: int = 0, stop: int | None = None) -> float:
        return sum(self.tokens[start:stop]) / sum(self.seconds[start:stop])

    def mean_budget(self, start: int = 0, stop: int | None = None) -> float:
        chosen = self.budgets[start:stop]
        return sum(chosen) / len(chosen)


def _child_probabilities(confidence: float) -> list[float]:
    return [confidence] + [(1 - confidence) * 0.5 ** r for r in range(1, RANKS)]


def simulate_step(world: World, seed: int, index: int, budget: int, pending: int) -> StepRecord:
    """One TALON step of ``budget`` nodes in ``world``; ``pending`` tokens wait in the drafter."""
    text = random.Random(f"text {seed} {index}")  # depth-wise draws: the same for every budget
    clock = random.Random(f"clock {seed} {index}")  # timing noise
    slow = (world.spell_share > 0
            and random.Random(f"spell {seed} {index // world.spell_steps}").random() < world.spell_share)
    draws: list[tuple[float, float, float]] = []

    def at_depth(depth: int) -> tuple[float, float, float]:
        while len(draws) < depth:
            draws.append((text.uniform(*world.confidence), text.random(), text.random()))
        return draws[depth - 1]

    def measured(seconds: float) -> float:
        return max(0.0, seconds * (1 + world.noise * clock.gauss(0, 1)) * (world.spell_slowdown if slow else 1.0))

    log_p, parent, depth = [0.0], [-1], [0]
    child_at: dict[tuple[int, int], int] = {}
    frontier, widths, prefix, draft_seconds = [0], [], [], []
    while len(log_p) < budget:
        layer = depth[frontier[0]] + 1
        log_c = [math.log(c) for c in _child_probabilities(at_depth(layer)[0])]
        room = budget - len(log_p)
        if len(log_p) == 1:  # the top-K children of the root
            candidates = [(log_c[r], 0, r) for r in range(min(world.topk, RANKS, room))]
        else:  # the gate relative to the pool's maximum
            pool = [(log_p[v] + log_c[r], v, r) for v in frontier for r in range(RANKS)]
            best = max(c[0] for c in pool)
            candidates = [c for c in pool if c[0] >= best + math.log(world.mu)]
        candidates = sorted(candidates, key=lambda c: -c[0])[:room]
        catch_up = world.catch_up * (pending - 1) if not widths else 0.0
        draft_seconds.append(measured(world.draft(len(frontier))) + catch_up)
        widths.append(len(frontier))
        first_new = len(log_p)
        for score, v, r in candidates:
            child_at[(v, r)] = len(log_p)
            log_p.append(score)
            parent.append(v)
            depth.append(layer)
        frontier = list(range(first_new, len(log_p)))
        prefix.append(len(log_p))
    position, accepted = 0, []
    while True:  # greedy acceptance: follow the target's token while the tree has it
        confidence, agree_draw, rank_draw = at_depth(depth[position] + 1)
        if agree_draw >= world.agree:
            break
        rank, total = None, 0.0
        for r, c in enumerate(_child_probabilities(confidence)):
            total += c
            if rank_draw < total:
                rank = r
                break
        if rank is None or (position, rank) not in child_at:
            break
        position = child_at[(position, rank)]
        accepted.append(position)
    confidence = ()
    if world.report_confidence:  # the target's top-1 probability: the draft's where the draft ranks the target's
        # token (a calibrated draft), half of it where it does not
        confidence = tuple(c if agree < world.agree else 0.5 * c
                           for c, agree, _ in (at_depth(d) for d in range(1, len(accepted) + 2)))
    return StepRecord(node_parent=tuple(parent), accepted=tuple(accepted), forward_widths=tuple(widths),
                      prefix_after_forward=tuple(prefix), draft_seconds=tuple(draft_seconds),
                      verify_seconds=measured(world.verify(len(log_p))), other_seconds=measured(world.other),
                      budget=budget, complete=len(log_p) < budget, confidence=confidence)


def simulate(world_at: Callable[[int], World] | World, steps: int | None, policy, seed: int = 0, prompt: int = 1,
             tell_catch_up: bool = True, tokens: int | None = None) -> Run:
    """Run ``steps`` steps with a fixed budget or a controller; ``world_at(step)`` may change the world. The
    drafter starts with ``prompt`` tokens to forward (the root included), as a draft LM does; the controller is
    told how many wait unless ``tell_catch_up`` is False. With ``tokens`` (and ``steps`` None) the run is a
    request of that many new tokens: the controller is told the tokens left and the last step is cut to them."""
    world_of = world_at if callable(world_at) and not isinstance(world_at, World) else (lambda _: world_at)
    controller = None if isinstance(policy, int) else policy
    run, pending, index = Run(), prompt, 0
    if controller is not None:  # the loop's estimate (target prefill per row x the draft's share of its weights) is
        controller.catch_up_row = world_of(0).draft(64) / 64 if world_of(0).sampled else 0.0  # the draft's 64 rows
    while (index < steps) if steps is not None else (sum(run.tokens) < tokens):
        left = None if tokens is None else tokens - sum(run.tokens)
        if controller is not None:
            budget = controller.next_budget(pending - 1 if tell_catch_up else 0, left if tell_catch_up else None)
            run.choices.append(controller.choice)
            run.reasons.append(controller.reason)
        else:
            budget = policy
        record = simulate_step(world_of(index), seed, index, budget, pending)
        if controller is not None:
            controller.observe(record)
        committed = len(record.accepted) + 1 if left is None else min(len(record.accepted) + 1, left)
        index += 1
        pending = 1 if record.forward_widths else pending + committed
        run.budgets.append(budget)
        run.tokens.append(committed)
        run.seconds.append(sum(record.draft_seconds) + record.verify_seconds + record.other_seconds)
    return run


def fixed_rates(world: World, steps: int, seed: int = 0, max_budget: int = 64) -> dict[int, float]:
    """Brute force: tokens/s of every ladder budget held fixed, on the same text."""
    return {k: simulate(world, steps, k, seed).rate() for k in LADDER if k <= max_budget}


def rate_ratio(runs: list[Run], others: list[Run]) -> float:
    """Tokens per second over ``runs`` against over ``others``."""
    return (sum(sum(r.tokens) for r in runs) / sum(sum(r.seconds) for r in runs)) / (
        sum(sum(p.tokens) for p in others) / sum(sum(p.seconds) for p in others))


# ------------------------------------------------------------------------------------------ recorded replays
@dataclass
class Turn:
    """One recorded prompt turn: the answer and the draft LM's tree at every position of it."""

    index: int
    dataset: str
    prompt_tokens: int
    answer: list[int]
    confidence: list[float]  # the target's top-1 probability before each answer token
    positions: list[dict]
    question_id: str = ""  # the dataset's question (an MT-Bench question has two turns)
    drafter: str = "model"  # who drafted the recorded trees: the draft LM ("model") or "ngram"
    sampled: bool = False  # a seeded sampled text (the loop prices an unmeasured catch-up only then)
    children: list[dict] = field(default_factory=list)  # per position: (parent, token) -> inclusion position

    def __post_init__(self) -> None:
        self.children = [{(parent, token): place for place, (parent, token) in
                          enumerate(zip(p["parents"], p["tokens"])) if parent >= 0} for p in self.positions]


def load_turns(paths: list[pathlib.Path]) -> list[Turn]:
    """The recorded turns of ``paths`` (JSON lines, or gzipped ones ending in .gz), in the run's order."""
    rows = {}
    for path in paths:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        for line in text.splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["index"]] = {"sampled": path.name.split(".")[0].endswith("-t1"), **row}  # *-t1: sampled
    return [Turn(index=r["index"], dataset=r["dataset"], prompt_tokens=r["prompt_tokens"], answer=r["answer"],
                 confidence=r["confidence"], positions=r["positions"], question_id=str(r.get("question_id", "")),
                 drafter=r.get("drafter", "model"), sampled=r["sampled"]) for _, r in sorted(rows.items())]


def first_questions(turns, limit: int):
    """The turns of each dataset's first ``limit`` questions, in order, as ``talon bench --limit`` picks them."""
    check_limit(limit)
    firsts: dict = defaultdict(list)
    for turn in turns:
        if turn.question_id not in firsts[turn.dataset] and len(firsts[turn.dataset]) < limit:
            firsts[turn.dataset].append(turn.question_id)
    return [turn for turn in turns if turn.question_id in firsts[turn.dataset]]


@dataclass
class Clock:
    verify: Callable[[float], float]
    draft: Callable[[float], float]
    hardware: Hardware
    noise: float
    draws: random.Random

    def measured(self, seconds: float) -> float:
        return max(0.0, seconds * (1 + self.noise * self.draws.gauss(0, 1)))


def make_clock(hardware: Hardware, noise: float, seed: str | int) -> Clock:
    return Clock(measured_curve(hardware.verify_ms), measured_curve(hardware.draft_ms), hardware, noise,
                 random.Random(seed))


def replay_step(turn: Turn, start: int, budget: int, pending: int, clock: Clock, tokens_left: int) -> StepRecord:
    """The step of ``budget`` nodes at answer position ``start`` (``pending`` tokens wait in the drafter)."""
    context, hardware = turn.prompt_tokens - 1 + start, clock.hardware  # the target's cache before the step
    verify = lambda size: clock.measured(hardware.verify_seconds(clock.verify, size, context))  # noqa: E731
    if budget == 1:
        return StepRecord(node_parent=(-1,), accepted=(), forward_widths=(), prefix_after_forward=(),
                          draft_seconds=(), verify_seconds=verify(1),
                          other_seconds=clock.measured(hardware.other_seconds), budget=1, complete=False,
                          confidence=(turn.confidence[start],))
    tree = turn.positions[start]
    size = min(budget, len(tree["tokens"]))
    forwards = [j for j in range(len(tree["widths"])) if j == 0 or tree["prefix"][j - 1] < budget]
    accepted, node = [], 0
    while start + len(accepted) < len(turn.answer):
        child = turn.children[start].get((node, turn.answer[start + len(accepted)]))
        if child is None or child >= size:
            break
        accepted.append(child)
        node = child
    accepted = accepted[:max(tokens_left - 1, 0)]
    draft_seconds = [clock.measured(clock.draft(tree["widths"][j])) for j in forwards]
    draft_seconds[0] += hardware.catch_up_seconds * (pending - 1)
    return StepRecord(node_parent=tuple(tree["parents"][:size]), accepted=tuple(accepted),
                      forward_widths=tuple(tree["widths"][j] for j in forwards),
                      prefix_after_forward=tuple(min(tree["prefix"][j], size) for j in forwards),
                      draft_seconds=tuple(draft_seconds), verify_seconds=verify(size),
                      other_seconds=clock.measured(hardware.other_seconds), budget=budget, complete=size < budget,
                      confidence=tuple(turn.confidence[start:start + len(accepted) + 1]))


def replay_turn(turn: Turn, policy, clock: Clock, max_new_tokens: int,
                tokens: int | None = None) -> tuple[int, float, list[int], list[str]]:
    """(tokens, seconds, budgets, reasons) of one request under a controller or a fixed budget."""
    controller = None if isinstance(policy, int) else policy
    length = min(len(turn.answer) if tokens is None else tokens, len(turn.answer), max_new_tokens)
    position, pending, budgets, reasons = 0, turn.prompt_tokens, [], []
    seconds = clock.hardware.prefill_seconds(turn.prompt_tokens)
    if controller is not None:  # as the loop prices it
        sampled = turn.sampled and turn.drafter == "model"
        controller.catch_up_row = clock.hardware.prefill_per_token * PAIR_WEIGHT_SHARE if sampled else 0.0
    while position < length:
        if controller is not None:
            budget = controller.next_budget(pending - 1, max_new_tokens - position)
            reasons.append(controller.reason)
        else:
            budget = policy
        record = replay_step(turn, position, budget, pending, clock, length - position)
        if controller is not None:
            controller.observe(record)
        committed = len(record.accepted) + 1
        position += committed
        pending = 1 if record.forward_widths else pending + committed
        seconds += sum(record.draft_seconds) + record.verify_seconds + record.other_seconds
        budgets.append(budget)
    return length, seconds, budgets, reasons


def replay(turns: list[Turn], seed: int, policies: dict, noise: float, max_new_tokens: int, hardware: Hardware,
           trace: list | None = None) -> dict:
    """Per dataset ('all' too) and policy label: [tokens, seconds]. ``policies``: label -> a fixed budget or a
    controller factory (called once, then carried from turn to turn after an 8-token warm-up, as a generator
    serving requests carries it). Every policy's clock of a turn draws from the same seed. ``trace``, if
    given, receives per turn (turn, {label: (budgets, reasons, seconds)})."""
    totals: dict = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    controllers = {}
    for label, policy in policies.items():
        if not isinstance(policy, int):
            controllers[label] = policy()
            replay_turn(turns[0], controllers[label], make_clock(hardware, noise, f"warm-up {seed}"), max_new_tokens,
                        tokens=8)
    for turn in turns:
        steps = {}
        for label, policy in policies.items():
            if label in controllers:
                policy = controllers[label] = controllers[label].for_next_sequence()
            clock = make_clock(hardware, noise, f"{seed} {turn.index} {label if isinstance(policy, int) else 'auto'}")
            tokens, seconds, budgets, reasons = replay_turn(turn, policy, clock, max_new_tokens)
            for key in (turn.dataset, "all"):
                totals[key][label][0] += tokens
                totals[key][label][1] += seconds
            steps[label] = (budgets, reasons, seconds)
        if trace is not None:
            trace.append((turn, steps))
    return totals
