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


def test_chi_square_rejects_a_rule_without_renormalisation(small_vocab_pair, monkeypatch):
    """The broken rule draws the recovered token from p_target instead of the residual: the test must see it."""
    target, draft = small_vocab_pair
    monkeypatch.setattr("talon_sd.verify._remove_rejected", lambda residual, token: None)
    tree = TreeConfig("talon", budget=8, topk=3)
    counts = sampled_counts(target, draft, tree, T1)
    assert chi_square_p(counts, exact_joint(target, T1)) < 1e-3


class EnumeratedDraws:
    """Replays scripted choices, takes the first option at each new decision and lists the others:
    with :func:`enumerate_rule` it walks every outcome of the rule with the probability the rule gave it."""

    def __init__(self, script):
        self.script, self.made, self.probability, self.alternatives = list(script), [], 1.0, []

    def _next(self, options):  # options: [(choice, probability > 0)]
        position = len(self.made)
        if position < len(self.script):
            choice = self.script[position]
        else:
            choice = options[0][0]
            self.alternatives += [(position, other) for other, _ in options[1:]]
        self.made.append(choice)
        self.probability *= dict(options)[choice]
        return choice

    def bernoulli(self, probability):
        return self._next([(c, q) for c, q in ((True, probability), (False, 1.0 - probability)) if q > 0])

    def categorical(self, probabilities):
        return self._next([(i, float(probabilities[i])) for i in range(probabilities.numel()) if probabilities[i] > 0])


def enumerate_rule(tree, logits, sampling):
    """Every outcome of accept_sampling with its exact probability: {new tokens: probability}."""
    outcomes, stack = {}, [[]]
    while stack:
        draws = EnumeratedDraws(stack.pop())
        key = tuple(accept_sampling(tree, logits, sampling, draws).new_tokens)
        outcomes[key] = outcomes.get(key, 0.0) + draws.probability
        stack += [draws.made[:position] + [choice] for position, choice in draws.alternatives]
    return outcomes


def test_accept_rule_by_exact_enumeration(monkeypatch):
    """A depth-2 tree with non-trivial target and draft distributions: summing the rule's outcomes exactly,
    the first two committed tokens (continued by the target when a step commits one) follow p_target.
    The same enumeration of the rule without renormalisation is visibly wrong."""
    generator = torch.Generator().manual_seed(3)
    table = {}

    def target_logits(context):
        if context not in table:
            table[context] = torch.randn(V, generator=generator) * 1.5
        return table[context]

    # root (token 0) -> children 3, 1, 4; child 3 -> children 2, 5
    tree = DraftTree.root(0).extend(torch.tensor([0, 0, 0]), torch.tensor([3, 1, 4]), torch.tensor([-0.5, -1.0, -2.0]))
    tree = tree.extend(torch.tensor([1, 1]), torch.tensor([2, 5]), torch.tensor([-1.0, -1.5]))
    contexts = [(), (3,), (1,), (4,), (3, 2), (3, 5)]
    logits = torch.stack([target_logits(c) for c in contexts])
    for sampling in (T1, TOPK3, T07):
        expected = torch.stack([warp(target_logits(()), sampling)[a] * warp(target_logits((a,)), sampling)
                                for a in range(V)]).double()  # [V, V]

        def law(outcomes):
            joint = torch.zeros(V, V, dtype=torch.float64)
            for tokens, probability in outcomes.items():
                if len(tokens) >= 2:
                    joint[tokens[0], tokens[1]] += probability
                else:
                    joint[tokens[0]] += probability * warp(target_logits(tokens), sampling).double()
            return joint

        outcomes = enumerate_rule(tree, logits, sampling)
        assert abs(sum(outcomes.values()) - 1.0) < 1e-12
        assert sampling is not T1 or any(len(tokens) == 3 for tokens in outcomes)  # the deep branch is reachable
        torch.testing.assert_close(law(outcomes), expected, atol=1e-6, rtol=0)  # warp is float32
        with monkeypatch.context() as patched:
            patched.setattr("talon_sd.verify._remove_rejected", lambda residual, token: None)
            broken = law(enumerate_rule(tree, logits, sampling))
        assert float((broken - expected).abs().max()) > 1e-3


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


def test_residuals_are_normalised_in_float64_over_a_large_vocabulary():
    """With 151936 tokens a float32 sum drifts by ~1e-5; the rule must hand out float64 probabilities
    that sum to 1 (the recovered-token draw) and acceptance ratios computed in float64."""
    vocab = 151936
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(0)) * 4
    tree = DraftTree.root(0).extend(torch.tensor([0]), torch.tensor([int(logits[0].argmax())]), torch.tensor([-0.1]))
    seen = {}

    class Recording(EnumeratedDraws):
        def bernoulli(self, probability):
            seen["bernoulli"] = probability
            return False  # reject the child: the recovered token comes from the residual

        def categorical(self, probabilities):
            seen["categorical"] = probabilities
            return 7

    accept_sampling(tree, logits, T1, Recording([]))
    p_target = torch.softmax(logits[0].double(), -1)
    x = int(tree.tokens[1])
    assert seen["categorical"].dtype == torch.float64
    assert abs(float(seen["categorical"].sum()) - 1.0) < 1e-12 and float(seen["categorical"][x]) == 0.0
    assert abs(seen["bernoulli"] - float(p_target[x])) < 1e-6
