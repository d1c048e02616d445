"""Sampling is lossless and seeded: the joint law of the first generated tokens equals the target's, and the text is
a function of (prompt, seed) alone, the same for plain decoding and for every drafter, tree and budget.

A tiny-vocabulary target and a deliberately different draft; thousands of seeded generations of two or three
tokens; a chi-square test against the exact joint distribution enumerated from the target. Negative controls show
that the oracle and the chi-square test catch a rule whose noise is keyed by the step or reused across positions.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from conftest import VOCAB, noisy_copy, tiny_model
from helpers import make_drafter, run
from talon_sd.config import SamplingConfig, TreeConfig
from talon_sd.control import BudgetController, ControllerSettings
from talon_sd.tree import DraftTree
from talon_sd.verify import Acceptance, PositionNoise, accept_greedy, accept_sampling, noise_key, warp, warp_scores

V = 6
PROMPT = [1, 4, 2]
RUNS = 1500


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_model("llama", seed=11, vocab=V)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.25)  # soften: every cell of the 6 x 6 joint gets real mass
    return target, noisy_copy(target, 1.0, seed=12)


@torch.no_grad()
def exact_joint(model, sampling: SamplingConfig, prompt=PROMPT, length: int = 2) -> torch.Tensor:
    """[V] * length probability of the first ``length`` generated tokens under the target alone."""
    first = warp(model(torch.tensor([prompt], device=model.device)).logits[0, -1].cpu(), sampling)
    if length == 1:
        return first
    return torch.stack([first[a] * exact_joint(model, sampling, prompt + [a], length - 1) for a in range(V)])


def sampled_counts(target, draft, tree, sampling, drafter_kind="model", prompt=PROMPT, length=2, runs=RUNS):
    counts = torch.zeros((V,) * length)
    drafter = make_drafter(drafter_kind, draft, V)
    for seed in range(runs):
        tokens, _ = run(target, drafter, tree, prompt, length, sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed}))
        counts[tuple(tokens)] += 1
    return counts


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.flatten() * counts.sum()
    keep = expected >= 5  # pool the sparse cells into one
    observed = torch.cat([counts.flatten()[keep], counts.flatten()[~keep].sum()[None]])
    expected = torch.cat([expected[keep], expected[~keep].sum()[None]])
    if float(expected[-1]) == 0:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed.numpy(), expected.numpy() * float(observed.sum() / expected.sum())).pvalue)


T1 = SamplingConfig(do_sample=True, temperature=1.0)
T07 = SamplingConfig(do_sample=True, temperature=0.7, top_p=0.8)
TOPK3 = SamplingConfig(do_sample=True, temperature=1.2, top_k=3)
REPEATING = [1, 4, 2, 1, 4, 3, 1, 4, 2, 1, 4]  # the n-gram drafter finds continuations here


@pytest.mark.parametrize(
    "tree,sampling",
    [(TreeConfig("talon", budget=8, topk=3), T1), (TreeConfig("talon", budget=8, topk=3), T07),
     (TreeConfig("eagle", budget=6, topk=2, depth=2), T1), (TreeConfig("chain", depth=2), T07)],
    ids=["talon-T=1", "talon-T=0.7,top_p=0.8", "eagle-T=1", "chain-T=0.7,top_p=0.8"],
)
def test_joint_distribution_of_first_two_tokens_matches_target(small_vocab_pair, tree, sampling):
    target, draft = small_vocab_pair
    probs = exact_joint(target, sampling)
    counts = sampled_counts(target, draft, tree, sampling)
    assert chi_square_p(counts, probs) > 1e-3
    # negative control: the same counts are far from the DRAFT's joint law, so the test can fail
    assert chi_square_p(counts, exact_joint(draft, sampling)) < 1e-6


@pytest.mark.parametrize(
    "tree,sampling,drafter_kind,prompt,length",
    [(TreeConfig("static", budget=7), TOPK3, "model", PROMPT, 2),
     (TreeConfig("talon", budget=10, topk=3), T07, "ngram", REPEATING, 2),
     (TreeConfig("talon", budget=10, topk=3), TOPK3, "model", PROMPT, 3),
     (TreeConfig("talon", budget="auto", topk=3), T1, "model", PROMPT, 3)],
    ids=["static-top_k=3", "ngram-talon-top_p", "talon-3-tokens-top_k=3", "talon-auto-3-tokens"],
)
def test_joint_law_for_more_trees_drafters_and_warpers(small_vocab_pair, tree, sampling, drafter_kind, prompt, length):
    target, draft = small_vocab_pair
    probs = exact_joint(target, sampling, prompt, length)
    counts = sampled_counts(target, draft, tree, sampling, drafter_kind, prompt, length, runs=1500)
    assert chi_square_p(counts, probs) > 1e-3


def test_chi_square_rejects_noise_reused_across_positions(small_vocab_pair, monkeypatch):
    """A broken rule that draws every position with the same noise (keyed by the seed alone): the tokens of one
    text are then no longer independent draws, and the chi-square test of the joint law must see it."""
    target, draft = small_vocab_pair
    monkeypatch.setattr("talon_sd.verify.noise_key", lambda seed, position: noise_key(seed, 0))
    counts = sampled_counts(target, draft, TreeConfig("talon", budget=8, topk=3), T1, length=3, runs=1000)
    assert chi_square_p(counts, exact_joint(target, T1, length=3)) < 1e-3


# ------------------------------------------------------------------------------- the seeded oracle
SAMPLINGS = [SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9),
             SamplingConfig(do_sample=True, temperature=1.0, top_k=20)]
TREES = [TreeConfig("chain", depth=3), TreeConfig("static", budget=10), TreeConfig("eagle", budget=12, topk=3, depth=4),
         TreeConfig("talon", budget=2, topk=1), TreeConfig("talon", budget=16, topk=4), TreeConfig("talon", budget="auto"),
         TreeConfig("eagle", budget="auto", topk=3, depth=4), TreeConfig("chain", budget="auto")]
PROMPTS = [[5, 17, 33, 8, 5, 17], [40]]


def seeded(sampling: SamplingConfig, seed: int) -> SamplingConfig:
    return SamplingConfig(**{**sampling.__dict__, "seed": seed})


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T=0.7,top_p=0.9", "T=1,top_k=20"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_a_seeded_sample_is_the_same_text_as_plain_decoding(llama_pair, sampling, drafter_kind, tree):
    """Token for token the ``ar`` output for the same seed, whatever the drafter, tree and budget (an auto budget
    runs the cycling controller: plain steps and budget changes); another seed gives other tokens."""
    target, draft = llama_pair
    drafter = make_drafter(drafter_kind, draft, VOCAB)
    for prompt in PROMPTS:
        plain = {seed: run(target, None, TreeConfig("ar"), prompt, 40, sampling=seeded(sampling, seed))[0]
                 for seed in (7, 8)}
        assert plain[7] != plain[8]
        tokens, stats = run(target, drafter, tree, prompt, 40, sampling=seeded(sampling, 7))
        assert tokens == plain[7], (tree.label, drafter_kind, prompt)
        assert stats.seed == 7 and stats.new_tokens == 40


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
@pytest.mark.parametrize("method", ["talon", "eagle", "chain"])
def test_a_seeded_sample_is_the_same_text_with_the_real_online_controller(request, pair_name, method):
    target, draft = request.getfixturevalue(pair_name)
    for sampling in SAMPLINGS:
        plain, _ = run(target, None, TreeConfig("ar"), PROMPTS[0], 40, sampling=seeded(sampling, 3))
        # exploring may cost half the time: a sampled fresh start pays the draft's catch-up within it (package
        # docstring of talon_sd.control), and here it must draft from the first request
        controller = BudgetController(ControllerSettings(max_budget=24, initial_budget=8, exploration=0.5))
        tokens, stats = run(target, make_drafter("model", draft, VOCAB), TreeConfig(method, budget="auto"), PROMPTS[0],
                            40, sampling=seeded(sampling, 3), controller=controller)
        assert tokens == plain
        assert len(set(stats.budgets)) > 1  # its own choices varied the trees


def test_the_oracle_catches_noise_keyed_by_the_step(llama_pair, monkeypatch):
    """A broken rule keyed by the verify step instead of the position: plain decoding still samples correctly (one
    token a step), but a tree that commits several tokens a step reads other noise, and the oracle sees it."""
    import talon_sd.decoding as decoding

    steps = {"count": 0}
    original = decoding.accept

    def by_step(tree, logits, sampling, noise, root_position):
        steps["count"] += 1
        return original(tree, logits, sampling, noise, steps["count"])

    monkeypatch.setattr(decoding, "accept", by_step)
    target, draft = llama_pair
    differs = []
    for seed in range(4):
        steps["count"] = 0
        plain, _ = run(target, None, TreeConfig("ar"), PROMPTS[0], 40, sampling=seeded(SAMPLINGS[0], seed))
        steps["count"] = 0
        tokens, stats = run(target, make_drafter("model", draft, VOCAB), TreeConfig("talon", budget=16, topk=4),
                            PROMPTS[0], 40, sampling=seeded(SAMPLINGS[0], seed))
        differs.append(tokens != plain and stats.mat > 1)
    assert any(differs)


def test_without_a_seed_each_generation_draws_one_and_reports_it(llama_pair):
    target, draft = llama_pair
    unseeded = SamplingConfig(do_sample=True, temperature=1.0)
    tokens, stats = run(target, make_drafter("model", draft, VOCAB), TreeConfig("talon", budget=8), PROMPTS[0], 30,
                        sampling=unseeded)
    again, other = run(target, make_drafter("model", draft, VOCAB), TreeConfig("talon", budget=8), PROMPTS[0], 30,
                       sampling=unseeded)
    assert stats.seed is not None and other.seed is not None and stats.seed != other.seed
    replayed, _ = run(target, None, TreeConfig("ar"), PROMPTS[0], 30, sampling=seeded(unseeded, stats.seed))
    assert replayed == tokens  # the reported seed reproduces the text
    assert run(target, None, TreeConfig("ar"), PROMPTS[0], 30)[1].seed is None  # greedy draws nothing


# ------------------------------------------------------------------------------- the rule on hand-built logits
def test_the_keyed_draw_follows_p_target():
    """Over many seeds, one position's draw has the warped distribution's frequencies (1,000 tokens)."""
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 2
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_k=8)
    p_target = warp(logits, sampling)
    counts = torch.zeros(1000)
    for seed in range(4000):
        counts[PositionNoise(seed).draw(warp_scores(logits, sampling), 5)] += 1
    assert counts[p_target == 0].sum() == 0  # never outside top-k
    assert chi_square_p(counts[p_target > 0], p_target[p_target > 0]) > 1e-3


def test_the_walk_follows_the_draws_on_hand_built_logits():
    """Root with two children; the target puts all its mass on the second child's token, then on token 5."""
    tree = DraftTree.root(0).extend(torch.tensor([0, 0]), torch.tensor([3, 4]), torch.tensor([-0.1, -0.2]))
    logits = torch.full((3, V), -1e9)
    logits[0, 4] = 0.0  # at the root the target only allows token 4
    logits[2, 5] = 0.0  # after token 4 only token 5
    for seed in range(20):
        result = accept_sampling(tree, logits, SamplingConfig(do_sample=True), PositionNoise(seed), 10)
        assert result == Acceptance(path=[0, 2], tokens=[4], bonus_token=5)
    assert accept_greedy(tree, logits) == Acceptance(path=[0, 2], tokens=[4], bonus_token=5)
    logits[0] = -1e9
    logits[0, 1] = 0.0  # neither child: the bonus is the target's own token 1
    assert accept_sampling(tree, logits, SamplingConfig(do_sample=True), PositionNoise(0), 10) == Acceptance([0], [], 1)


def test_a_nodes_draw_is_the_draw_at_its_position():
    """The token drawn at a depth-d node is the keyed draw at root position + d + 1, whatever the tree."""
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(3, V, generator=generator)
    sampling = SamplingConfig(do_sample=True, temperature=1.0)
    noise = PositionNoise(5)
    first = noise.draw(warp_scores(logits[0], sampling), 8)
    second = noise.draw(warp_scores(logits[1], sampling), 9)
    tree = DraftTree.root(0).extend(torch.tensor([0]), torch.tensor([first]), torch.tensor([-0.1]))
    tree = tree.extend(torch.tensor([1]), torch.tensor([second]), torch.tensor([-0.2]))
    result = accept_sampling(tree, logits, sampling, noise, 7)
    assert result.path == [0, 1, 2] and result.bonus_token == noise.draw(warp_scores(logits[2], sampling), 10)


def test_warp_follows_hf_top_k_and_top_p():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 10, 1.0), (0.5, 5, 0.5)]:
        ours = warp(logits, SamplingConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p))
        scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        torch.testing.assert_close(ours, scores.softmax(-1))


def test_noise_keys_differ_across_seeds_and_positions():
    keys = {noise_key(seed, position) for seed in range(50) for position in range(50)}
    assert len(keys) == 2500 and all(0 <= key < 2 ** 64 for key in keys)
