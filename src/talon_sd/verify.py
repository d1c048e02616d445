"""Verification: which part of the draft tree the target keeps.

Glossary (used throughout the library):

* **draft token** - a token proposed by the drafter: a non-root node of the :class:`DraftTree`.
* **target** - the model whose output must be reproduced; it scores the whole tree in one forward.
* **accepted tokens** - draft tokens on the root-to-node path the target agrees with.
* **recovered token** - under sampling, the token drawn from the target's residual distribution
  when every child of the last accepted node is rejected.
* **bonus token** - the target's own token after the last accepted node (greedy argmax, or the
  recovered / freshly sampled token). Every verify step commits ``accepted + 1`` tokens.
* **MAT** (mean accepted tokens, tau) - committed tokens per target forward, bonus included.
* **delta** - draft forwards per target forward (per verify step).

``p_target`` is the target's (warped) next-token distribution at a node; ``p_draft`` the drafter's.

Greedy rule: starting at the root, move to the child whose token equals the target's argmax at the
current node while one exists; the bonus token is the argmax at the last accepted node. The output
is therefore exactly the target's greedy output.

Sampling rule (recursive rejection over siblings, drafts as point masses; SpecInfer / EAGLE): at the
current node let r = p_target(. | path). Try its children in order; child token x is accepted with
probability r(x) / sum(r); if rejected, set r(x) = 0 and try the next sibling. If a child is
accepted, descend and restart with that child's p_target. If all are rejected, the recovered token
is drawn from r / sum(r). Why this is exact: for one sibling x, P(emit x) = r(x), and for y != x,
P(emit y) = (1 - r(x)) * r(y) / (1 - r(x)) = r(y); by induction over the siblings the emitted token
at every depth is distributed as p_target, whatever the draft proposed and however the tree was
shaped. A node without children draws its bonus token from p_target directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingConfig
from .tree import DraftTree


@dataclass(frozen=True)
class Acceptance:
    """The verifier's verdict on one tree."""

    path: list[int]  # accepted node indices, root first (root = index 0, always kept)
    tokens: list[int]  # the accepted draft tokens (tokens of path[1:])
    bonus_token: int

    @property
    def num_accepted(self) -> int:
        return len(self.tokens)

    @property
    def new_tokens(self) -> list[int]:
        """Tokens committed by this step: the accepted drafts, then the bonus token."""
        return self.tokens + [self.bonus_token]


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """p_target: ``logits`` [..., V] -> probabilities after temperature, top-k and top-p (HF semantics)."""
    scores = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < scores.shape[-1]:
        kth = scores.topk(sampling.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly better tokens
        drop_sorted = mass_before >= sampling.top_p  # the best token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """Longest path agreeing with the target's argmax; ``logits`` [N, V] from one tree forward."""
    target_choice = logits.argmax(dim=-1).tolist()  # [N]
    tokens, children = tree.tokens.tolist(), tree.children
    path = [0]
    while True:
        node = path[-1]
        child = next((c for c in children[node] if tokens[c] == target_choice[node]), None)
        if child is None:
            break
        path.append(child)
    return Acceptance(path, [tokens[i] for i in path[1:]], target_choice[path[-1]])


class Draws:
    """The random draws of the sampling rule, from a CPU ``torch.Generator``. The rule asks only for
    Bernoulli and categorical draws with the probabilities it computed, so a test can replace this
    object and enumerate every outcome of the rule exactly (tests/test_sampling.py)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def bernoulli(self, probability: float) -> bool:
        return float(torch.rand((), generator=self.generator)) < probability

    def categorical(self, probabilities: torch.Tensor) -> int:  # [V] float64, sums to 1
        return int(torch.multinomial(probabilities, 1, generator=self.generator))


def _remove_rejected(residual: torch.Tensor, token: int) -> None:
    """A rejected draft token leaves the residual distribution (renormalised where it is used)."""
    residual[token] = 0.0


def accept_sampling(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | Draws
) -> Acceptance:
    """Recursive rejection over siblings (module docstring); ``logits`` [N, V]. Probabilities are
    normalised in float64 (a float32 sum over a 150k vocabulary drifts by ~1e-5)."""
    draws = Draws(generator) if isinstance(generator, torch.Generator) else generator  # or any bernoulli/categorical source
    tokens, children = tree.tokens.tolist(), tree.children
    path = [0]
    while True:
        node = path[-1]
        residual = warp(logits[node], sampling).cpu().double()  # [V] p_target, then what rejections leave
        accepted_child = None
        for child in children[node]:
            x = tokens[child]
            if draws.bernoulli(float(residual[x] / residual.sum())):
                accepted_child = child
                break
            _remove_rejected(residual, x)
        if accepted_child is None:
            bonus = draws.categorical(residual / residual.sum())
            return Acceptance(path, [tokens[i] for i in path[1:]], bonus)
        path.append(accepted_child)


def accept(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | Draws | None
) -> Acceptance:
    """Greedy or sampling verification, as ``sampling`` says."""
    if sampling.greedy:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, sampling, generator)
