"""Measured costs: seconds as a non-decreasing function of a size (:class:`CostCurve`: verify by tree
size, draft by forward width, the rest of a step by draft forwards; design 1 of :mod:`talon_sd.control`, with
designs 21, 33, 42 and 53), and their warm start (:class:`CostPrior`)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ..errors import bad_argument
from ._checks import is_int, is_seconds, median

RECENT_SAMPLES = 3  # a cost curve's size keeps at least its newest 3 samples in the fit (design 21)
CONTEXT_MIN_SPAN = 1024  # verify samples of one size T, L context tokens apart, with T x L >= this, show the context's
# cost (design 33: 16 nodes 64 tokens apart, a plain step 1024)
CONTEXT_MIN_SIZE = 4  # ... of trees this large (a plain step's is mostly timing noise)
CONTEXT_MIN_PAIRS = 8  # ... and the context slope needs this many such pairs (else 0)
CONTEXT_AGREEING = 0.75  # ... of which this share must find the longer context dearer (a sign test; else 0)
CONTEXT_MIN_EFFECT = 0.05  # ... and explain this share of a pair's seconds over the upper quartile's span (else 0)
CONTEXT_STEP_TOKENS = 32  # the verify curve is re-read at a new context once it moved this much (design 33)
PAIR_STEPS = 4  # a plain verify sample is read against the other sizes' samples within this many adds of it (design 42)
PAIR_MIN = 2  # ... when at least this many are
PAIRED_KEPT = 9  # the paired size is fitted to the median of its newest this many paired samples (design 42)
PLAIN_FOLLOW_MAX = 2.0  # design 53 moves stale sizes by at most this factor either way
PLAIN_FOLLOW_BAND = 0.1  # ... and not at all by a factor within this share of 1 (timing noise)
PLAIN_FOLLOW_CONTEXT = 128  # ... read from plain samples beside stale-size samples within this many context tokens of
# them (the same sequence: a new one's first plain steps lie beside the last sequence's drafted ones)


@dataclass(frozen=True)
class CostPrior:
    """A warm start for the cost curves, e.g. from a saved ``talon tune`` profile or the last generation.

    verify_seconds    tree size -> seconds of one verify step
    draft_seconds     forward width -> seconds of one draft forward
    overhead_seconds  draft forwards per step -> seconds of the rest of the step (optional)
    """

    verify_seconds: dict[int, float]
    draft_seconds: dict[int, float]
    overhead_seconds: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, smallest in (("verify_seconds", 1), ("draft_seconds", 1), ("overhead_seconds", 0)):
            table = getattr(self, name)
            if not isinstance(table, Mapping) or not all(
                    is_int(size) and size >= smallest and is_seconds(seconds) for size, seconds in table.items()):
                raise bad_argument(name, table, f"a mapping of integers >= {smallest} to finite seconds >= 0")
            object.__setattr__(self, name, dict(table))


class CostCurve:
    """Seconds as a non-decreasing function of a size (tree nodes, forward width, forwards per step).

    Keeps the last ``keep`` samples per size; the curve runs through the per-size medians (with ``horizon``,
    of the samples among the last ``horizon`` adds, at least the newest :data:`RECENT_SAMPLES`) after a
    weighted isotonic fit, linearly in between, and outside the known sizes with the larger of the last
    segment's and the whole curve's slope (floored at 0 seconds). ``prior`` points seed it and are
    rescaled by the median measured/prior ratio once measurements exist. Call :meth:`refit` after
    :meth:`add` before reading it.
    """

    def __init__(self, keep: int, prior: Mapping[int, float] | None = None, horizon: int | None = None,
                 paired: int | None = None, follow: bool = False) -> None:
        if horizon is not None and (not is_int(horizon) or horizon < 1):
            raise bad_argument("horizon", horizon, "an integer >= 1 or None")
        if paired is not None and (not is_int(paired) or paired < 0):
            raise bad_argument("paired", paired, "an integer >= 0 or None")
        self.keep = keep
        self.horizon = horizon  # only samples among the last this many adds are fitted (None: all; design 21)
        self.paired = paired  # the size read against its neighbours' samples (None: none; design 42)
        self.follow = bool(follow)  # stale sizes read at the fresh paired size's speed (design 53)
        self._last_adds: deque[tuple[int, float, int | None]] = deque(maxlen=PAIR_STEPS)  # (size, seconds, context)
        # the paired size's samples with their neighbours: the last PAIRED_KEPT paired ones and those still in reach
        self._pairs: deque[_Pair] = deque(maxlen=PAIRED_KEPT + PAIR_STEPS + 1)
        self.samples: dict[int, deque[float]] = {}
        self._clocks: dict[int, deque[int]] = {}  # [like samples] the add count at each sample
        self._contexts: dict[int, deque[int | None]] = {}  # [like samples] the context each was measured at
        self.context: int | None = None  # the context the curve is read at (design 33; None: as measured)
        self.context_slope = 0.0  # seconds per size unit per context token (design 33)
        self.clock = 0  # samples added so far
        points = sorted((prior or {}).items())
        self._prior = _fit([x for x, _ in points], [y for _, y in points], [1.0] * len(points))
        self.xs: list[int] = []  # known sizes, ascending
        self.ys: list[float] = []  # [len(xs)] fitted seconds
        self.slope = 0.0  # seconds per unit of size outside xs
        self._stale = True
        self.refit()

    def add(self, size: int, seconds: float, context: int | None = None) -> None:
        """One sample of ``size``; ``context``: the tokens the measured forward attended to beside its own (design
        33), None when unknown."""
        samples = self.samples.get(size)
        if samples is None:
            samples = self.samples[size] = deque(maxlen=self.keep)
            self._clocks[size] = deque(maxlen=self.keep)
            self._contexts[size] = deque(maxlen=self.keep)
        samples.append(float(seconds))
        self._clocks[size].append(self.clock)
        self._contexts[size].append(context)
        if self.paired is not None:  # design 42: the paired size's samples collect the other sizes' around them
            added = (size, float(seconds), context)
            if size == self.paired:  # a sample that found too few neighbours in its reach leaves room for others
                self._pairs = deque((pair for pair in self._pairs if len(pair.neighbours) >= PAIR_MIN
                                     or self.clock - pair.clock < PAIR_STEPS), maxlen=self._pairs.maxlen)
                before = [(other, y, at) for other, y, at in self._last_adds if other != size]
                self._pairs.append(_Pair(self.clock, float(seconds), context, before))
            else:
                for pair in reversed(self._pairs):
                    if self.clock - pair.clock > PAIR_STEPS:
                        break
                    pair.neighbours.append(added)
            self._last_adds.append(added)
        self.clock += 1
        self._stale = True

    def keep_newest(self, size: int, count: int) -> None:
        """Forget all but ``size``'s newest ``count`` samples (for the paired size, its older pairs too): what was measured
        of it before no longer stands for the machine and text at hand (design 46); ``count`` 0 forgets the size
        (unmeasured again). Call :meth:`refit` before reading."""
        if not is_int(count) or count < 0:
            raise bad_argument("count", count, "an integer >= 0")
        if size not in self.samples:
            return
        for store in (self.samples, self._clocks, self._contexts):
            if count:
                store[size] = deque(list(store[size])[-count:], maxlen=self.keep)
            else:  # none kept: the size is unmeasured again (an empty size would weigh 0 in the fit)
                del store[size]
        if size == self.paired:
            oldest = self._clocks[size][0] if size in self._clocks else self.clock
            self._pairs = deque((pair for pair in self._pairs if pair.clock >= oldest), maxlen=self._pairs.maxlen)
        self._stale = True

    def read_at(self, context: int | None) -> bool:
        """Read the curve at ``context`` tokens from now on (design 33): every sample measured at a known context
        moves by ``context_slope x size x (context - its context)``. A move of less than
        :data:`CONTEXT_STEP_TOKENS` tokens (or a tenth of the context) is ignored, so that a growing sequence does not
        refit at every step. Returns whether the curve changed (then :meth:`refit` before reading it)."""
        if context is None or self.context is not None and abs(context - self.context) < max(
                CONTEXT_STEP_TOKENS, 0.1 * self.context):
            return False
        self.context, self._stale = int(context), True
        return True

    def _context_slope(self) -> float:
        """Theil-Sen over pairs of samples of one size (>= :data:`CONTEXT_MIN_SIZE`) whose contexts lie far enough
        apart (size x context difference >= :data:`CONTEXT_MIN_SPAN`): the median of (seconds difference) / (size x
        context difference). 0 unless there are :data:`CONTEXT_MIN_PAIRS` pairs, :data:`CONTEXT_AGREEING` of them
        find the longer context dearer, and the difference it explains over the upper quartile of the pairs' spans is
        at least :data:`CONTEXT_MIN_EFFECT` of their median seconds: else what the pairs show is timing noise (design
        33)."""
        slopes, spans, seconds = [], [], []
        for size, samples in self.samples.items():
            if size < CONTEXT_MIN_SIZE:
                continue
            measured = [(c, y) for c, y in zip(self._contexts[size], samples) if c is not None]
            for i, (context_i, seconds_i) in enumerate(measured):
                for context_j, seconds_j in measured[i + 1:]:
                    span = size * abs(context_i - context_j)
                    if span >= CONTEXT_MIN_SPAN:
                        slopes.append((seconds_i - seconds_j) / (size * (context_i - context_j)))
                        spans.append(span)
                        seconds.append(0.5 * (seconds_i + seconds_j))
        if len(slopes) < CONTEXT_MIN_PAIRS or sum(slope > 0 for slope in slopes) < CONTEXT_AGREEING * len(slopes):
            return 0.0
        slope, wide = median(slopes), sorted(spans)[(3 * len(spans)) // 4]  # the upper quartile's span
        return slope if slope * wide >= CONTEXT_MIN_EFFECT * median(seconds) else 0.0

    def age(self, size: int) -> float:
        """Adds after ``size``'s newest sample (0: it was the last add; math.inf if never measured)."""
        clocks = self._clocks.get(size)
        return self.clock - 1 - clocks[-1] if clocks else math.inf

    def _at_read_context(self, size: int, seconds: float, measured_at: int | None) -> float:
        """``seconds`` of a sample of ``size`` measured at context ``measured_at``, moved to the context the curve is read
        at by ``context_slope`` (design 33; as measured where either context is unknown)."""
        if self.context_slope <= 0 or measured_at is None or self.context is None:
            return seconds
        return seconds + self.context_slope * size * (self.context - measured_at)

    def _fresh(self, size: int) -> int | float:
        """How many of ``size``'s kept samples lie among the last ``horizon`` adds (all of them: inf without one)."""
        if self.horizon is None:
            return math.inf
        return sum(1 for c in self._clocks[size] if self.clock - c <= self.horizon)

    def _recent(self) -> dict[int, list[float]]:
        """Per size, the samples the fit uses (design 21): those among the last ``horizon`` adds (age < horizon),
        or the newest :data:`RECENT_SAMPLES` if fewer are (every kept sample when ``horizon`` is None); each moved to
        the context the curve is read at (design 33)."""
        self.context_slope = self._context_slope() if self.context is not None else 0.0
        used = {}
        for size, samples in self.samples.items():
            values = list(samples)
            if self.context_slope > 0:
                values = [self._at_read_context(size, y, c) for y, c in zip(values, self._contexts[size])]
            if self.horizon is not None:
                values = values[-max(self._fresh(size), RECENT_SAMPLES):]
            used[size] = values
        return used

    def refit(self) -> None:
        if not self._stale:
            return
        self._stale = False
        measured = {size: (median(values), float(len(values))) for size, values in self._recent().items()}
        if self.paired in self.samples and self._fresh(self.paired) < RECENT_SAMPLES:
            paired = self._paired_seconds(measured)  # design 42: the paired size's own samples are stale
            if paired is not None:  # (weighed in the fit as the samples it replaces)
                measured[self.paired] = (paired, measured[self.paired][1])
        elif self.paired in self.samples and self.follow:
            self._follow_paired(measured)  # design 53: the other sizes' samples may be stale
        prior_xs, prior_ys, prior_slope = self._prior
        points = {}
        if prior_xs:
            ratios = [seconds / reference for size, (seconds, _) in measured.items()
                      if (reference := _interpolate(prior_xs, prior_ys, prior_slope, size)) > 0]
            scale = median(ratios) if ratios else 1.0
            points = {size: (seconds * scale, 1.0) for size, seconds in zip(prior_xs, prior_ys)}
        points.update(measured)
        xs = sorted(points)
        self.xs, self.ys, self.slope = _fit(xs, [points[x][0] for x in xs], [points[x][1] for x in xs])

    def _paired_seconds(self, measured: dict[int, tuple[float, float]]) -> float | None:
        """Design 42, where fewer than :data:`RECENT_SAMPLES` of the paired size's samples lie within the horizon (its
        fit would read old samples beside the other sizes' recent ones): its seconds at the host speed the other
        sizes' fit stands for:
        its newest :data:`PAIRED_KEPT` samples among those with at least :data:`PAIR_MIN` neighbours (other sizes'
        samples within :data:`PAIR_STEPS` adds of it), each times the median over its neighbours of (the fit without the
        paired size at the neighbour's size) / (the neighbour's seconds), all moved to the read context (design 33); the
        median of those. None without such a sample or without another size measured (the paired size is then fitted
        as any other)."""
        pairs = [pair for pair in self._pairs if len(pair.neighbours) >= PAIR_MIN][-PAIRED_KEPT:]
        others = {size: point for size, point in measured.items() if size != self.paired}
        if not pairs or not others:
            return None
        xs = sorted(others)
        fitted = _fit(xs, [others[x][0] for x in xs], [others[x][1] for x in xs])
        return self._paired_median(reversed(pairs), lambda size, at, pair: _interpolate(*fitted, size))

    def _paired_median(self, pairs: Iterable[_Pair],
                       reference: Callable[[int, int | None, _Pair], float | None]) -> float | None:
        """Designs 42 and 53: over ``pairs`` (newest first), each paired sample's seconds times the median over its
        neighbours of (``reference(size, context, pair)``, skipped where None) / (the neighbour's seconds), all at the
        read context (design 33); the median of the newest :data:`PAIRED_KEPT` such values, or None without one."""
        values = []
        for pair in pairs:
            ratios = [known / seconds for size, y, at in pair.neighbours
                      if (known := reference(size, at, pair)) is not None
                      and (seconds := self._at_read_context(size, y, at)) > 0]
            if ratios:
                values.append(self._at_read_context(self.paired, pair.seconds, pair.context) * median(ratios))
                if len(values) == PAIRED_KEPT:
                    break
        return median(values) if values else None

    def _follow_paired(self, measured: dict[int, tuple[float, float]]) -> None:
        """Design 53, the mirror of design 42, where the paired size is fresh (at least :data:`RECENT_SAMPLES` of its
        samples lie within the horizon: a spell of plain steps) and every other size is stale (fewer than that; with
        one of them fresh nothing moves, so that a noisy ratio cannot reorder the drafted sizes): moves each
        stale size's seconds in ``measured`` by (the paired size's seconds now) / (its seconds at the host speed and
        context the stale sizes were measured at), clamped to [1 / :data:`PLAIN_FOLLOW_MAX`, :data:`PLAIN_FOLLOW_MAX`],
        unless that factor lies within :data:`PLAIN_FOLLOW_BAND` of 1 (timing noise, which would tip choices at
        break-even both ways; a long prompt's context or a slow spell moves plain steps by 1.2-1.7x on the AVX2-only
        EPYC). The latter is the median over the newest :data:`PAIRED_KEPT` paired samples with a stale size among their
        neighbours of (its seconds) x (the median over those neighbours of the stale size's seconds / the neighbour's
        seconds), all at the read context (design 33). Only neighbours of the stale sizes themselves count (their fit,
        extrapolated to a fresh size, would read a dear tree as cheap), and only those measured within
        :data:`PLAIN_FOLLOW_CONTEXT` tokens of the paired sample's context (a new sequence's first plain steps lie beside
        the last sequence's drafted steps, at another context and often in another spell of the machine: they would
        read the stale sizes at the new speed already). Nothing moves without such a sample."""
        stale = {size: point for size, point in measured.items() if size != self.paired}
        if any(self._fresh(size) >= RECENT_SAMPLES for size in stale):
            return
        then = self._paired_median(reversed(self._pairs), lambda size, at, pair: stale[size][0] if size in stale
                                   and _near(at, pair.context) else None)
        if then is None or then <= 0:
            return
        scale = min(max(measured[self.paired][0] / then, 1.0 / PLAIN_FOLLOW_MAX), PLAIN_FOLLOW_MAX)
        if 1.0 / (1.0 + PLAIN_FOLLOW_BAND) < scale < 1.0 + PLAIN_FOLLOW_BAND:
            return
        for size, (seconds, weight) in stale.items():
            measured[size] = (seconds * scale, weight)

    def has(self, size: int, samples: int = 1) -> bool:
        """Whether ``size`` was measured (at least ``samples`` times among the kept ones) or given by the prior."""
        return len(self.samples.get(size, ())) >= samples or size in self._prior[0]

    def __call__(self, size: float) -> float:
        return _interpolate(self.xs, self.ys, self.slope, size)

    def table(self, up_to: int) -> list[float]:
        """[up_to + 1] the curve at sizes 0..up_to, for fast lookups."""
        xs, ys, slope = self.xs, self.ys, self.slope
        if not xs:
            return [0.0] * (up_to + 1)
        values, right = [], 1
        for size in range(up_to + 1):
            if size <= xs[0]:
                values.append(max(ys[0] - slope * (xs[0] - size), 0.0))
            elif size >= xs[-1]:
                values.append(ys[-1] + slope * (size - xs[-1]))
            else:
                while xs[right] < size:
                    right += 1
                x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
                values.append(y0 + (y1 - y0) * (size - x0) / (x1 - x0))
        return values

    def points(self) -> dict[int, float]:
        """The fitted curve at its known sizes (measured or prior)."""
        return dict(zip(self.xs, self.ys))

    def medians(self) -> dict[int, float]:
        """Measured sizes only: the median of all their kept samples (the fit may use fewer: ``horizon``)."""
        return {size: median(samples) for size, samples in sorted(self.samples.items())}


@dataclass
class _Pair:
    """A sample of a :class:`CostCurve`'s paired size and the other sizes' samples added around it (design 42); the
    curve appends to ``neighbours`` while later adds are within :data:`PAIR_STEPS` of it."""

    clock: int  # the curve's add count at the sample
    seconds: float
    context: int | None
    neighbours: list[tuple[int, float, int | None]]  # (size, seconds, context) of other sizes within PAIR_STEPS adds


def _near(context: int | None, other: int | None) -> bool:
    """Two samples' contexts lie within :data:`PLAIN_FOLLOW_CONTEXT` tokens (or either is unknown; design 53)."""
    return context is None or other is None or abs(context - other) <= PLAIN_FOLLOW_CONTEXT


def _fit(xs: list[int], ys: list[float], weights: list[float]) -> tuple[list[int], list[float], float]:
    """Weighted isotonic (non-decreasing) fit of ys over ascending xs, and the extrapolation slope."""
    fitted = _isotonic(ys, weights)
    slope = 0.0
    if len(xs) >= 2:
        last = (fitted[-1] - fitted[-2]) / (xs[-1] - xs[-2])
        overall = (fitted[-1] - fitted[0]) / (xs[-1] - xs[0])
        slope = max(last, overall, 0.0)
    return list(xs), fitted, slope


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest to ``values`` in weighted squares."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value * weight, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, weight_sum, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += weight_sum
            blocks[-1][2] += count
    fitted = []
    for total, weight_sum, count in blocks:
        fitted.extend([total / weight_sum] * int(count))
    return fitted


def _interpolate(xs: list[int], ys: list[float], slope: float, x: float) -> float:
    if not xs:
        return 0.0
    if x <= xs[0]:
        return max(ys[0] - slope * (xs[0] - x), 0.0)
    if x >= xs[-1]:
        return ys[-1] + slope * (x - xs[-1])
    right = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
