"""The position replay (scripts/record_positions.py + scripts/replay_positions.py) is exact: on tiny fp32 models a
fixed budget replayed from the trees recorded at every position takes the decoding loop's own steps (same count,
same tokens per step, same draft forwards), and an online controller replayed there only ever commits the text."""

from __future__ import annotations

import pathlib
import random
import sys
from collections import Counter

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))

from conftest import plain_greedy  # noqa: E402
from record_positions import record_turn  # noqa: E402
from replay_positions import HARDWARE, Clock, Turn, replay_step, replay_turn  # noqa: E402

from talon_sd import SpeculativeGenerator  # noqa: E402
from talon_sd.config import TreeConfig  # noqa: E402
from talon_sd.control import BudgetController, ControllerSettings  # noqa: E402

PROMPT = [5, 17, 33, 8, 61, 12]
TOKENS = 40


@pytest.fixture(scope="module")
def recorded(llama_pair):
    target, draft = llama_pair
    generator = SpeculativeGenerator.from_models(target, draft, tree=TreeConfig("talon", budget=16, topk=4, mu=0.03))
    answer = plain_greedy(target, PROMPT, TOKENS + 24)  # past the limit: the last step's whole path
    ids = torch.tensor(PROMPT)
    positions = record_turn(generator, TreeConfig("talon", budget=16, topk=4, mu=0.03), ids, answer)
    turn = Turn(index=0, dataset="tiny", prompt_tokens=len(PROMPT), answer=answer, confidence=[0.5] * len(answer),
                positions=positions)
    return target, draft, turn


def zero_clock() -> Clock:
    return Clock(verify=lambda size: 1.0, draft=lambda width: 0.1, hardware=HARDWARE["intel-bf16"], noise=0.0,
                 draws=random.Random(0))


@pytest.mark.parametrize("budget", [2, 5, 8, 16])
def test_a_replayed_fixed_budget_takes_the_loops_own_steps(recorded, budget):
    target, draft, turn = recorded
    generator = SpeculativeGenerator.from_models(target, draft, tree=TreeConfig("talon", budget=budget, topk=4, mu=0.03))
    result = generator.generate(input_ids=PROMPT, max_new_tokens=TOKENS, ignore_eos=True)
    assert result.token_ids == turn.answer[:TOKENS]
    tokens, _, budgets, _ = replay_turn(turn, budget, zero_clock(), TOKENS, tokens=TOKENS)
    assert tokens == TOKENS and len(budgets) == result.stats.target_forwards
    accepted, forwards, position = Counter(), 0, 0
    while position < TOKENS:  # the same steps one by one: accepted drafts and draft forwards
        record = replay_step(turn, position, budget, 1, zero_clock(), len(turn.answer))
        accepted[len(record.accepted)] += 1
        forwards += len(record.forward_widths)
        position += len(record.accepted) + 1
    assert accepted == Counter(result.stats.accepted_lengths)
    assert forwards == result.stats.draft_forwards


def test_a_replayed_controller_commits_the_whole_answer(recorded):
    _, _, turn = recorded
    controller = BudgetController(ControllerSettings(max_budget=16, initial_budget=8))
    tokens, seconds, budgets, reasons = replay_turn(turn, controller, zero_clock(), TOKENS, tokens=TOKENS)
    assert tokens == TOKENS and seconds > 0
    assert all(1 <= b <= 16 for b in budgets) and len(reasons) == len(budgets)
