"""Measured seconds by size: :class:`CostCurve`, for the controller's costs and ``talon tune``'s profiles."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from statistics import median
from typing import Mapping


def bucket(size: int) -> int:
    """Sizes above 64 (a catch-up's rows) are kept to the nearest multiple of 32, so a curve stays small."""
    return size if size <= 64 else 32 * round(size / 32)


class CostCurve:
    """Seconds by size: the median of each size's last ``window`` samples, made non-decreasing by weighted isotonic
    regression (one slow outlier at a small size does not lift every larger one), interpolated linearly, and past
    the measured sizes continued with the larger of the last segment's and the whole curve's slope (never < 0).
    ``prior`` points stand in for unmeasured sizes, scaled by the median measured / prior ratio of the others."""

    def __init__(self, window: int = 16, prior: Mapping[int, float] | None = None) -> None:
        self.window = window
        self.prior = {int(size): float(seconds) for size, seconds in (prior or {}).items()}
        self.samples: dict[int, deque] = {}
        self.last_added: dict[int, int] = {}  # size -> the add count when it was last measured
        self.adds = 0
        self._fit: tuple[list[int], list[float], float] | None = None

    def add(self, size: int, seconds: float) -> None:
        size = bucket(int(size))
        self.samples.setdefault(size, deque(maxlen=self.window)).append(float(seconds))
        self.adds += 1
        self.last_added[size] = self.adds
        self._fit = None

    def has(self, size: int) -> bool:
        return bucket(size) in self.samples

    def age(self, size: int) -> float:  # adds since ``size`` was last measured (infinite if never)
        return self.adds - self.last_added[bucket(size)] if self.has(size) else float("inf")

    def medians(self) -> dict[int, float]:
        return {size: median(values) for size, values in sorted(self.samples.items())}

    def points(self) -> dict[int, float]:
        """The measured medians, and the scaled prior where a size is not measured."""
        measured = self.medians()
        ratios = [measured[s] / self.prior[s] for s in measured if self.prior.get(s, 0) > 0]
        scale = median(ratios) if ratios else 1.0
        return dict(sorted({**{s: v * scale for s, v in self.prior.items()}, **measured}.items()))

    def __call__(self, size: float) -> float:
        if self._fit is None:
            points = self.points()
            weights = [len(self.samples.get(s, ())) or 1 for s in points]
            xs, ys = list(points), isotonic(list(points.values()), weights)
            slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), (ys[-1] - ys[0]) / (xs[-1] - xs[0]), 0.0) \
                if len(xs) >= 2 else 0.0
            self._fit = xs, ys, slope
        return interpolate(*self._fit, size)

    def to_dict(self) -> dict:
        return {"window": self.window, "prior": self.prior, "adds": self.adds, "last_added": self.last_added,
                "samples": {str(size): list(values) for size, values in self.samples.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "CostCurve":
        curve = cls(int(data["window"]), {int(s): v for s, v in data["prior"].items()})
        for size, values in data["samples"].items():
            for seconds in values:
                curve.add(int(size), seconds)
        curve.adds, curve.last_added = int(data["adds"]), {int(s): int(n) for s, n in data["last_added"].items()}
        return curve


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest to ``values`` in weighted squares."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([value * weight, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, weight_sum, count = blocks.pop()
            blocks[-1] = [blocks[-1][0] + total, blocks[-1][1] + weight_sum, blocks[-1][2] + count]
    return [total / weight_sum for total, weight_sum, count in blocks for _ in range(int(count))]


def interpolate(xs: list[int], ys: list[float], slope: float, x: float) -> float:
    """Linear between the points; past them, on with ``slope`` (floored at 0 below the first)."""
    if not xs:
        return 0.0
    if x <= xs[0]:
        return max(ys[0] - slope * (xs[0] - x), 0.0)
    if x >= xs[-1]:
        return ys[-1] + slope * (x - xs[-1])
    right = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[right - 1], xs[right], ys[right - 1], ys[right]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
