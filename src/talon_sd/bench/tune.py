"""Hardware-aware tree budgets: the cost model, the choice, and ``--budget auto``.

The paper fixes N = 60 on an H200, where verifying 60 tokens costs about one decoding step. On a
2-core CPU a 64-token verification costs ~2.7 steps, so the best N is a property of the machine
(and of the model pair and dtype). ``talon tune`` measures that machine and picks, per method, the
tree options that maximise the expected decoding speed under this cost model.

Cost model (one verify step of tree configuration c, in seconds)::

    t_step(c)  = E[t_verify(T)]                      T = tree size of a step (root counted)
               + E[sum over the step's draft forwards of t_draft(w)]
               + t_overhead(c)
    tokens/s(c) = MAT(c) / t_step(c)

* ``t_verify(T)``: one target forward over a T-node tree on a ~200-token cache, logits for every
  node, measured for T in {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128} (median of several repeats),
  piecewise-linear in between, extrapolated linearly past the last point.
* ``t_draft(w)``: one draft forward over a frontier of w nodes plus the log-softmax of each row
  (a tree expansion); the first forward of every step, which carries the w tokens committed by the
  previous step and needs only the last logits, is timed separately (``draft_root``).
* ``T``, the draft-forward widths ``w``, ``MAT(c)`` (committed tokens per verify step, bonus
  included) and ``t_overhead(c)`` (tree construction and bookkeeping per step: the loop's time
  outside the draft forwards and the verify step; the acceptance rule inside the verify step, a few
  ms, is not modelled) come from a short calibration with the real decoding loop
  (a few prompts x a few dozen tokens, greedy or sampled at the temperature being tuned for). Expectations are per step: an
  :class:`AcceptancePoint` stores the share of steps per tree size and the number of draft forwards
  per step per width, so t_step is linear in the measured costs.
* Prefill is left out: it is the same for every configuration.

The choice (:func:`choose_budget`) is a pure function of a :class:`ForwardCosts` and a list of
:class:`AcceptancePoint`; :func:`coordinate_search` varies one option at a time (e.g. TALON's N at
the default mu, then mu at the best N) so that ``talon tune`` stays a few minutes long.

Profiles are JSON files under ``<cache>/profiles`` (see :mod:`talon_sd.bench.profiles`), one per
machine (CPU model, torch threads, device), target, draft, dtype and calibration temperature.
:func:`tuned_tree_options` reads them for ``--budget auto`` (``talon generate`` and ``talon bench``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

from ..config import TreeConfig
from ..control import CostCurve
from ..errors import TalonError

# The TreeConfig fields a tuned profile sets for each method.
TUNED_FIELDS: dict[str, tuple[str, ...]] = {
    "talon": ("budget", "mu", "topk"),
    "eagle": ("budget", "topk", "depth"),
    "chain": ("depth",),
    "static": ("budget",),
}

# One option varied per stage, the others at the best value found so far (method defaults at first).
DEFAULT_STAGES: dict[str, tuple[tuple[str, tuple], ...]] = {
    "talon": (("budget", (4, 6, 8, 12, 16, 24, 32, 48)), ("mu", (0.01, 0.03, 0.1)), ("topk", (4,))),
    "eagle": (("depth", (2, 3, 4, 5, 6)), ("budget", (6, 8, 12, 16, 24, 32, 48)), ("topk", (2, 4, 8))),
    "chain": (("depth", (1, 2, 3, 4, 5, 6)),),
    "static": (("budget", (4, 6, 8, 12, 16, 24, 32)),),
}

VERIFY_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DRAFT_WIDTHS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
ROOT_WIDTHS = (1, 2, 3, 4, 6, 8)


@dataclass(frozen=True)
class ForwardCosts:
    """Measured forward costs in seconds: ``verify[T]`` (target, T tree tokens), ``draft[w]`` (draft, w
    frontier nodes), ``draft_root[w]`` (draft, w committed tokens, last logits only; falls back to draft),
    read between and past the measured sizes as the online controller reads its own
    (:class:`talon_sd.control.CostCurve`)."""

    verify: dict[int, float]
    draft: dict[int, float]
    draft_root: dict[int, float] = field(default_factory=dict)

    @cached_property
    def _curves(self) -> dict[str, CostCurve]:
        return {name: CostCurve(prior=getattr(self, name)) for name in ("verify", "draft", "draft_root")}

    def verify_seconds(self, size: float) -> float:
        return self._curves["verify"](size)

    def draft_seconds(self, width: float, root: bool = False) -> float:
        return self._curves["draft_root" if root and self.draft_root else "draft"](width)

    def to_dict(self) -> dict:
        return {name: {str(k): round(v, 6) for k, v in sorted(getattr(self, name).items())}
                for name in ("verify", "draft", "draft_root")}

    @classmethod
    def from_dict(cls, data: dict) -> "ForwardCosts":
        return cls(**{name: {int(k): float(v) for k, v in (data.get(name) or {}).items()}
                      for name in ("verify", "draft", "draft_root")})


@dataclass(frozen=True)
class AcceptancePoint:
    """Calibration of one tree configuration, per verify step (see the module cost model)."""

    method: str
    options: dict  # TreeConfig fields, e.g. {"budget": 16, "topk": 4, "mu": 0.03, "depth": 0}
    mat: float  # committed tokens per verify step, bonus included
    tree_sizes: dict[int, float]  # tree size -> share of steps (sums to 1)
    draft_widths: dict[int, float] = field(default_factory=dict)  # frontier width -> draft forwards per step
    root_widths: dict[int, float] = field(default_factory=dict)  # tokens in the step's first draft forward -> per step
    overhead_seconds: float = 0.0  # tree construction + bookkeeping per step
    measured_tokens_per_s: float | None = None  # the calibration's own decoding speed (prefill excluded)

    @property
    def delta(self) -> float:
        """Draft forwards per verify step."""
        return sum(self.draft_widths.values()) + sum(self.root_widths.values())

    @property
    def mean_tree_size(self) -> float:
        return sum(size * share for size, share in self.tree_sizes.items())

    def to_dict(self) -> dict:
        return {
            "method": self.method, "options": self.options, "mat": round(self.mat, 4),
            "delta": round(self.delta, 4), "mean_tree_size": round(self.mean_tree_size, 3),
            "tree_sizes": {str(k): round(v, 5) for k, v in self.tree_sizes.items()},
            "draft_widths": {str(k): round(v, 5) for k, v in self.draft_widths.items()},
            "root_widths": {str(k): round(v, 5) for k, v in self.root_widths.items()},
            "overhead_seconds": round(self.overhead_seconds, 6),
            "measured_tokens_per_s": None if self.measured_tokens_per_s is None else round(self.measured_tokens_per_s, 4),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "AcceptancePoint":
        return cls(
            method=data["method"], options=dict(data["options"]), mat=float(data["mat"]),
            tree_sizes={int(k): float(v) for k, v in data["tree_sizes"].items()},
            draft_widths={int(k): float(v) for k, v in data.get("draft_widths", {}).items()},
            root_widths={int(k): float(v) for k, v in data.get("root_widths", {}).items()},
            overhead_seconds=float(data.get("overhead_seconds", 0.0)),
            measured_tokens_per_s=data.get("measured_tokens_per_s"),
        )


def step_seconds(cost: ForwardCosts, point: AcceptancePoint) -> float:
    """Expected seconds of one verify step of ``point``'s configuration (the module's t_step)."""
    verify = sum(share * cost.verify_seconds(size) for size, share in point.tree_sizes.items())
    draft = sum(count * cost.draft_seconds(width) for width, count in point.draft_widths.items())
    root = sum(count * cost.draft_seconds(width, root=True) for width, count in point.root_widths.items())
    return verify + draft + root + point.overhead_seconds


def predicted_tokens_per_s(cost: ForwardCosts, point: AcceptancePoint) -> float:
    """MAT / t_step: the expected decoding speed of ``point``'s configuration on the measured machine."""
    seconds = step_seconds(cost, point)
    return point.mat / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class Choice:
    """The configuration with the highest predicted tokens/s, and every candidate ranked (best first)."""

    method: str
    options: dict
    tokens_per_s: float
    ranking: list[tuple[AcceptancePoint, float]]


def choose_budget(cost_curve: ForwardCosts, acceptance_curve: Sequence[AcceptancePoint], tolerance: float = 0.0) -> Choice:
    """Pick the configuration that maximises the predicted tokens/s (module cost model).

    With ``tolerance`` > 0, the smallest budget whose prediction is within that fraction of the best
    wins instead (a smaller tree when the gain is within measurement noise). Pure: no timing here.
    """
    if not acceptance_curve:
        raise ValueError("choose_budget needs at least one acceptance point")
    ranking = sorted(((p, predicted_tokens_per_s(cost_curve, p)) for p in acceptance_curve), key=lambda item: -item[1])
    best_rate = ranking[0][1]
    eligible = [item for item in ranking if item[1] >= best_rate * (1 - tolerance)]
    point, rate = min(eligible, key=lambda item: (item[0].options.get("budget", 0), -item[1])) if tolerance > 0 else ranking[0]
    return Choice(method=point.method, options=dict(point.options), tokens_per_s=rate, ranking=ranking)


def coordinate_search(method: str, stages: Sequence[tuple[str, Sequence]], cost: ForwardCosts,
                      calibrate: Callable[[TreeConfig], AcceptancePoint], tolerance: float = 0.0) -> Choice:
    """Vary one TreeConfig field per stage over its values, the fields of earlier stages at their best
    (later fields at the method defaults); every distinct configuration is calibrated once. Returns
    the best of every configuration calibrated."""
    fixed: dict = {}
    points: dict[tuple, AcceptancePoint] = {}
    for name, values in stages:
        stage = []
        for value in values:
            config = TreeConfig(method=method, **{**fixed, name: value})
            key = (config.budget, config.topk, config.mu, config.depth)
            if key not in points:
                points[key] = calibrate(config)
            stage.append(points[key])
        fixed[name] = choose_budget(cost, stage, tolerance).options[name]
    return choose_budget(cost, list(points.values()), tolerance)


def count_configs(stages: Sequence[tuple[str, Sequence]]) -> int:
    """An upper bound on the configurations :func:`coordinate_search` calibrates (for progress bars)."""
    return sum(len(values) for _, values in stages)


def tuned_options(method: str, options: dict) -> dict:
    """The fields of ``options`` that a profile sets for ``method`` (:data:`TUNED_FIELDS`)."""
    return {name: options[name] for name in TUNED_FIELDS.get(method, ()) if options.get(name) is not None}


def tuned_tree_options(method: str, target: str | None, draft: str | None, dtype: str | None,
                       temperature: float = 0.0, quantize: str = "none") -> dict:
    """The tuned TreeConfig options of ``method`` for this machine, model pair, dtype and decoding mode.

    ``temperature`` is the run's (0 = greedy): a sampled run takes a profile calibrated by sampling
    (:func:`talon_sd.bench.profiles.find_profile`), a greedy run a greedy one. ``quantize`` is the run's (an
    ``auto`` dtype resolves by it).

    e.g. ``{"budget": 12, "mu": 0.03, "topk": 4}`` (talon), ``{"budget": 16, "topk": 4, "depth": 3}``
    (eagle), ``{"depth": 3}`` (chain), ``{"budget": 12}`` (static; TALON's N when static was not
    tuned), ``{}`` for ``ar``. Raises TalonError when no profile exists for this machine, models, dtype
    and decoding mode.
    """
    from .profiles import find_profile, profile_key, tune_command

    if method == "ar":
        return {}
    if method not in TUNED_FIELDS:
        raise TalonError(f"budget: 'tuned' is not available for method {method!r}")
    key = profile_key(target, draft, dtype, temperature=temperature, quantize=quantize)
    found = find_profile(key)
    if found is None:
        mode = f"for sampling (temperature {temperature:g})" if temperature > 0 else "for greedy decoding"
        raise TalonError(f"budget: 'tuned' needs a profile tuned {mode}; run `{tune_command(key)}` first")
    profile, path = found
    methods = profile.get("methods", {})
    if method in methods:
        return tuned_options(method, methods[method]["best"])
    if method == "static" and "talon" in methods:
        return {"budget": methods["talon"]["best"]["budget"]}
    raise TalonError(f"budget: 'tuned' for {method}: the tuned profile {path} has no {method} entry; "
                     f"run `{tune_command(profile.get('key') or key)} --methods {method}`")
