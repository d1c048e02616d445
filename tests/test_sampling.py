"""Sampling is lossless: the joint law of the first generated tokens equals the target's.

A tiny-vocabulary target and a deliberately different draft; thousands of seeded generations of
two tokens; a chi-square test against the exact joint distribution enumerated from the target.
A negative control shows the test has the power to reject a wrong distribution.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from conftest import noisy_copy, tiny_model
from helpers import make_drafter, run
from talon_sd.config import SamplingConfig, TreeConfig
from talon_sd.verify import Acceptance, accept_greedy, accept_sampling, warp
from talon_sd.tree import DraftTree

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
def exact_joint(model, sampling: SamplingConfig) -> torch.Tensor:
    """[V, V] probability of (first, second) generated token under the target alone."""
    first = warp(model(torch.tensor([PROMPT])).logits[0, -1], sampling)
    joint = torch.zeros(V, V)
    for a in range(V):
        joint[a] = first[a] * warp(model(torch.tensor([PROMPT + [a]])).logits[0, -1], sampling)
    return joint


def sampled_counts(target, draft, tree, sampling) -> torch.Tensor:
    counts = torch.zeros(V, V)
    drafter = make_drafter("model", draft, V)
    for seed in range(RUNS):
        tokens, _ = run(target, drafter, tree, PROMPT, 2, sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed}))
        counts[tokens[0], tokens[1]] += 1
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


def test_recursive_rejection_on_hand_built_logits():
    """Root with two children; the target puts all its mass on the second child's token."""
    tree = DraftTree.root(0).extend(torch.tensor([0, 0]), torch.tensor([3, 4]), torch.tensor([-0.1, -0.2]))
    logits = torch.full((3, V), -1e9)
    logits[0, 4] = 0.0  # at the root the target only allows token 4
    logits[2, 5] = 0.0  # after token 4 only token 5
    for seed in range(20):
        result = accept_sampling(tree, logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(seed))
        assert result == Acceptance(path=[0, 2], tokens=[4], bonus_token=5)
    assert accept_greedy(tree, logits) == Acceptance(path=[0, 2], tokens=[4], bonus_token=5)
    logits[0] = -1e9
    logits[0, 1] = 0.0  # neither child: both rejected, the recovered token is 1
    result = accept_sampling(tree, logits, SamplingConfig(do_sample=True), torch.Generator().manual_seed(0))
    assert result == Acceptance(path=[0], tokens=[], bonus_token=1)


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
