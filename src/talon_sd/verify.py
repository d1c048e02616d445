"""Verification: which part of the draft tree the target keeps.

Glossary (used throughout the library):

* **draft token** - a token proposed by the drafter: a non-root node of the :class:`DraftTree`.
* **target** - the model whose output must be reproduced; it scores the whole tree in one forward.
* **accepted tokens** - draft tokens on the root-to-node path the target agrees with.
* **bonus token** - the target's own token after the last accepted node. Every verify step commits
  ``accepted + 1`` tokens.
* **MAT** (mean accepted tokens, tau) - committed tokens per target forward, bonus included.
* **delta** - draft forwards per target forward (per verify step).

``p_target`` is the target's (warped) next-token distribution at a node; ``p_draft`` the drafter's.

One rule for greedy and sampling: at every node the target *chooses* the token it would emit at that
node's position; starting at the root, move to the child whose token equals the target's choice
while one exists; the bonus token is the choice at the last accepted node.

* Greedy: the choice is the argmax of ``p_target``, so the output is the target's greedy output.
* Sampling: the choice is a draw from ``p_target`` (after temperature, top-k, top-p: :func:`warp`)
  by Gumbel-max, ``argmax(log p_target + g)``, with the Gumbel noise ``g`` [V] keyed by the request's
  seed and the absolute position of the token drawn (:class:`PositionNoise`). Plain decoding
  draws the same way, so for a given seed every tree, drafter and budget gives *the same text* as
  plain decoding (up to floating-point near-ties, as for greedy). Each position's token is a draw
  from ``p_target`` given the text before it, with fresh noise per position: the output follows
  the target's distribution exactly. A child is accepted with probability ``p_target(its token)``,
  which is what recursive rejection sampling (SpecInfer, EAGLE) gives for draft tokens that are
  point masses, as every node of our trees is; and a tree of budget k accepts the first k nodes'
  share of a larger tree's path (the prefix property :mod:`talon_sd.control` learns from), at any
  temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .config import SamplingConfig
from .tree import DraftTree

_MASK64 = (1 << 64) - 1


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


def warp_scores(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """``logits`` [..., V] -> float32 scores after temperature, top-k and top-p (HF semantics): the log of
    p_target up to a constant per row, -inf outside the support."""
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
    return scores


def warp(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """p_target: ``logits`` [..., V] -> probabilities after temperature, top-k and top-p."""
    return warp_scores(logits, sampling).softmax(dim=-1)


def noise_key(seed: int, position: int) -> int:
    """A 64-bit generator seed for (request seed, absolute position): splitmix64 of both, so nearby seeds
    and positions get unrelated streams."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & _MASK64
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * factor) & _MASK64
    return x ^ (x >> 31)


class PositionNoise:
    """The sampling rule's only randomness: one standard Gumbel vector per absolute position, a function of
    (seed, position, vocabulary size) alone, drawn on the CPU whatever device the logits are on (a GPU's own
    generator lays its numbers out by the GPU model). Positions count from the prompt's first token."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def gumbel(self, position: int, vocab: int, device: torch.device) -> torch.Tensor:
        """[V] float32 Gumbel(0, 1) noise for the token at ``position``."""
        generator = torch.Generator().manual_seed(noise_key(self.seed, position))
        uniform = torch.rand(vocab, generator=generator).to(device)  # [V] in [0, 1)
        return uniform.clamp_(min=torch.finfo(torch.float32).tiny).log_().neg_().log_().neg_()

    def draw(self, scores: torch.Tensor, position: int) -> int:
        """The token at ``position`` drawn from softmax(``scores`` [V]) by Gumbel-max."""
        return int((scores + self.gumbel(position, scores.shape[-1], scores.device)).argmax())


def walk(tree: DraftTree, choose: Callable[[int, int], int]) -> Acceptance:
    """Descend from the root while a child carries the target's choice ``choose(node, depth)``; the choice at
    the last node reached is the bonus token."""
    tokens, children = tree.tokens.tolist(), tree.children
    path = [0]
    while True:
        choice = choose(path[-1], len(path) - 1)
        child = next((c for c in children[path[-1]] if tokens[c] == choice), None)
        if child is None:
            return Acceptance(path, [tokens[i] for i in path[1:]], choice)
        path.append(child)


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> Acceptance:
    """Longest path agreeing with the target's argmax; ``logits`` [N, V] from one tree forward."""
    target_choice = logits.argmax(dim=-1).tolist()  # [N], one host sync
    return walk(tree, lambda node, depth: target_choice[node])


def accept_sampling(tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise,
                    root_position: int) -> Acceptance:
    """Longest path agreeing with the target's keyed draws (module docstring); ``logits`` [N, V]; the root's
    token sits at ``root_position``, so a node of depth d draws the token at ``root_position + d + 1``."""
    return walk(tree, lambda node, depth: noise.draw(warp_scores(logits[node], sampling), root_position + depth + 1))


def accept(tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, noise: PositionNoise | None,
           root_position: int) -> Acceptance:
    """Greedy or sampling verification, as ``sampling`` says (``noise`` is needed only to sample)."""
    if sampling.greedy:
        return accept_greedy(tree, logits)
    return accept_sampling(tree, logits, sampling, noise, root_position)
