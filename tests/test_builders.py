"""Tree builders on hand-built draft distributions: exact trees, and brute-force references."""

from __future__ import annotations

import math

import pytest
import torch

from talon_sd.builders import BUILDERS, default_static_paths, make_builder
from talon_sd.config import TreeConfig
from talon_sd.tree import DraftTree

V = 50


def path_tokens(tree: DraftTree, node: int) -> tuple[int, ...]:
    return tuple(int(tree.tokens[i]) for i in tree.path_to(node)[1:])


def node_paths(tree: DraftTree) -> set[tuple[int, ...]]:
    return {path_tokens(tree, i) for i in range(1, tree.size)}


class PathExpander:
    """A deterministic fake drafter: the distribution after a path depends only on the path's tokens."""

    def __init__(self, sharpness: float = 1.0, peaked: float | None = None):
        self.sharpness, self.peaked, self.calls = sharpness, peaked, []

    def distribution(self, path: tuple[int, ...]) -> torch.Tensor:
        """log P_draft [V] after ``path``."""
        if self.peaked is not None:  # token (last + 1) % V gets `peaked`, the rest share the remainder
            probs = torch.full((V,), (1 - self.peaked) / (V - 1))
            probs[((path[-1] if path else 0) + 1) % V] = self.peaked
            return probs.log()
        generator = torch.Generator().manual_seed(hash(path) % (2**31))
        return torch.log_softmax(torch.randn(V, generator=generator) * self.sharpness, -1)

    def __call__(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        self.calls.append(nodes.tolist())
        return torch.stack([self.distribution(path_tokens(tree, int(n))) for n in nodes])


def check_tree(tree: DraftTree):
    """Invariants every builder output must satisfy (the constructor checks the rest)."""
    assert int(tree.parents[0]) == -1
    assert all(int(tree.parents[i]) < i for i in range(1, tree.size))
    for kids in tree.children:
        tokens = [int(tree.tokens[k]) for k in kids]
        assert len(tokens) == len(set(tokens)), "duplicate siblings"


# ---------------------------------------------------------------------------------------------- TALON
def test_talon_peaked_draft_grows_deep_and_narrow():
    expander = PathExpander(peaked=0.97)
    tree = make_builder(TreeConfig("talon", budget=20, topk=10, mu=0.03)).build(7, expander)
    check_tree(tree)
    assert tree.size == 20
    # 10 root children, then one node per layer along the confident spine: 9 more layers
    assert tree.layer_widths() == [1, 10] + [1] * 9
    assert tree.max_depth == 10
    spine = path_tokens(tree, tree.size - 1)
    assert spine == tuple((1 + i) % V for i in range(10))  # after token 0: 1, 2, 3, ...
    assert len(expander.calls) == 10  # one batched draft forward per layer


def test_talon_flat_draft_grows_shallow_and_wide():
    expander = PathExpander(sharpness=0.0)  # uniform: every candidate of a layer ties with the maximum
    tree = make_builder(TreeConfig("talon", budget=40, topk=10, mu=0.03)).build(7, expander)
    check_tree(tree)
    assert tree.size == 40
    assert tree.layer_widths() == [1, 10, 29]
    assert len(expander.calls) == 2


@pytest.mark.parametrize("budget,topk,mu,sharpness", [(2, 10, 0.03, 2.0), (8, 3, 0.03, 2.0), (24, 10, 0.03, 3.0),
                                                      (40, 4, 0.1, 4.0), (60, 10, 0.03, 5.0), (16, 1, 1.0, 2.0)])
def test_talon_matches_brute_force_algorithm_2(budget, topk, mu, sharpness):
    expander = PathExpander(sharpness=sharpness)
    tree = make_builder(TreeConfig("talon", budget=budget, topk=topk, mu=mu)).build(0, expander)
    check_tree(tree)
    assert tree.size == budget
    assert node_paths(tree) == brute_force_talon(expander, budget, topk, mu)


def brute_force_talon(expander: PathExpander, budget: int, topk: int, mu: float) -> set[tuple[int, ...]]:
    """Algorithm 2 of arXiv 2601.07353 written with plain Python lists and full sorts."""
    kept = {(): 0.0}  # path -> cumulative log p
    frontier = [()]
    layer = 0
    while len(kept) < budget:
        pool = []
        for parent in frontier:
            log_p = expander.distribution(parent).tolist()
            pool += [(kept[parent] + log_p[w], parent + (w,)) for w in range(V)]
        pool.sort(key=lambda item: -item[0])
        if layer == 0:
            chosen = pool[:topk]
        else:
            best = pool[0][0]
            chosen = [item for item in pool if item[0] >= best + math.log(mu)]
        chosen = chosen[: budget - len(kept)]
        for score, path in chosen:
            kept[path] = score
        frontier = [path for _, path in chosen]
        layer += 1
    return set(kept) - {()}


def test_talon_gate_is_relative_to_the_layer_pool_maximum():
    """Hand-set layer: the gate keeps exactly the candidates within mu of the POOL max, across parents."""

    class TwoParents:
        def __call__(self, tree, nodes):
            log_p = torch.full((len(nodes), V), -30.0)
            if tree.size == 1:
                log_p[0, 1], log_p[0, 2] = math.log(0.6), math.log(0.4)
            else:  # parent token 1 (p=.6) and token 2 (p=.4)
                for row, node in enumerate(nodes.tolist()):
                    if int(tree.tokens[node]) == 1:
                        log_p[row, 10], log_p[row, 11] = math.log(0.9), math.log(0.05)   # .54, .03
                    else:
                        log_p[row, 20], log_p[row, 21] = math.log(0.5), math.log(0.03)   # .20, .012
            return log_p

    tree = make_builder(TreeConfig("talon", budget=7, topk=2, mu=0.05)).build(0, TwoParents())
    # pool max .54, threshold .027: keep .54, .03, .20; drop .012 (and every p ~ 1e-13)
    layer2 = {path_tokens(tree, i) for i in range(tree.size) if int(tree.depth[i]) == 2}
    assert layer2 == {(1, 10), (1, 11), (2, 20)}


# ---------------------------------------------------------------------------------------------- EAGLE
@pytest.mark.parametrize("budget,topk,depth,sharpness", [(8, 2, 3, 2.0), (16, 4, 5, 3.0), (60, 10, 7, 3.0),
                                                        (30, 3, 8, 1.0), (5, 8, 2, 2.0)])
def test_eagle_matches_brute_force(budget, topk, depth, sharpness):
    expander = PathExpander(sharpness=sharpness)
    tree = make_builder(TreeConfig("eagle", budget=budget, topk=topk, depth=depth)).build(0, expander)
    check_tree(tree)
    expected = brute_force_eagle(expander, budget, topk, depth)
    assert node_paths(tree) == expected
    assert tree.size == len(expected) + 1 == min(budget, 1 + topk + (depth - 1) * topk * topk)
    assert len(expander.calls) == depth


def brute_force_eagle(expander, budget, topk, depth):
    """EAGLE-2's topK_generate: top-k per node, top-k of the k*k as frontier, global rerank at the end."""
    generated = {}
    frontier = [((), 0.0)]
    for _ in range(depth):
        layer = []
        for parent, parent_score in frontier:
            log_p = expander.distribution(parent).tolist()
            best = sorted(range(V), key=lambda w: -log_p[w])[:topk]
            layer += [(parent + (w,), parent_score + log_p[w]) for w in best]
        layer.sort(key=lambda item: -item[1])
        generated.update(layer)
        frontier = layer[:topk]
    ranked = sorted(generated.items(), key=lambda item: -item[1])[: budget - 1]
    return {path for path, _ in ranked}


# ---------------------------------------------------------------------------------------------- chain, static, ar
def test_chain_is_the_draft_argmax_path():
    expander = PathExpander(sharpness=3.0)
    tree = make_builder(TreeConfig("chain", depth=6)).build(0, expander)
    assert tree.layer_widths() == [1] * 7
    path = ()
    for node in range(1, 7):
        path = path + (int(expander.distribution(path).argmax()),)
        assert path_tokens(tree, node) == path


def test_static_tree_follows_its_rank_paths():
    paths = ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    expander = PathExpander(sharpness=3.0)
    tree = make_builder(TreeConfig("static", static_paths=paths)).build(0, expander)
    assert tree.size == 7 and tree.layer_widths() == [1, 2, 3, 1]
    ranked = lambda path: expander.distribution(path).argsort(descending=True).tolist()
    r0 = ranked(())
    first, second = (r0[0],), (r0[1],)
    assert node_paths(tree) == {first, second, first + (ranked(first)[0],), first + (ranked(first)[1],),
                                second + (ranked(second)[0],),
                                first + (ranked(first)[0], ranked(first + (ranked(first)[0],))[0])}
    assert len(expander.calls) == 3


@pytest.mark.parametrize("budget", [2, 5, 16, 40])
def test_default_static_shape_has_budget_nodes_and_is_prefix_closed(budget):
    paths = default_static_paths(budget)
    assert len(paths) == budget - 1 == len(set(paths))
    assert all(p[:-1] in set(paths) | {()} for p in paths)
    tree = make_builder(TreeConfig("static", budget=budget)).build(0, PathExpander(sharpness=2.0))
    assert tree.size == budget


def test_ar_never_calls_the_drafter():
    tree = make_builder(TreeConfig("ar")).build(5, lambda *_: pytest.fail("ar must not draft"))
    assert tree.size == 1 and int(tree.tokens[0]) == 5


def test_zero_probability_children_are_never_added():
    """A drafter with nothing to propose (all -inf) leaves the root alone, for every builder."""
    nothing = lambda tree, nodes: torch.full((len(nodes), V), float("-inf"))
    for method in BUILDERS:
        assert make_builder(TreeConfig(method)).build(3, nothing).size == 1
