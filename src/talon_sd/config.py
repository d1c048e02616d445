"""Configuration as frozen dataclasses, validated on construction.

Each field maps one-to-one onto a CLI flag (``budget`` <-> ``--budget``); a bad value raises
:class:`~talon_sd.errors.TalonError` naming the field and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import TalonError, bad_argument

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"  # the packaged pair (talon_sd.models loads them)
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
TREE_METHODS = ("ar", "chain", "static", "eagle", "talon")

# Method defaults for this project's machines (2-core CPU, bf16 verification about flat up to
# ~16 tree tokens; see docs/BENCHMARKS.md and `talon tune`). The paper's GPU settings are
# N = 60, K = 10, mu = 0.03 for TALON and N = 60, K = 10, D = 8 for EAGLE-3.
# Only the fields listed for a method apply to it; setting another one is an error.
METHOD_DEFAULTS: dict[str, dict[str, object]] = {
    "ar": {"budget": 1},
    "chain": {"budget": 5, "depth": 4},
    "static": {"budget": 16},
    "eagle": {"budget": 16, "topk": 4, "depth": 5},
    "talon": {"budget": 16, "topk": 4, "mu": 0.03},
}
AUTO = "auto"
AUTO_METHODS = ("chain", "eagle", "talon")  # the methods whose budget the online controller can set
CPU_KERNELS = ("auto", "packed", "default")  # float32 CPU linears: measured choice, oneDNN-packed, torch's own
QUANTIZE = ("auto", "none", "int8", "int4")  # CPU linears of target and draft LM (talon_sd.quantize); auto: see generator
_FIELD_USE = {
    "budget": "tree nodes, root counted (talon, static, eagle's total tokens; chain: depth + 1)",
    "topk": "talon's root children K and eagle's top-k per layer",
    "mu": "talon's gate",
    "depth": "the chain length and eagle's number of draft layers (talon has no depth cap)",
}


@dataclass(frozen=True)
class TreeConfig:
    """How the draft tree is built.

    method   one of ``ar``, ``chain``, ``static``, ``eagle``, ``talon``
    budget   N, the number of tree nodes, root counted (talon, static, eagle's total tokens; chain:
             depth + 1), or ``"auto"``: the online controller (:mod:`talon_sd.control`) picks N
             every step (talon, eagle, chain)
    topk     K: talon's root children; eagle's children per node and frontier width
    mu       talon's gate: keep p >= mu * (largest p in the layer pool), 0 < mu <= 1
    depth    chain length (draft tokens per step) and eagle's number of draft layers
    static_paths  the static tree's shape as sibling-rank paths (default derived from budget)

    Unset (None) fields take the method's default from :data:`METHOD_DEFAULTS`; a field that does not
    apply to the method (talon ``depth``, eagle ``mu``, ...) must stay unset, and a chain's budget
    and depth must agree: contradictory options raise :class:`~talon_sd.errors.TalonError` rather
    than being ignored. Fields that do not apply read as None.
    """

    method: str = "talon"
    budget: int | str | None = None
    topk: int | None = None
    mu: float | None = None
    depth: int | None = None
    static_paths: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.method not in TREE_METHODS:
            raise bad_argument("tree", self.method, "one of " + ", ".join(TREE_METHODS))
        defaults = METHOD_DEFAULTS[self.method]
        for name in ("budget", "topk", "mu", "depth"):
            if name not in defaults and getattr(self, name) is not None:
                raise TalonError(f"{name}: does not apply to the {self.method!r} tree ({name} sets {_FIELD_USE[name]})")
        if self.static_paths is not None and self.method != "static":
            raise TalonError(f"static_paths: does not apply to the {self.method!r} tree")
        if self.method == "ar" and self.budget not in (None, 1):
            raise TalonError("budget: does not apply to the 'ar' tree (plain decoding verifies the root alone)")
        if self.budget == AUTO and self.method not in AUTO_METHODS:
            raise bad_argument("budget", AUTO, f"a number for the {self.method!r} tree ('auto' is for "
                               + ", ".join(AUTO_METHODS) + ")")
        if self.method == "chain":
            self._link_chain_budget_and_depth()
        if self.static_paths is not None:
            paths = tuple(tuple(int(r) for r in p) for p in self.static_paths)
            if not paths or any(len(p) == 0 or min(p) < 0 for p in paths):
                raise bad_argument("static_paths", self.static_paths, "non-empty paths of ranks >= 0")
            if self.budget is not None and self.budget != len(paths) + 1:
                raise TalonError(f"budget: {self.budget} contradicts static_paths ({len(paths)} paths make budget {len(paths) + 1})")
            object.__setattr__(self, "static_paths", paths)
            object.__setattr__(self, "budget", len(paths) + 1)
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.budget != AUTO:
            _check_int("budget", self.budget, 2 if self.method != "ar" else 1,
                       "an integer >= 2 (tree nodes, root counted) or 'auto'")
        if self.topk is not None:
            _check_int("topk", self.topk, 1, "an integer >= 1")
        if self.depth is not None:
            _check_int("depth", self.depth, 1, "an integer >= 1")
        if self.mu is not None and (not _is_number(self.mu) or not 0 < self.mu <= 1):
            raise bad_argument("mu", self.mu, "a number in (0, 1]")

    def _link_chain_budget_and_depth(self) -> None:
        """A chain of depth d has budget d + 1: either one sets the other; both must agree."""
        budget, depth = self.budget, self.depth
        if budget == AUTO:
            if depth is not None:
                raise TalonError("depth: a chain with budget 'auto' takes its length from the controller; drop depth")
            return
        if budget is not None and depth is not None and budget != depth + 1:
            raise TalonError(f"budget: {budget} contradicts depth {depth} for the chain (a chain of depth d has budget d + 1)")
        if budget is not None and depth is None:
            _check_int("budget", budget, 2, "an integer >= 2 (a chain of depth d has budget d + 1)")
            object.__setattr__(self, "depth", budget - 1)
        elif depth is not None and budget is None:
            _check_int("depth", depth, 1, "an integer >= 1")
            object.__setattr__(self, "budget", depth + 1)

    @property
    def auto(self) -> bool:
        """True when the online controller sets the budget every step."""
        return self.budget == AUTO

    def with_options(self, **options) -> "TreeConfig":
        """This config with ``options`` (None values ignored) replacing fields; every other field kept.
        A chain's new budget (or depth) replaces its depth (or budget)."""
        options = {k: v for k, v in options.items() if v is not None}
        unknown = sorted(set(options) - {"budget", "topk", "mu", "depth", "static_paths"})
        if unknown:
            raise TalonError(f"{unknown[0]}: unknown tree option")
        fields = {name: getattr(self, name) for name in ("budget", "topk", "mu", "depth", "static_paths")}
        if self.method == "chain" and ("budget" in options) != ("depth" in options):
            fields["budget"] = fields["depth"] = None
        if self.method == "static" and "budget" in options:
            fields["static_paths"] = None
        return TreeConfig(method=self.method, **{**fields, **options})

    @property
    def label(self) -> str:
        """A short name for tables: ``talon(N=16,K=4,mu=0.03)``."""
        if self.method == "ar":
            return "ar"
        if self.method == "chain":
            return "chain(k=auto)" if self.auto else f"chain(k={self.depth})"
        if self.method == "eagle":
            return f"eagle(N={self.budget},K={self.topk},D={self.depth})"
        if self.method == "talon":
            return f"talon(N={self.budget},K={self.topk},mu={self.mu:g})"
        return f"static(N={self.budget})"


@dataclass(frozen=True)
class SamplingConfig:
    """Token selection, named as in Hugging Face ``generate``.

    do_sample=False (or temperature=0) is greedy. With sampling, logits are divided by
    ``temperature``, then ``top_k`` (0 = off) and ``top_p`` (1 = off) restrict the support.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not _is_number(self.temperature) or self.temperature < 0:
            raise bad_argument("temperature", self.temperature, "a number >= 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise bad_argument("top_p", self.top_p, "a number in (0, 1]")
        _check_int("top_k", self.top_k, 0, "an integer >= 0 (0 = off)")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, "an integer in [0, 2**64)")
            if self.seed >= 2**64:  # a 64-bit seed (the noise keys are 64-bit)
                raise bad_argument("seed", self.seed, "an integer in [0, 2**64)")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0


@dataclass(frozen=True)
class GenerationConfig:
    """When to stop: ``max_new_tokens``, EOS (the tokenizer's and the model's) and ``stop`` strings."""

    max_new_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 1, "an integer >= 1")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise bad_argument("stop", self.stop, "non-empty strings")
        object.__setattr__(self, "stop", stop)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value, minimum: int, expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_argument(name, value, expected)
