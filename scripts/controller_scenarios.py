"""The online budget controller in synthetic request sequences: rate against plain decoding, and why.

Runs :class:`talon_sd.control.BudgetController` through the synthetic worlds of :mod:`talon_sd.bench.simulate`
(no model, no clock: a drafter, target and machine simulated from measured cost curves, common random
numbers per step), one request after another as a server or ``talon bench`` would, and prints per scenario
the controller's rate over plain decoding's on the same text (min / median / mean / max over seeds), the same for
a fixed N = 8, and the steps by the controller's reason (:data:`talon_sd.control.REASONS`). Rows marked
"hostile" are those where plain decoding beats every fixed tree. Change the controller, rerun, compare.

    python scripts/controller_scenarios.py [--seeds 16] [--set exploration=0.05]

Scenarios: float32 (verifying T tokens costs about T one-token steps) and bf16 (nearly flat) costs of this
CPU, code / mid / chat acceptance, six 64-token requests with 120-token prompts (the first request, where a
fresh controller learns its costs, left out); float32 code and chat with 200-token prompts whose draft-LM
catch-up is dear; a float32 sequence of six chat then four code requests; 16-token QA answers after two
64-token chat requests; three chat requests then three 700-token-prompt summaries on the AVX2-only EPYC's
int8-draft costs at temperature 1, and the summaries alone; float32 costs of an Intel Xeon with AMX, where only a
2-node tree is cheap to verify, 128-token requests; and bf16 costs of that Xeon (verification flat to 32 tokens)
with acceptance like the real Qwen pair's, five code then five chat requests of 128 tokens, scored against the
best fixed N of each block.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
from collections import Counter

from talon_sd.bench.simulate import (AVX2_INT8_MS, CPU_FACTS_MS, INTEL_BF16_MS, INTEL_FP32_MS, World, measured_curve,
                                     rate_ratio as ratio, simulate)
from talon_sd.control import BudgetController, ControllerSettings

CODE = dict(agree=0.95, confidence=(0.7, 0.99))  # a 0.5B draft on code


def summaries_world(catch_up: float = 0.004, slower: float = 1.3) -> World:
    """Sum at temperature 1 on the AVX2-only EPYC with the int8 draft (700-token prompts): every verify ``slower`` x
    the measured curve over the long context, the target confident (0.6-0.97) where the draft is right 60% of the
    time, the draft's catch-up ``catch_up`` seconds a token (0.004 measured there). No fixed budget beats plain."""
    verify, draft = measured_curve(AVX2_INT8_MS["target"]), measured_curve(AVX2_INT8_MS["draft"])
    return World(verify=lambda size: slower * verify(size), draft=draft, other=0.015, agree=0.6,
                 confidence=(0.6, 0.97), catch_up=catch_up, sampled=True)
# Acceptance like the real Qwen pair's (greedy, bf16 sweep 12 on that CPU): stretches of easy and hard text
# (a Markov chain over steps), fitted so that fixed N = 8 / 16 / 24 commit about what the real pair's did per
# step (code: 4.1 / 8.9 / 13.0 against humaneval's 4.3 / 9.6 / 13.8; chat: 3.1 / 4.8 / 5.9 against mt_bench's
# 3.3 / 4.7 / 5.3) and the rate is flat within 2-3% from N = 12 to 24, as the real columns were
REAL_PAIR = {  # (easy text, hard text, P(easy), P(a step stays in the last step's stretch))
    "code": (dict(agree=0.999, confidence=(0.97, 0.9995)), dict(agree=0.9, confidence=(0.6, 0.95)), 0.7, 0.85),
    "chat": (dict(agree=0.995, confidence=(0.93, 0.999)), dict(agree=0.8, confidence=(0.5, 0.9)), 0.45, 0.7),
}


def stretches(kind: str, seed: int, catch_up: float = 0.002, spells: float = 0.0):
    """A world by step (for :func:`simulate`): REAL_PAIR's easy and hard stretches on the Intel bf16 costs
    (``spells``: the share of 8-step blocks in which the machine runs 1.3x slow)."""
    easy, hard, p_easy, stay = REAL_PAIR[kind]
    easy, hard = (dataclasses.replace(world("intel-bf16", catch_up, **acceptance), spell_share=spells)
                  for acceptance in (easy, hard))
    draws, states = random.Random(f"stretches {seed}"), []

    def at(step: int) -> World:
        while len(states) <= step:
            states.append(states[-1] if states and draws.random() < stay else draws.random() < p_easy)
        return easy if states[step] else hard
    return at


def real_pair_sequence(seeds: int, settings: ControllerSettings, count: int = 5, tokens: int = 128,
                       prompt: int = 120, spells: float = 0.0):
    """Per block (code, then chat, one controller carried through as in ``talon sweep``): auto over the best
    budget held fixed through the block (the issue's bar), and auto over N = 16."""
    out = {kind: ([], [], Counter()) for kind in REAL_PAIR}
    for seed in range(seeds):
        controller = None
        for kind in REAL_PAIR:
            runs, fixed = [], {k: [] for k in (8, 12, 16, 20, 24, 32)}
            for request in range(count):
                controller = (BudgetController(settings) if controller is None
                              else controller.for_next_sequence())
                run_seed = 1000 * seed + 10 * request + (kind == "code")
                runs.append(simulate(stretches(kind, run_seed, spells=spells), None, controller, seed=run_seed,
                                     prompt=prompt, tokens=tokens))
                for k in fixed:
                    fixed[k].append(simulate(stretches(kind, run_seed, spells=spells), None, k, seed=run_seed,
                                             prompt=prompt, tokens=tokens))
                out[kind][2].update(runs[-1].reasons)
            best = max(fixed.values(), key=lambda f: ratio(f, runs))
            out[kind][0].append(ratio(runs, best))
            out[kind][1].append(ratio(runs, fixed[16]))
    return out


def world(dtype: str, catch_up: float, report_confidence: bool = True, **acceptance) -> World:
    if dtype in ("intel-fp32", "intel-bf16"):
        costs = INTEL_FP32_MS if dtype == "intel-fp32" else INTEL_BF16_MS
        verify, draft = measured_curve(costs["target"]), measured_curve(costs["draft"])
    else:
        verify = measured_curve(CPU_FACTS_MS[dtype])
        draft = lambda width: 0.3 * verify(width)  # noqa: E731
    return World(verify=verify, draft=draft, other=0.005, catch_up=catch_up,
                 report_confidence=report_confidence, **acceptance)


def requests(text: World, seeds: int, settings: ControllerSettings, count: int = 6, prompt: int = 120,
             tokens: int = 64, fixed_budget: int = 8):
    """Per seed: auto / plain and N = fixed_budget / plain over requests 2..count, and the auto runs' reasons."""
    autos, fixed, reasons = [], [], Counter()
    for seed in range(seeds):
        controller = BudgetController(settings)
        runs, plains, fixed_runs = [], [], []
        for request in range(count):
            run_seed = 100 * seed + request
            run = simulate(text, None, controller, seed=run_seed, prompt=prompt, tokens=tokens)
            if request:
                runs.append(run)
                plains.append(simulate(text, None, 1, seed=run_seed, prompt=prompt, tokens=tokens))
                fixed_runs.append(simulate(text, None, fixed_budget, seed=run_seed, prompt=prompt, tokens=tokens))
                reasons.update(run.reasons)
            controller = controller.for_next_sequence()
        autos.append(ratio(runs, plains))
        fixed.append(ratio(fixed_runs, plains))
    return autos, fixed, reasons


def chat_then_code(seeds: int, settings: ControllerSettings, prompt: int = 60, catch_up: float = 0.005):
    chat = world("fp32", catch_up, agree=0.8, confidence=(0.3, 0.9))
    code = world("fp32", catch_up, agree=0.98, confidence=(0.85, 0.999))
    out = {"chat": ([], Counter()), "code": ([], Counter())}
    for seed in range(seeds):
        controller = None
        for block, text, count in (("chat", chat, 6), ("code", code, 4)):
            runs, plains = [], []
            for request in range(count):
                controller = (BudgetController(settings) if controller is None
                              else controller.for_next_sequence())
                run_seed = 100 * seed + 10 * request + (block == "code")
                runs.append(simulate(text, None, controller, seed=run_seed, prompt=prompt, tokens=64))
                plains.append(simulate(text, None, 1, seed=run_seed, prompt=prompt, tokens=64))
                out[block][1].update(runs[-1].reasons)
            out[block][0].append(ratio(runs, plains))
    return out


def chat_then_summaries(seeds: int, settings: ControllerSettings, slower: float = 1.3, fixed_budget: int = 8,
                        chats: int = 3, summaries: int = 3, catch_up: float = 0.011):
    """The AVX2-only EPYC with the int8 draft at temperature 1: ``chats`` 128-token chat requests
    (100-token prompts), then ``summaries`` summaries (700-token prompts, every verify ``slower`` x as dear over the
    long context, the target confident where the draft is right only 60% of the time), the draft's catch-up
    ``catch_up`` seconds a token (0.011: the float32 draft on the AVX512-BF16 EPYC; the int8 draft measured 0.004 on
    the AVX2 host). Per block (the chat, the first summary, the others): per
    seed auto / plain and N = fixed_budget / plain, and the auto runs' reasons."""
    if summaries < 2:
        raise ValueError(f"summaries: got {summaries}, expected at least 2 (a first one and the others)")
    verify, draft = measured_curve(AVX2_INT8_MS["target"]), measured_curve(AVX2_INT8_MS["draft"])
    chat = World(verify=verify, draft=draft, other=0.015, agree=0.85, confidence=(0.5, 0.95), catch_up=catch_up,
                 sampled=True)
    summary = summaries_world(catch_up, slower)
    later = f"summaries 2-{summaries}"
    blocks = (("chat",) if chats else ()) + ("first summary", later)
    out = {block: ([], [], Counter()) for block in blocks}
    for seed in range(seeds):
        controller = BudgetController(settings)
        runs = {block: ([], [], []) for block in blocks}  # auto, plain, fixed runs
        for request in range(chats + summaries):
            text, prompt = (chat, 100) if request < chats else (summary, 700)
            block = "chat" if request < chats else "first summary" if request == chats else later
            run_seed = 10 * seed + request if request < chats else 1000 + 10 * seed + request - chats
            runs[block][0].append(simulate(text, None, controller, seed=run_seed, prompt=prompt, tokens=128))
            for kept, budget in ((runs[block][1], 1), (runs[block][2], fixed_budget)):
                kept.append(simulate(text, None, budget, seed=run_seed, prompt=prompt, tokens=128))
            out[block][2].update(runs[block][0][-1].reasons)
            controller = controller.for_next_sequence()
        for block, (autos, plains, fixed) in runs.items():
            out[block][0].append(ratio(autos, plains))
            out[block][1].append(ratio(fixed, plains))
    return out


def short_answers(seeds: int, settings: ControllerSettings):
    chat = world("fp32", 0.005, report_confidence=False, agree=0.65, confidence=(0.25, 0.8))
    autos, reasons = [], Counter()
    for seed in range(seeds):
        controller = BudgetController(settings)
        for request in range(2):
            simulate(chat, None, controller, seed=100 * seed + request, prompt=50, tokens=64)
            controller = controller.for_next_sequence()
        runs, plains = [], []
        for request in range(8):
            run_seed = 100 * seed + 10 + request
            runs.append(simulate(chat, None, controller, seed=run_seed, prompt=30, tokens=16))
            plains.append(simulate(chat, None, 1, seed=run_seed, prompt=30, tokens=16))
            reasons.update(runs[-1].reasons)
            controller = controller.for_next_sequence()
        autos.append(ratio(runs, plains))
    return autos, reasons


def line(name: str, autos: list[float], reasons: Counter, fixed: list[float] | None = None) -> str:
    shown = ", ".join(f"{k} {n}" for k, n in reasons.most_common(4))
    eight = f"{statistics.median(fixed):.3f}" if fixed else "-"
    return (f"| {name} | {min(autos):.3f} | {statistics.median(autos):.3f} | {statistics.mean(autos):.3f} | "
            f"{max(autos):.3f} | {eight} | {shown} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a ControllerSettings field for every scenario (e.g. anchor_z=0); repeatable")
    args = parser.parse_args()
    seeds = args.seeds
    settings = ControllerSettings(**{name: json.loads(value)
                                     for name, value in (item.split("=", 1) for item in args.set)})
    print("| scenario | auto / plain min | median | mean | max | N=8 / plain median | steps by reason (top 4) |")
    print("|---|---|---|---|---|---|---|")
    worlds = {
        "fp32 code": world("fp32", 0.005, agree=0.995, confidence=(0.9, 0.999)),
        "fp32 mid": world("fp32", 0.005, agree=0.95, confidence=(0.7, 0.99)),
        "fp32 chat": world("fp32", 0.005, agree=0.8, confidence=(0.3, 0.9)),
        "bf16 code": world("bf16", 0.002, **CODE),
        "bf16 chat": world("bf16", 0.002, agree=0.8, confidence=(0.3, 0.9)),
    }
    for name, text in worlds.items():
        autos, fixed, reasons = requests(text, seeds, settings)
        print(line(name, autos, reasons, fixed))
    # humaneval in float32 on the real pair: a 200-token prompt whose draft-LM catch-up exceeds 5% of a
    # 64-token answer's plain seconds
    for name, text in (("fp32 code, 200-token prompt", worlds["fp32 code"]),
                       ("fp32 chat, 200-token prompt", worlds["fp32 chat"])):
        autos, fixed, reasons = requests(dataclasses.replace(text, catch_up=0.008), seeds, settings, prompt=200)
        print(line(name, autos, reasons, fixed))
    for block, (autos, reasons) in chat_then_code(max(seeds * 3 // 4, 1), settings).items():
        print(line(f"fp32 chat -> code: {block}", autos, reasons))
    for block, (autos, reasons) in chat_then_code(max(seeds * 3 // 4, 1), settings, prompt=200,
                                                  catch_up=0.008).items():
        print(line(f"fp32 chat -> code, 200-token prompts: {block}", autos, reasons))
    autos, reasons = short_answers(max(seeds * 3 // 4, 1), settings)
    print(line("fp32 16-token QA after chat", autos, reasons))
    for block, (autos, fixed, reasons) in chat_then_summaries(seeds, settings).items():
        print(line(f"AVX2 int8 chat -> 700-token summaries, T = 1-like: {block}", autos, reasons, fixed))
    # the same summaries alone from a fresh controller, the catch-up at the int8 draft's measured 4 ms a token
    #
    for block, (autos, fixed, reasons) in chat_then_summaries(seeds, settings, chats=0, summaries=5,
                                                              catch_up=0.004).items():
        print(line(f"AVX2 int8 700-token summaries alone, 4 ms catch-up, T = 1-like: {block}", autos, reasons,
                   fixed))
    # float32 on the Intel Xeon (AMX), 128-token requests: only the 2-node tree is cheap to verify;
    # "T = 1-like" acceptance is lower agreement; the fixed column is N = 2 here
    for name, text in (("Intel fp32 code, T = 1-like (fixed: N = 2)", world("intel-fp32", 0.004, agree=0.9, confidence=(0.6, 0.99), sampled=True)),
                       ("Intel fp32 chat, T = 1-like (fixed: N = 2)", world("intel-fp32", 0.004, agree=0.7, confidence=(0.3, 0.9), sampled=True)),
                       ("Intel fp32 code, greedy-like (fixed: N = 2)", world("intel-fp32", 0.004, **CODE))):
        autos, fixed, reasons = requests(text, seeds, settings, tokens=128, fixed_budget=2)
        print(line(name, autos, reasons, fixed))
    # bf16 on the Intel Xeon with real-pair-like acceptance: here the columns are auto / the best fixed N of the
    # block (min, median, mean, max over seeds) and auto / N = 16 (median): issue 11's bar is >= 0.97 per dataset
    for kind, (autos, sixteen, reasons) in real_pair_sequence(max(seeds // 2, 1), settings).items():
        print(line(f"Intel bf16 real-pair-like {kind} (auto / best fixed N; fixed: auto / N = 16)", autos, reasons,
                   sixteen))
    # ... and with the 2-core Xeon's slow spells: a fifth of 8-step blocks run 1.3x slow
    for kind, (autos, sixteen, reasons) in real_pair_sequence(max(seeds // 2, 1), settings, spells=0.2).items():
        print(line(f"Intel bf16 real-pair-like {kind}, slow spells (auto / best fixed N; fixed: auto / N = 16)",
                   autos, reasons, sixteen))


if __name__ == "__main__":
    main()
