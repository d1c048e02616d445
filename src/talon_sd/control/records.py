"""What one verified step tells the controller (:class:`StepRecord`), and what it tells about every
smaller budget through the prefix property (:func:`prefix_outcome`; the package docstring of
:mod:`talon_sd.control`)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import NamedTuple

from ._checks import is_number, is_seconds


@dataclass(frozen=True)
class StepRecord:
    """One verify step as the controller sees it. Node lists are in inclusion order (root first).

    node_log_p            [M] cumulative draft log-prob of each node, root 0.0
    node_parent           [M] parent's inclusion position, root -1 (parents precede children)
    accepted              inclusion positions of the accepted draft nodes, ascending, root excluded
                          (a root-to-node path)
    forward_widths        [F] nodes fed to each draft forward (F = 0 for a plain step)
    prefix_after_forward  [F] tree size usable once forward j is done (non-decreasing, last == M);
                          EAGLE: (1, ..., 1, M)
    draft_seconds         [F] measured seconds of each draft forward
    verify_seconds        target forward + acceptance over the M nodes
    other_seconds         the rest of the step (tree building, cache commit, bookkeeping)
    budget                the budget the controller asked for (M <= budget)
    complete              the builder stopped BEFORE reaching the budget (early stop or nothing left to
                          add): a larger budget would have given the same tree
    confidence            [A + 1] the target's top-1 probability at the root and at each accepted node, i.e.
                          before each committed token (design 12); () when the loop does not report it
    catch_up_seconds      seconds of a catch-up the drafter ran as a forward of its own before the first draft
                          forward, which then forwarded the root alone (design 23); None: none ran apart (the
                          first forward carries any catch-up)
    context_tokens        tokens in the target's cache that the tree attended to (prompt and committed tokens
                          before the root; design 33); None when the loop does not report it
    """

    node_log_p: tuple[float, ...]
    node_parent: tuple[int, ...]
    accepted: tuple[int, ...]
    forward_widths: tuple[int, ...]
    prefix_after_forward: tuple[int, ...]
    draft_seconds: tuple[float, ...]
    verify_seconds: float
    other_seconds: float
    budget: int
    complete: bool
    confidence: tuple[float, ...] = ()
    catch_up_seconds: float | None = None
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("node_log_p", "node_parent", "accepted", "forward_widths", "prefix_after_forward",
                     "draft_seconds", "confidence"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        size, forwards = len(self.node_log_p), len(self.forward_widths)
        if size < 1:
            raise ValueError("StepRecord.node_log_p: needs at least the root")
        if len(self.node_parent) != size:
            raise ValueError(f"StepRecord.node_parent: {len(self.node_parent)} entries for {size} nodes")
        if self.node_parent[0] != -1 or any(not 0 <= self.node_parent[i] < i for i in range(1, size)):
            raise ValueError("StepRecord.node_parent: root -1, then 0 <= parent < position")
        previous = 0
        for position in self.accepted:
            if not previous < position < size or self.node_parent[position] != previous:
                raise ValueError(f"StepRecord.accepted: {self.accepted} is not an ascending root-to-node path")
            previous = position
        if len(self.prefix_after_forward) != forwards or len(self.draft_seconds) != forwards:
            raise ValueError(f"StepRecord: forward_widths, prefix_after_forward and draft_seconds differ in "
                             f"length ({forwards}, {len(self.prefix_after_forward)}, {len(self.draft_seconds)})")
        if any(width < 1 for width in self.forward_widths):
            raise ValueError("StepRecord.forward_widths: every draft forward has at least one node")
        prefix = self.prefix_after_forward
        if any(not 1 <= p <= size for p in prefix) or any(a > b for a, b in zip(prefix, prefix[1:])):
            raise ValueError(f"StepRecord.prefix_after_forward: {prefix} must be non-decreasing in [1, {size}]")
        if (prefix[-1] if prefix else 1) != size:
            raise ValueError(f"StepRecord: a tree of {size} nodes needs its last forward's prefix == {size} "
                             "(no forward: the root alone)")
        for name in ("verify_seconds", "other_seconds"):
            if not is_seconds(getattr(self, name)):
                raise ValueError(f"StepRecord.{name}: got {getattr(self, name)!r}, expected finite seconds >= 0")
        if not all(is_seconds(s) for s in self.draft_seconds):
            raise ValueError("StepRecord.draft_seconds: expected finite seconds >= 0")
        if self.catch_up_seconds is not None and (not is_seconds(self.catch_up_seconds) or not forwards):
            raise ValueError(f"StepRecord.catch_up_seconds: got {self.catch_up_seconds!r}, expected None or finite "
                             "seconds >= 0 before a step's first draft forward")
        if not 1 <= size <= self.budget:
            raise ValueError(f"StepRecord.budget: a tree of {size} nodes cannot come from budget {self.budget}")
        if not self.complete and size != self.budget:
            raise ValueError(f"StepRecord.complete: False, but the tree has {size} < budget {self.budget} nodes "
                             "(a tree short of its budget is complete)")
        if self.confidence and (len(self.confidence) != len(self.accepted) + 1
                                or not all(is_number(q) and 0.0 <= q <= 1.0 for q in self.confidence)):
            raise ValueError(f"StepRecord.confidence: {len(self.confidence)} values for {len(self.accepted) + 1} "
                             "committed tokens; expected () or one probability in [0, 1] per committed token")

    @property
    def size(self) -> int:
        """M, the number of verified nodes (root counted)."""
        return len(self.node_log_p)


class PrefixOutcome(NamedTuple):
    """What a step would have been with budget k (its tree = the first ``tree_size`` nodes)."""

    accepted: int  # accepted draft tokens (bonus excluded)
    forwards: int  # draft forwards budget k runs
    draft_widths: tuple[int, ...]  # [forwards] their widths
    tree_size: int  # verified nodes, min(k, M)


def informs(record: StepRecord, budget: int) -> bool:
    """Whether ``record`` says what budget ``budget`` would have done (k <= M, or the tree was complete)."""
    return budget <= record.size or record.complete


def prefix_outcome(record: StepRecord, budget: int) -> PrefixOutcome:
    """The outcome of budget k counterfactually, from the prefix property (the package docstring).

    accepted = accepted positions < k; forwards = 0 for k = 1, else the smallest j with
    prefix_after_forward[j - 1] >= k (every forward when k > M, which needs ``complete``).
    Raises ValueError for a budget the record does not inform.
    """
    if budget < 1 or not informs(record, budget):
        raise ValueError(f"budget {budget}: a step of budget {record.budget} that built {record.size} nodes "
                         f"({'complete' if record.complete else 'cut by its budget'}) does not inform it")
    if budget == 1:
        return PrefixOutcome(0, 0, (), 1)
    if budget > record.size:
        forwards = len(record.forward_widths)
    else:
        forwards = bisect_left(record.prefix_after_forward, budget) + 1
    return PrefixOutcome(bisect_left(record.accepted, budget), forwards, record.forward_widths[:forwards],
                         min(budget, record.size))


def is_layered(record: StepRecord) -> bool:
    """Whether each draft forward expanded exactly the nodes the previous one added (TALON, chain), as
    the record's widths and prefixes show; not so for EAGLE, whose rerank hides its frontiers."""
    widths, prefix = record.forward_widths, record.prefix_after_forward
    return bool(widths) and widths[0] == 1 and all(
        prefix[j - 1] - (prefix[j - 2] if j >= 2 else 1) == widths[j] for j in range(1, len(widths)))


def expanded_positions(record: StepRecord) -> list[int]:
    """Inclusion positions of the nodes fed to a draft forward: for a layered record every node but the
    last layer's; otherwise the nodes that have children stand in."""
    if is_layered(record):
        prefix = record.prefix_after_forward
        return [0] + list(range(1, prefix[-2] if len(prefix) >= 2 else 1))
    return sorted(set(record.node_parent[1:]))


def fully_expanded_positions(record: StepRecord) -> list[int]:
    """:func:`expanded_positions` less the parents of a last layer the budget cut (they lost children to the
    budget, not to the draft)."""
    expanded = expanded_positions(record)
    forwards = len(record.forward_widths)
    if not record.complete and forwards >= 2 and is_layered(record):
        last_frontier_start = record.prefix_after_forward[-3] if forwards >= 3 else 1
        expanded = [p for p in expanded if p < last_frontier_start]
    return expanded
