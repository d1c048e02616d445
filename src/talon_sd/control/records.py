"""What one verified step tells the controller (:class:`StepRecord`), and what it tells about every
smaller budget (:func:`prefix_outcome`, the prefix property of the package docstring)."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import NamedTuple


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class StepRecord:
    """One verify step as the controller sees it. Nodes are in the builder's inclusion order (root first).

    node_parent           [M] parent's inclusion position, root -1 (parents precede children)
    accepted              inclusion positions of the accepted draft nodes: an ascending root-to-node path
    forward_widths        [F] nodes fed to each draft forward (F = 0: a plain step)
    prefix_after_forward  [F] tree size usable once forward j is done (non-decreasing, last == M)
    draft_seconds         [F] seconds of each draft forward
    verify_seconds        target forward + acceptance over the M nodes
    other_seconds         the rest of the step (tree building, cache commit, bookkeeping)
    budget                the budget asked for (M <= budget)
    complete              the tree stopped short of its budget: any larger budget builds the same tree
    catch_up_seconds      a catch-up the drafter ran apart before its first forward (None: none ran apart)
    confidence            [A + 1] the target's top-1 probability before each committed token (() if not told)
    """

    node_parent: tuple[int, ...]
    accepted: tuple[int, ...]
    forward_widths: tuple[int, ...]
    prefix_after_forward: tuple[int, ...]
    draft_seconds: tuple[float, ...]
    verify_seconds: float
    other_seconds: float
    budget: int
    complete: bool
    catch_up_seconds: float | None = None
    confidence: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("node_parent", "accepted", "forward_widths", "prefix_after_forward", "draft_seconds",
                     "confidence"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        size, parent, prefix = len(self.node_parent), self.node_parent, self.prefix_after_forward
        path = (0,) + self.accepted
        checks = {
            "node_parent": size >= 1 and parent[0] == -1 and all(0 <= parent[i] < i for i in range(1, size)),
            "accepted": all(a < b < size and parent[b] == a for a, b in zip(path, path[1:])),
            "forward_widths": len(prefix) == len(self.draft_seconds) == len(self.forward_widths)
            and all(w >= 1 for w in self.forward_widths),
            "prefix_after_forward": all(1 <= a <= b for a, b in zip(prefix, prefix[1:] + (size,)))
            and (prefix[-1] if prefix else 1) == size,
            "seconds": all(map(_seconds, (self.verify_seconds, self.other_seconds, *self.draft_seconds))),
            "catch_up_seconds": self.catch_up_seconds is None or (_seconds(self.catch_up_seconds) and bool(prefix)),
            "confidence": not self.confidence or (len(self.confidence) == len(path)
                                                  and all(_seconds(q) and q <= 1 for q in self.confidence)),
            "budget": 1 <= size <= self.budget and (self.complete or size == self.budget),
        }
        bad = [name for name, holds in checks.items() if not holds]
        if bad:
            raise ValueError(f"StepRecord.{bad[0]}: inconsistent with the rest of the record ({self})")

    @property
    def size(self) -> int:  # M, the number of verified nodes (root counted)
        return len(self.node_parent)


class PrefixOutcome(NamedTuple):
    """What a step would have been with budget k (its tree = the first ``tree_size`` nodes)."""
    accepted: int  # accepted draft tokens (bonus excluded)
    forwards: int  # draft forwards budget k runs
    draft_widths: tuple[int, ...]  # [forwards] their widths
    tree_size: int  # verified nodes, min(k, M)


def informs(record: StepRecord, budget: int) -> bool:
    """Whether ``record`` says what ``budget`` would have done (k <= M, or the tree was complete)."""
    return 1 <= budget and (budget <= record.size or record.complete)


def prefix_outcome(record: StepRecord, budget: int) -> PrefixOutcome:
    """Budget k's outcome: accepted = accepted positions < k; forwards = 0 for k = 1, else the smallest j
    with prefix_after_forward[j - 1] >= k (all of them when k > M). ValueError for a budget not informed."""
    if not informs(record, budget):
        raise ValueError(f"budget {budget}: a step of budget {record.budget} that built {record.size} nodes "
                         f"({'complete' if record.complete else 'cut by its budget'}) does not inform it")
    if budget == 1 or not record.forward_widths:
        return PrefixOutcome(0, 0, (), 1)
    forwards = len(record.forward_widths) if budget > record.size else \
        bisect_left(record.prefix_after_forward, budget) + 1
    return PrefixOutcome(bisect_left(record.accepted, budget), forwards, record.forward_widths[:forwards],
                         min(budget, record.size))
