"""The draft tree: one frozen dataclass of tensors, with everything else derived from it.

A tree of ``N`` nodes (the *budget* N of TALON counts the root, arXiv 2601.07353 §3, Algorithm 2)
is stored as four aligned vectors:

    tokens  [N]  int64   token id of each node; node 0 is the root = the last committed token
    parents [N]  int64   parent index; the root has -1 and every other node has parents[i] < i
    depth   [N]  int64   0 for the root, depth[parent] + 1 otherwise
    scores  [N]  float32 cumulative draft log-probability of the root-to-node path (root 0.0)

Parents precede their children, so a prefix ``tree[:n]`` is itself a tree. Siblings carry distinct
tokens. The constructor checks all of this (a tree built from outside); :meth:`root` and :meth:`extend`,
which grow a tree on every draft forward, keep it by construction and skip the checks, which would wait
for the device (:meth:`select` checks only that its nodes are closed under parents). Derived views, computed once on first use:

    ancestors   [N, N] bool  row i marks i and every ancestor of i (the tree attention pattern)
    positions   [N]          depth, i.e. the offset of the node after the root's position
    paths       list of root-to-leaf index paths (one per leaf, root first)

``visibility(past)`` extends ``ancestors`` over the committed past; the model adapter turns it into
the additive mask the model consumes (a bool mask is silently wrong on the eager backend of
transformers, see ../shared/reference/cpu_facts.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True, eq=False)
class DraftTree:
    """An immutable draft tree. Build it with :meth:`root` and grow it with :meth:`extend`."""

    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64, root = -1
    depth: torch.Tensor  # [N] int64
    scores: torch.Tensor  # [N] float32, cumulative draft log-probability

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        for name in ("tokens", "parents", "depth", "scores"):
            vector = getattr(self, name)
            if vector.dim() != 1 or vector.shape[0] != n:
                raise ValueError(f"DraftTree.{name} must be a vector of {n} entries, got {tuple(vector.shape)}")
        if n == 0 or int(self.parents[0]) != -1:
            raise ValueError("DraftTree needs a root at index 0 with parent -1")
        if n > 1:
            child_parents = self.parents[1:]
            index = torch.arange(1, n, device=self.parents.device)
            if bool((child_parents < 0).any()) or bool((child_parents >= index).any()):
                raise ValueError("DraftTree.parents must satisfy 0 <= parents[i] < i for every non-root node")
            if not torch.equal(self.depth[1:], self.depth[child_parents] + 1) or int(self.depth[0]) != 0:
                raise ValueError("DraftTree.depth must be 0 at the root and depth[parent] + 1 elsewhere")
            # Siblings must carry distinct tokens: (parent, token) pairs are unique.
            keys = child_parents * (int(self.tokens.max()) + 1) + self.tokens[1:]
            if keys.unique().numel() != n - 1:
                raise ValueError("DraftTree has two siblings with the same token")

    # ------------------------------------------------------------------ construction
    @classmethod
    def _grown(cls, tokens: torch.Tensor, parents: torch.Tensor, depth: torch.Tensor,
               scores: torch.Tensor) -> "DraftTree":
        """A tree from this class's own verbs, whose invariants hold by construction: no checks, no device sync."""
        tree = object.__new__(cls)
        for name, value in zip(("tokens", "parents", "depth", "scores"), (tokens, parents, depth, scores)):
            object.__setattr__(tree, name, value)
        return tree

    @classmethod
    def root(cls, token: int, device: torch.device | str = "cpu") -> "DraftTree":
        """A one-node tree: just the root (the last committed token)."""
        return cls._grown(
            tokens=torch.tensor([int(token)], dtype=torch.long, device=device),
            parents=torch.tensor([-1], dtype=torch.long, device=device),
            depth=torch.zeros(1, dtype=torch.long, device=device),
            scores=torch.zeros(1, dtype=torch.float32, device=device),
        )

    def extend(self, parents: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor) -> "DraftTree":
        """Return a new tree with the given nodes appended: parents [M] int64 (already in this tree), tokens [M]
        int64 (distinct from their siblings'), scores [M] float (cumulative log-probabilities). Not checked: the
        builders guarantee both (the oracle tests hold them to it)."""
        parents = parents.to(self.parents.device, torch.long)
        return DraftTree._grown(
            tokens=torch.cat([self.tokens, tokens.to(self.tokens.device, torch.long)]),
            parents=torch.cat([self.parents, parents]),
            depth=torch.cat([self.depth, self.depth[parents] + 1]),
            scores=torch.cat([self.scores, scores.to(self.scores.device, torch.float32)]),
        )

    def select(self, keep: torch.Tensor) -> "DraftTree":
        """The subtree made of the nodes ``keep`` [M] (sorted, contains 0, closed under parents)."""
        keep = keep.to(self.parents.device, torch.long)
        new_index = torch.full((self.size,), -1, dtype=torch.long, device=keep.device)
        new_index[keep] = torch.arange(keep.numel(), device=keep.device)
        old_parents = self.parents[keep]
        parents = torch.where(old_parents >= 0, new_index[old_parents.clamp(min=0)], old_parents)
        if bool((parents[1:] < 0).any()):
            raise ValueError("DraftTree.select needs a set of nodes closed under parents")
        return DraftTree._grown(self.tokens[keep], parents, self.depth[keep], self.scores[keep])

    # ------------------------------------------------------------------ derived views
    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @cached_property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """[N, N] bool: ancestors[i, j] is True when j is i or an ancestor of i."""
        n = self.size
        mask = torch.eye(n, dtype=torch.bool, device=self.tokens.device)
        parents = self.parents.tolist()
        for i in range(1, n):  # parents precede children: row i = row of parent + i
            mask[i] |= mask[parents[i]]
        return mask

    @property
    def positions(self) -> torch.Tensor:
        """[N] position offsets from the root (the node depth, = ancestors row sums - 1)."""
        return self.depth

    def visibility(self, past_length: int) -> torch.Tensor:
        """[N, past_length + N] bool: every node sees the whole past, itself and its ancestors.

        The model adapter (:class:`talon_sd.lm.CausalLM`) turns it into the additive float mask.
        """
        past = torch.ones(self.size, past_length, dtype=torch.bool, device=self.tokens.device)
        return torch.cat([past, self.ancestors], dim=1)

    @cached_property
    def children(self) -> list[list[int]]:
        """children[i]: the child indices of node i, in index order (best score first for all builders)."""
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for child, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                kids[parent].append(child)
        return kids

    @cached_property
    def paths(self) -> list[list[int]]:
        """Root-to-leaf index paths, one per leaf, root first."""
        parents = self.parents.tolist()
        result = []
        for leaf, kids in enumerate(self.children):
            if kids:
                continue
            path = [leaf]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            result.append(path[::-1])
        return result

    def path_to(self, node: int) -> list[int]:
        """Indices from the root to ``node`` inclusive."""
        parents = self.parents.tolist()
        path = [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]

    def layer_widths(self) -> list[int]:
        """Number of nodes at depth 0, 1, ..., max_depth."""
        return torch.bincount(self.depth).tolist()
