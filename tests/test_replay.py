"""The position replay (talon_sd.bench.record + talon_sd.bench.simulate) is exact: on tiny fp32 models a
fixed budget replayed from the trees recorded at every position takes the decoding loop's own steps (same count,
same tokens per step, same draft forwards), and an online controller replayed there only ever commits the text."""

from __future__ import annotations

import json
import pathlib
import random
from collections import Counter

import pytest
import torch

from conftest import plain_greedy
from talon_sd import SpeculativeGenerator
from talon_sd.bench.record import checkpoint_turns, record_turn
from talon_sd.bench.simulate import (HARDWARE, Clock, Turn, first_questions, load_turns, replay, replay_step,
                                     replay_turn)
from talon_sd.config import TreeConfig
from talon_sd.control import BudgetController, ControllerSettings

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


def test_the_recorder_takes_another_variants_answers_and_names_a_missing_label(tmp_path):
    # In bf16 a tree variant's greedy text can leave ar's (a near-tie of the logits): --label records
    # that text, while the prompts (ar's rows) stay those the bench sent.
    path = tmp_path / "checkpoint.jsonl"
    rows = [{"index": 0, "dataset": "alpaca", "question_id": "q", "turn": 1, "label": label, "prompt_tokens": 5,
             "token_ids": ids} for label, ids in (("ar", [1, 2]), ("talon(N=16)", [3, 4, 5]))]
    path.write_text("\n".join(json.dumps(line) for line in [{"fingerprint": {"dtype": "bfloat16"}}] + rows) + "\n")
    fingerprint, ar_rows, answers = checkpoint_turns(path, "talon(N=16)")
    assert fingerprint == {"dtype": "bfloat16"} and [row["token_ids"] for row in ar_rows] == [[1, 2]]
    assert answers == {0: [3, 4, 5]} and checkpoint_turns(path)[2] == {0: [1, 2]}
    with pytest.raises(SystemExit, match="--label: no rows labelled 'N=8'"):
        checkpoint_turns(path, "N=8")


def test_the_trace_holds_each_turns_budgets_and_every_policys_seconds(recorded):
    _, _, turn = recorded
    trace = []
    settings = ControllerSettings(max_budget=16, initial_budget=8)
    policies = {"auto": lambda: BudgetController(settings), 4: 4, 8: 8}
    totals = replay([turn], 0, policies, 0.0, len(turn.answer), HARDWARE["intel-bf16"], trace=trace)
    [(traced, steps)] = trace
    budgets, reasons, _ = steps["auto"]
    assert traced is turn and len(budgets) == len(reasons) > 0 and set(steps) == {"auto", 4, 8}
    assert steps[8][2] == pytest.approx(totals["tiny"][8][1])
    assert set(steps[4][0]) == {4} and steps[4][1] == []


def test_first_questions_keeps_each_datasets_first_questions_with_all_their_turns():
    def turn(index, dataset, question):
        return Turn(index=index, dataset=dataset, prompt_tokens=4, answer=[], confidence=[], positions=[],
                    question_id=question)

    turns = [turn(0, "mt_bench", "81"), turn(1, "mt_bench", "81"), turn(2, "mt_bench", "82"), turn(3, "mt_bench", "82"),
             turn(4, "mt_bench", "83"), turn(5, "qa", "1"), turn(6, "qa", "2"), turn(7, "qa", "3")]
    assert [t.index for t in first_questions(turns, 2)] == [0, 1, 2, 3, 5, 6]
    assert [t.index for t in first_questions(turns, 1)] == [0, 1, 5]
    with pytest.raises(ValueError, match="limit"):
        first_questions(turns, 0)


def test_recording_the_n_gram_drafters_trees(llama_pair):
    """``record_positions.py --drafter ngram``: at each position the recorded tree is prompt lookup's, so where the
    text repeats an earlier n-gram the root's child is what followed it, and where nothing matches the tree is the
    root alone."""
    target, draft = llama_pair
    generator = SpeculativeGenerator.from_models(target, draft, tree="talon", budget=8)
    prompt = torch.tensor([11, 12, 13, 14, 11, 12])  # root 12 after "11 12", seen before followed by 13
    positions = record_turn(generator, TreeConfig("talon", budget=8, topk=4), prompt, [13, 90, 91], "ngram")
    assert len(positions) == 3
    first, third = positions[0], positions[2]
    assert first["tokens"][:3] == [12, 13, 14] and first["parents"][:3] == [-1, 0, 1]  # the copied span
    assert third["tokens"] == [90] and third["parents"] == [-1]  # root 90: never seen before, no draft


def test_exploration_is_priced_at_a_full_tree_where_trees_stop_short():
    """Prompt lookup's trees mostly stop short of their budget, but a matched span fills them; where rows are dear
    (the int4 target on the AVX2 EPYC, recorded trees) a probe priced at the mean tree it built explored on a fifth
    of the steps and ran below plain decoding. Priced at its full tree, exploration keeps within its share."""
    turns = load_turns([pathlib.Path(__file__).parent.parent / "data" / "replays" / "avx2-int4-ngram.jsonl.gz"])
    trace = []
    totals = replay(turns, 0, {"auto": BudgetController, 1: 1, 3: 3}, 0.0, 128, HARDWARE["avx2-int4-ngram"],
                    trace=trace)
    rate = {label: tokens / seconds for label, (tokens, seconds) in totals["all"].items()}
    reasons = [reason for _, steps in trace for reason in steps["auto"][1]]
    assert rate["auto"] >= rate[1] and rate[3] > rate[1]  # fixed 3 pays here, and auto does not lose to plain
    assert sum(reason in ("probe", "trial") for reason in reasons) <= 0.03 * len(reasons)
