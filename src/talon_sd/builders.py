"""Tree builders: shape a :class:`DraftTree` from the drafter's per-layer distributions.

A builder never calls a model. It receives an ``expand`` callable from the drafter (or, as a coroutine,
:meth:`TreeBuilder.grow`, is sent what ``expand`` would return):

    expand(tree, nodes) -> log_p_draft   # [F, V]: log P_draft(child token | root-to-node path)

for the ``F`` nodes ``nodes`` [F] of the partial ``tree``; each call is one batched draft forward
(one "layer"). Every builder starts from the root-only tree and stops when its own rule says so.
Candidate children with log-probability ``-inf`` (probability 0) are never added, so a drafter can
say "nothing to propose" and the tree simply stays small.

Builders, registered by name in :data:`BUILDERS`:

* ``ar``     - the root alone: plain autoregressive decoding through the same loop (no drafter).
* ``chain``  - one path of ``depth`` greedy draft tokens (classic speculative decoding).
* ``static`` - a fixed shape given as paths of sibling ranks; default: the ``budget`` most likely
  rank-paths under a geometric rank prior.
* ``eagle``  - the EAGLE-2/3 dynamic tree: top-k children per frontier node, top-k of those as the
  next frontier, ``depth`` layers, then one global rerank of every generated node to ``budget``.
* ``talon``  - TALON, Algorithm 2 of arXiv 2601.07353: top-K children of the root, then at every
  deeper layer a gate over the whole layer pool relative to its maximum (keep p >= mu * max),
  overflow cut to the remaining budget, no depth cap; stops when the budget N (root counted) is full.

Online control (:mod:`talon_sd.control`): ``build`` takes an optional :class:`StepPlan` that sets this
step's budget. A builder also states its
*inclusion order* (:meth:`TreeBuilder.inclusion_order`): the order in which it adds nodes as the
budget grows, such that the tree it builds with budget k is exactly the first k nodes in that order
(TALON, chain, static: index order, whole layers then the best of the cut layer; EAGLE: score order
after the global rerank). That prefix property lets one verified step tell the controller what every
smaller budget would have accepted.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Generator

import torch

from .config import TreeConfig
from .tree import DraftTree

Expander = Callable[[DraftTree, torch.Tensor], torch.Tensor]
Growth = Generator[tuple[DraftTree, torch.Tensor], torch.Tensor, DraftTree]  # yields (tree, nodes), gets log_p_draft


@dataclass(frozen=True)
class StepPlan:
    """One step's settings from an online controller: the budget N (root counted; 1 = the root alone,
    no draft forward) and why the controller chose N (a key of :data:`talon_sd.control.REASONS`; for the
    stats only)."""

    budget: int
    reason: str = ""


class TreeBuilder(ABC):
    """Turns draft distributions into a :class:`DraftTree`. Stateless between calls."""

    name: ClassVar[str]
    needs_drafter: ClassVar[bool] = True
    layered: ClassVar[bool] = True  # each draft forward makes a usable prefix (False: only the last does)

    def build(self, root_token: int, expand: Expander, device: torch.device | str = "cpu",
              plan: StepPlan | None = None) -> DraftTree:
        """Grow a tree from ``root_token`` (the last committed token) using ``expand``; ``plan``
        overrides the configured budget for this step."""
        return drive(self.grow(root_token, device, plan), expand)

    @abstractmethod
    def grow(self, root_token: int, device: torch.device | str = "cpu", plan: StepPlan | None = None) -> Growth:
        """:meth:`build` as a coroutine: yields ``(tree, nodes)`` for each draft forward, is sent back its
        ``log_p_draft`` [F, V], and returns the tree; so a batch can run several requests' builds in lockstep,
        one batched draft forward per layer (:mod:`talon_sd.batch`)."""

    def inclusion_order(self, tree: DraftTree) -> list[int]:
        """Node indices in the order the budget adds them (root first); default: index order."""
        return list(range(tree.size))


def drive(growth: Growth, expand: Expander) -> DraftTree:
    """Run a builder's coroutine (:meth:`TreeBuilder.grow`) to its tree, answering each ask with ``expand``."""
    try:
        ask = next(growth)
        while True:
            ask = growth.send(expand(*ask))
    except StopIteration as done:
        return done.value


def _planned(budget: int | None, plan: StepPlan | None) -> int:
    """This step's budget: the plan's, else the configured one (an ``auto`` budget needs a plan)."""
    if plan is not None:
        return plan.budget
    if budget is None:
        raise ValueError("budget 'auto' needs a StepPlan from the online controller for every step")
    return budget


def _children_of(parents: torch.Tensor, tree: DraftTree, log_p_draft: torch.Tensor, k: int):
    """Top-k children of each expanded node. Returns (parents [F*k], tokens [F*k], scores [F*k]).

    parents [F] node indices, log_p_draft [F, V]. Children with probability 0 are dropped.
    """
    k = min(k, log_p_draft.shape[-1])
    top_log_p, top_tokens = log_p_draft.topk(k, dim=-1)  # [F, k]
    scores = tree.scores[parents][:, None] + top_log_p.float()  # [F, k]
    child_parents = parents[:, None].expand(-1, k)
    finite = torch.isfinite(scores)
    return child_parents[finite], top_tokens[finite], scores[finite]


def _by_score(parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor, limit: int | None = None):
    """Order candidates by score (best first, stable) and keep at most ``limit`` of them."""
    order = torch.sort(scores, descending=True, stable=True).indices
    if limit is not None:
        order = order[:limit]
    return parents[order], tokens[order], scores[order]


class AutoregressiveBuilder(TreeBuilder):
    """The root alone: the verify step is one plain decoding step."""

    name = "ar"
    needs_drafter = False

    def __init__(self, config: TreeConfig) -> None:
        del config

    def grow(self, root_token, device="cpu", plan=None):
        return DraftTree.root(root_token, device)
        yield  # a coroutine that asks for no draft forward


class ChainBuilder(TreeBuilder):
    """A single path of ``depth`` tokens, each the draft's argmax (one draft forward per token)."""

    name = "chain"

    def __init__(self, config: TreeConfig) -> None:
        self.length = None if config.auto else config.depth

    def grow(self, root_token, device="cpu", plan=None):
        tree = DraftTree.root(root_token, device)
        length = _planned(self.length + 1 if self.length is not None else None, plan) - 1
        for _ in range(length):
            leaf = torch.tensor([tree.size - 1], device=device)
            parents, tokens, scores = _children_of(leaf, tree, (yield tree, leaf), 1)
            if parents.numel() == 0:
                break
            tree = tree.extend(parents, tokens, scores)
        return tree


def default_static_paths(budget: int, rank_decay: float = 0.35) -> tuple[tuple[int, ...], ...]:
    """The ``budget - 1`` rank-paths with the highest prior, rank r weighted ``rank_decay ** r`` and
    each further depth by 0.8: a wide top, a long spine along the best child. Closed under prefixes
    (a path's prior is below its parent's and ties go to the parent, generated first)."""
    frontier: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    chosen: list[tuple[int, ...]] = []
    width = 8
    while len(chosen) < budget - 1 and frontier:
        frontier.sort(key=lambda item: -item[0])
        log_prior, path = frontier.pop(0)
        if path:
            chosen.append(path)
        for rank in range(width):
            frontier.append((log_prior + rank * math.log(rank_decay) + math.log(0.8), path + (rank,)))
    return tuple(chosen)


class StaticBuilder(TreeBuilder):
    """A fixed tree shape: each path ``(r1, ..., rd)`` is the rd-th best child of path (r1..r(d-1)).

    One draft forward per layer, over every node of that layer that has children in the shape.
    """

    name = "static"

    def __init__(self, config: TreeConfig) -> None:
        self.paths = config.static_paths or default_static_paths(config.budget)
        known = set(self.paths) | {()}
        for path in self.paths:
            if path[:-1] not in known:
                raise ValueError(f"static_paths: {path} has no parent path {path[:-1]}")
        self.depth = max(len(p) for p in self.paths)

    def grow(self, root_token, device="cpu", plan=None):
        if plan is not None:
            raise ValueError("the static tree has a fixed shape: it takes no per-step plan")
        tree = DraftTree.root(root_token, device)
        node_of = {(): 0}
        for depth in range(1, self.depth + 1):
            layer = [p for p in self.paths if len(p) == depth]
            parent_paths = sorted({p[:-1] for p in layer if p[:-1] in node_of}, key=lambda p: node_of[p])
            if not parent_paths:
                break
            expanded = torch.tensor([node_of[p] for p in parent_paths], device=device)
            log_p_draft = yield tree, expanded  # [F, V]
            max_rank = 1 + max(p[-1] for p in layer)
            top_log_p, top_tokens = log_p_draft.topk(min(max_rank, log_p_draft.shape[-1]), dim=-1)  # [F, R]
            row_of = {p: i for i, p in enumerate(parent_paths)}
            new_paths, parents, tokens, scores = [], [], [], []
            for path in layer:
                row = row_of.get(path[:-1])
                if row is None or path[-1] >= top_log_p.shape[-1] or not torch.isfinite(top_log_p[row, path[-1]]):
                    continue
                new_paths.append(path)
                parents.append(node_of[path[:-1]])
                tokens.append(top_tokens[row, path[-1]])
                scores.append(tree.scores[node_of[path[:-1]]] + top_log_p[row, path[-1]].float())
            if not new_paths:
                break
            for offset, path in enumerate(new_paths):
                node_of[path] = tree.size + offset
            tree = tree.extend(torch.tensor(parents, device=device), torch.stack(tokens), torch.stack(scores))
        return tree


class EagleBuilder(TreeBuilder):
    """EAGLE-2/3 dynamic tree (see ../shared/reference/eagle_notes.md).

    Layer 1: the top-k children of the root. Each further layer (``depth`` layers in all, one draft
    forward each): the top-k children of every frontier node scored by cumulative log-probability;
    the best k of those k*k become the next frontier. Finally one global top-(budget - 1) over every
    generated node; a stable sort by score keeps each parent ahead of its children (a child's score
    never exceeds its parent's), so the kept set is a tree.
    """

    name = "eagle"
    layered = False  # the global rerank needs every layer

    def __init__(self, config: TreeConfig) -> None:
        self.topk, self.depth, self.budget = config.topk, config.depth, None if config.auto else config.budget

    def grow(self, root_token, device="cpu", plan=None):
        tree = DraftTree.root(root_token, device)
        budget = _planned(self.budget, plan)
        if budget <= 1:
            return tree
        frontier = torch.zeros(1, dtype=torch.long, device=device)
        for _ in range(self.depth):
            parents, tokens, scores = _children_of(frontier, tree, (yield tree, frontier), self.topk)
            if parents.numel() == 0:
                break
            parents, tokens, scores = _by_score(parents, tokens, scores)
            first_new = tree.size
            tree = tree.extend(parents, tokens, scores)
            frontier = torch.arange(first_new, first_new + min(self.topk, parents.numel()), device=device)
        if tree.size <= budget:
            return tree
        order = torch.sort(tree.scores[1:], descending=True, stable=True).indices[: budget - 1] + 1
        keep = torch.cat([torch.zeros(1, dtype=torch.long, device=device), order.sort().values])
        return tree.select(keep)

    def inclusion_order(self, tree):
        """Score order (stable, so a parent precedes its children): the rerank keeps the best N - 1."""
        return [0] + (torch.sort(tree.scores[1:], descending=True, stable=True).indices + 1).tolist()


class TalonBuilder(TreeBuilder):
    """TALON budget-driven hybrid expansion, Algorithm 2 of arXiv 2601.07353.

    ``p(v) = p(parent) * P_draft(token | path)`` is kept in log space. Layer 1 is the top-K children
    of the root. At layer d >= 1 every child of every frontier node is a candidate (the pool
    ``[F, V]``); with ``m`` the pool maximum, the gate keeps ``p >= mu * m`` as an element-wise mask
    plus ``nonzero`` (no sort of the pool); if that overflows the budget, the top ``N - |T|`` of the
    survivors by ``p`` are kept. Every kept node is a parent next layer (one batched draft forward);
    there is no depth cap and the loop ends when ``|T| = N`` (root counted), or earlier only when the
    drafter gives no candidate of non-zero probability.
    """

    name = "talon"

    def __init__(self, config: TreeConfig) -> None:
        self.budget = None if config.auto else config.budget
        self.topk, self.log_mu = config.topk, math.log(config.mu)

    def grow(self, root_token, device="cpu", plan=None):
        tree = DraftTree.root(root_token, device)
        budget = _planned(self.budget, plan)
        frontier = torch.zeros(1, dtype=torch.long, device=device)
        while tree.size < budget:
            room = budget - tree.size
            log_p_draft = yield tree, frontier  # [F, V]
            if tree.size == 1:  # robust initialisation: top-K of the root's children
                parents, tokens, scores = _children_of(frontier, tree, log_p_draft, min(self.topk, room))
            else:
                pool = tree.scores[frontier][:, None] + log_p_draft.float()  # [F, V] cumulative log p
                pool_max = pool.max()
                if not torch.isfinite(pool_max):
                    break
                rows, tokens = (pool >= pool_max + self.log_mu).nonzero(as_tuple=True)  # the gate
                parents, scores = frontier[rows], pool[rows, tokens]
                if scores.numel() > room:  # overflow: the best (N - |T|) survivors
                    top = scores.topk(room).indices
                    parents, tokens, scores = parents[top], tokens[top], scores[top]
            if parents.numel() == 0:
                break
            parents, tokens, scores = _by_score(parents, tokens, scores)
            first_new = tree.size
            tree = tree.extend(parents, tokens, scores)
            frontier = torch.arange(first_new, tree.size, device=device)
        return tree


BUILDERS: dict[str, type[TreeBuilder]] = {
    builder.name: builder
    for builder in (AutoregressiveBuilder, ChainBuilder, StaticBuilder, EagleBuilder, TalonBuilder)
}


def make_builder(config: TreeConfig) -> TreeBuilder:
    """The builder registered under ``config.method``."""
    return BUILDERS[config.method](config)
