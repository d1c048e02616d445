"""Greedy oracle: every drafter x tree builder reproduces plain greedy decoding token for token."""

from __future__ import annotations

import pytest

from conftest import VOCAB, plain_greedy
from helpers import make_drafter, run
from talon_sd.config import TreeConfig

PROMPTS = [[5, 17, 33, 8, 5, 17], [3, 9, 27, 81 % 96, 50, 60, 3, 9], [40]]

TREES = [
    TreeConfig("ar"),
    TreeConfig("chain", depth=1),
    TreeConfig("chain", depth=5),
    TreeConfig("static", budget=6),
    TreeConfig("static", budget=20),
    TreeConfig("eagle", budget=8, topk=2, depth=3),
    TreeConfig("eagle", budget=24, topk=4, depth=6),
    TreeConfig("talon", budget=2, topk=1),
    TreeConfig("talon", budget=8, topk=3),
    TreeConfig("talon", budget=32, topk=10, mu=0.03),
    TreeConfig("talon", budget=16, topk=4, mu=0.5),
    TreeConfig("talon", budget="auto", topk=4),
    TreeConfig("eagle", budget="auto", topk=3, depth=4),
    TreeConfig("chain", budget="auto"),
]


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_greedy_equals_plain_greedy(request, pair_name, drafter_kind, tree):
    target, draft = request.getfixturevalue(pair_name)
    drafter = make_drafter(drafter_kind, draft, VOCAB)
    for prompt in PROMPTS:  # the same drafter object across generations: no state leaks between calls
        expected = plain_greedy(target, prompt, 40)
        tokens, stats = run(target, drafter, tree, prompt, 40)
        assert tokens == expected, (tree.label, drafter_kind, prompt)
        assert stats.new_tokens == 40
        assert stats.committed >= 40
        if tree.method != "ar" and (drafter_kind == "model" or prompt is PROMPTS[0]):
            assert stats.mat > 1.0  # drafts were accepted (the n-gram drafter needs a repeating prompt)


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
@pytest.mark.parametrize("tree", [t for t in TREES if t.method != "ar"], ids=lambda t: t.label)
def test_stops_inside_an_accepted_path(request, pair_name, tree):
    """EOS and max_new_tokens that fall inside an accepted path end the output exactly there."""
    target, draft = request.getfixturevalue(pair_name)
    prompt = PROMPTS[0]
    reference = plain_greedy(target, prompt, 60)
    truncated_somewhere = False
    for limit in range(3, 30, 3):
        tokens, stats = run(target, make_drafter("model", draft, VOCAB), tree, prompt, limit)
        assert tokens == reference[:limit]
        truncated_somewhere |= stats.committed > stats.new_tokens
        eos = reference[limit]
        tokens, stats = run(target, make_drafter("model", draft, VOCAB), tree, prompt, 60, eos=(eos,))
        assert tokens == reference[: reference.index(eos) + 1]
        truncated_somewhere |= stats.committed > stats.new_tokens
    if tree.auto or tree.budget > 2:
        assert truncated_somewhere, "no stop fell inside an accepted path: the test lost its point"


def test_speculation_really_accepts(llama_pair):
    """The noisy-copy draft is good enough that trees are accepted several tokens deep."""
    target, draft = llama_pair
    for tree in (TreeConfig("chain", depth=5), TreeConfig("talon", budget=32, topk=2, mu=0.5)):
        _, stats = run(target, make_drafter("model", draft, VOCAB), tree, PROMPTS[0], 60)
        assert stats.mat > 2.0, tree.label
        assert max(stats.accepted_lengths) >= 3, tree.label


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
@pytest.mark.parametrize("method", ["talon", "eagle", "chain"])
def test_greedy_with_the_real_online_controller(request, pair_name, method):
    """The controller's own choices (plain steps on these tiny models, where a draft forward costs as much
    as a verify) never change the output."""
    from talon_sd.control import BudgetController, ControllerSettings

    target, draft = request.getfixturevalue(pair_name)
    tree = TreeConfig(method, budget="auto")
    for prompt in PROMPTS:
        controller = BudgetController(ControllerSettings(max_budget=24, initial_budget=8))
        tokens, stats = run(target, make_drafter("model", draft, VOCAB), tree, prompt, 40, controller=controller)
        assert tokens == plain_greedy(target, prompt, 40)
        assert stats.budgets[0] == 8 and len(stats.budgets) == stats.target_forwards


def expected_catch_up(budgets, committed, prompt_length, catches_up=True):
    """What the loop must tell the controller before each step: (catch-up tokens, tokens left of 40)."""
    asked, undrafted, emitted = [], prompt_length - 1, 0
    for budget, tokens in zip(budgets, committed):
        asked.append((undrafted if catches_up else 0, 40 - emitted))
        undrafted = undrafted + tokens if budget == 1 else 0
        emitted += tokens
    return asked


@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_the_loop_tells_the_controller_the_drafters_catch_up_and_the_tokens_left(llama_pair, drafter_kind):
    """The prompt waits in the draft LM until the first drafted step, then each plain step's tokens do."""
    from helpers import CyclingController

    target, draft = llama_pair
    controller = CyclingController()
    prompt = PROMPTS[1]
    tokens, _ = run(target, make_drafter(drafter_kind, draft, VOCAB), TreeConfig("talon", budget="auto", topk=4),
                    prompt, 40, controller=controller)
    assert tokens == plain_greedy(target, prompt, 40)
    assert controller.asked == expected_catch_up(controller.budgets, controller.committed, len(prompt),
                                                 catches_up=drafter_kind == "model")
    if drafter_kind == "model":  # plain steps did leave tokens to catch up
        assert {caught for caught, _ in controller.asked} > {0}
    # only the first drafted step's catch-up (the prompt, and plain steps' tokens before it) runs apart
    first_drafted = next(i for i, budget in enumerate(controller.budgets) if budget > 1)
    assert controller.caught_up_apart == [drafter_kind == "model" and i == first_drafted
                                          for i in range(len(controller.budgets))]
