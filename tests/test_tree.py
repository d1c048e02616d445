"""DraftTree invariants and its derived views (mask, positions, paths)."""

from __future__ import annotations

import pytest
import torch

from talon_sd.tree import DraftTree


def example_tree() -> DraftTree:
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    tree = DraftTree.root(9)
    tree = tree.extend(torch.tensor([0, 0]), torch.tensor([11, 12]), torch.tensor([-0.1, -0.2]))
    tree = tree.extend(torch.tensor([1, 1, 2]), torch.tensor([13, 14, 15]), torch.tensor([-0.3, -0.4, -0.5]))
    return tree.extend(torch.tensor([3]), torch.tensor([16]), torch.tensor([-0.6]))


def test_derived_views():
    tree = example_tree()
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.positions.tolist() == (tree.ancestors.sum(1) - 1).tolist()
    assert tree.paths == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]  # one per leaf, in leaf order
    assert tree.children[1] == [3, 4]
    assert tree.layer_widths() == [1, 2, 3, 1]
    expected_row_6 = [True, True, False, True, False, False, True]
    assert tree.ancestors[6].tolist() == expected_row_6
    visible = tree.visibility(past_length=3)
    assert visible.shape == (7, 10)
    assert visible[:, :3].all() and visible[6, 3:].tolist() == expected_row_6


def test_select_keeps_a_subtree_and_reindexes():
    tree = example_tree().select(torch.tensor([0, 2, 5]))
    assert tree.tokens.tolist() == [9, 12, 15] and tree.parents.tolist() == [-1, 0, 1]
    with pytest.raises(ValueError):
        example_tree().select(torch.tensor([0, 3]))  # 3 without its parent 1


@pytest.mark.parametrize(
    "parents,depth,tokens,message",
    [
        ([-1, 1], [0, 1], [1, 2], "parents"),  # a node its own parent
        ([-1, 0, 3, 0], [0, 1, 2, 1], [1, 2, 3, 4], "parents"),  # child before its parent
        ([0, 0], [0, 1], [1, 2], "root"),
        ([-1, 0], [0, 2], [1, 2], "depth"),
        ([-1, 0, 0], [0, 1, 1], [1, 2, 2], "siblings"),
    ],
)
def test_invalid_trees_are_refused(parents, depth, tokens, message):
    with pytest.raises(ValueError, match=message):
        DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth), torch.zeros(len(tokens)))


def test_random_trees_keep_their_invariants():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        tree = DraftTree.root(0)
        for _ in range(int(torch.randint(1, 6, (1,), generator=generator))):
            count = int(torch.randint(1, 5, (1,), generator=generator))
            parents = torch.randint(0, tree.size, (count,), generator=generator)
            tokens = torch.randperm(1000, generator=generator)[:count]
            tree = tree.extend(parents, tokens, torch.zeros(count))
        for i in range(tree.size):
            path = tree.path_to(i)
            assert tree.ancestors[i].nonzero().flatten().tolist() == sorted(path)
            assert int(tree.depth[i]) == len(path) - 1
        assert sorted({n for p in tree.paths for n in p}) == list(range(tree.size))
