"""What the loop observed about acceptance: by the draft's cumulative path probability
(:class:`Calibration`, design 4 of :mod:`talon_sd.control`) and by the target's confidence in the recent text
(:class:`Predictability`, design 12)."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque

from .records import StepRecord, fully_expanded_positions

DEFAULT_CALIBRATION_EDGES = (0.0, -0.1, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0, -8.0)  # then -inf
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.85, 0.95, 0.99)  # bins of the target's top-1 probability (design 12)
FOLLOW_PRIOR_SHARE = 0.5  # prior: a tree catches this share of what the draft's top-1 misses (design 12)
CHILD_PRIOR_SHARE = 0.7  # prior: an accepted, expanded node has one of its drafted children accepted 70% of the time


class Calibration:
    """a(p) = P(node accepted) and e(p) = P(a child accepted | node expanded), in bins of the node's
    cumulative draft log p, as decayed Beta posteriors (the package docstring, design 4)."""

    def __init__(self, edges: tuple[float, ...], decay: float, prior_strength: float) -> None:
        self.edges, self.decay, self.strength = edges, decay, prior_strength
        self._bounds = sorted(edges[1:])  # ascending
        middles = [(a + b) / 2 for a, b in zip(edges, edges[1:])] + [edges[-1] - 1.0]
        self.accept_prior = [math.exp(m) for m in middles]
        self.child_prior = [CHILD_PRIOR_SHARE * a for a in self.accept_prior]
        bins = len(edges)
        self.nodes = [0.0] * bins  # decayed count of nodes seen per bin
        self.accepted_nodes = [0.0] * bins
        self.expanded = [0.0] * bins
        self.expanded_with_child = [0.0] * bins
        self.accept = list(self.accept_prior)  # [bins] current a
        self.child = list(self.child_prior)  # [bins] current e
        self.steps = 0

    def bin(self, log_p: float) -> int:
        """0 for log p in (edges[1], 0], ..., the last bin for log p <= edges[-1]."""
        return len(self._bounds) - bisect_left(self._bounds, log_p)

    def observe(self, record: StepRecord) -> None:
        decay = self.decay
        for counts in (self.nodes, self.accepted_nodes, self.expanded, self.expanded_with_child):
            for i in range(len(counts)):
                counts[i] *= decay
        accepted = set(record.accepted)
        log_p = record.node_log_p
        for position in range(1, record.size):
            b = self.bin(log_p[position])
            self.nodes[b] += 1.0
            if position in accepted:
                self.accepted_nodes[b] += 1.0
        with_accepted_child = {record.node_parent[position] for position in record.accepted}
        for position in fully_expanded_positions(record):
            b = self.bin(log_p[position])
            self.expanded[b] += 1.0
            if position in with_accepted_child:
                self.expanded_with_child[b] += 1.0
        s = self.strength
        self.accept = [(hit + s * prior) / (n + s)
                       for hit, n, prior in zip(self.accepted_nodes, self.nodes, self.accept_prior)]
        self.child = [(hit + s * prior) / (n + s)
                      for hit, n, prior in zip(self.expanded_with_child, self.expanded, self.child_prior)]
        self.steps += 1

    def rows(self) -> list[dict]:
        labels = [f"({b:g}, {a:g}]" for a, b in zip(self.edges, self.edges[1:])] + [f"(-inf, {self.edges[-1]:g}]"]
        return [{"log_p": label, "accepted": round(a, 4), "child_accepted": round(e, 4), "nodes": round(n, 2),
                 "expanded": round(x, 2)}
                for label, a, e, n, x in zip(labels, self.accept, self.child, self.nodes, self.expanded)]


class Predictability:
    """How predictable the current text is, from the target's own confidence (design 12).

    ``recent``: the target's top-1 probability before each of the last ``history`` (at least ``window``)
    committed tokens, which every step reports, a plain step too; predictions read its last ``window`` unless
    told how many (design 28). ``follow(q)``: P(the tree holds the token the target commits
    next | the target's top-1 probability there is q), learned from drafted steps at every accepted-path
    position whose node was expanded, per bin of q (``CONFIDENCE_EDGES``) as decayed Beta posteriors; prior
    ``q + (1 - q) / 2`` at the bin's middle (a tree catches about half of what the draft's top-1 misses).
    :meth:`chain_tokens` replays the recent confidences as a chain: the committed tokens a step of F
    forwards would expect on text like the last ``window`` tokens."""

    def __init__(self, window: int, decay: float, prior_strength: float, history: int | None = None) -> None:
        self.window = window
        self.recent: deque[float] = deque(maxlen=max(window, history or window))  # [<= maxlen] oldest first
        self.decay, self.strength = decay, prior_strength
        lows = (0.0,) + CONFIDENCE_EDGES
        highs = CONFIDENCE_EDGES + (1.0,)
        middles = [(a + b) / 2 for a, b in zip(lows, highs)]
        self.prior = [m + FOLLOW_PRIOR_SHARE * (1.0 - m) for m in middles]
        self.top_prior = middles  # prior of a chain: the draft's top-1 is the target's as often as the target is sure
        self.seen = [0.0] * len(self.prior)  # decayed expanded positions per bin
        self.held = [0.0] * len(self.prior)  # ... whose next committed token was in the tree
        self.held_top = [0.0] * len(self.prior)  # ... whose next committed token was the draft's top-1 child there
        self.follow_table = list(self.prior)
        self.top_follow_table = list(self.top_prior)

    def follow(self, q: float, top: bool = False) -> float:
        """P(the tree holds the next committed token | the target's top-1 probability q); ``top``: P(the draft's
        top-1 child is that token), what a chain of one-node forwards holds (design 23)."""
        return (self.top_follow_table if top else self.follow_table)[bisect_right(CONFIDENCE_EDGES, q)]

    def observe(self, record: StepRecord) -> None:
        if not record.confidence:
            return
        self.recent.extend(record.confidence)
        if not record.forward_widths:
            return
        for counts in (self.seen, self.held, self.held_top):
            for i in range(len(counts)):
                counts[i] *= self.decay
        expanded = set(fully_expanded_positions(record))
        best_child: dict[int, int] = {}  # parent -> its child of highest draft log p (the first of equals)
        for child in range(1, record.size):
            parent = record.node_parent[child]
            if parent not in best_child or record.node_log_p[child] > record.node_log_p[best_child[parent]]:
                best_child[parent] = child
        path = (0,) + record.accepted
        for depth, (node, q) in enumerate(zip(path, record.confidence)):
            if node in expanded:  # the draft had its chance at the next token
                b = bisect_right(CONFIDENCE_EDGES, q)
                self.seen[b] += 1.0
                held = depth < len(record.accepted)
                self.held[b] += held
                self.held_top[b] += held and best_child.get(node) == path[depth + 1]
        s = self.strength
        self.follow_table = [(hit + s * prior) / (n + s) for hit, n, prior in zip(self.held, self.seen, self.prior)]
        self.top_follow_table = [(hit + s * prior) / (n + s)
                                 for hit, n, prior in zip(self.held_top, self.seen, self.top_prior)]

    def chain_tokens(self, forwards: int, last: int | None = None, top: bool = False) -> list[float]:
        """[forwards + 1] expected committed tokens of a chain of 0 .. forwards draft forwards, averaged over
        the last ``window`` positions (the last ``last`` ones, if given and not 0) as starting points (past the
        window's end, its mean follow); [] when empty. Each forward holds the next token with the tree's follow(q)
        (a tree of the steps' own shape), or with ``top`` the draft's top-1 follow (a chain of one-node forwards)."""
        recent = list(self.recent)[-(last or self.window):]
        follows = [self.follow(q, top) for q in recent]
        if not follows:
            return []
        mean = sum(follows) / len(follows)
        totals = [0.0] * (forwards + 1)
        for start in range(len(follows)):
            survive, tokens = 1.0, 1.0
            totals[0] += 1.0
            for j in range(1, forwards + 1):
                i = start + j - 1
                survive *= follows[i] if i < len(follows) else mean
                tokens += survive
                totals[j] += tokens
        return [t / len(follows) for t in totals]
