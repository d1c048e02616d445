"""BudgetController: each verify step's budget N, and share_budget for a batch (the package docstring)."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

from ..errors import bad_argument
from .costs import CostCurve
from .records import StepRecord, informs, prefix_outcome

LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # the budgets considered (and max_budget)
TRUSTED = 4  # steps that must inform a budget before it can be chosen
PREDICTABLE = 0.9  # the target's recent top-1 probability from which text counts as predictable
CONFIDENCE_TOKENS = 8  # committed tokens the recent top-1 probability is a running mean over
STATE_VERSION = 2
REASONS = {  # why a step got its budget (DecodeStats.reasons)
    "initial": "nothing learned yet: the initial budget (or plain, while the catch-up costs more than exploring may)",
    "choice": "the most expected tokens per second",
    "plain-measure": "exploration: a plain step re-measures the cost of one token",
    "probe": "exploration: a larger tree, to learn what it accepts and costs",
    "trial": "exploration: a tree while plain decoding is the choice",
}


@dataclass(frozen=True)
class CostPrior:
    """A warm start for the costs (a ``talon tune`` profile): tree size -> verify, rows -> draft forward seconds."""
    verify_seconds: Mapping[int, float]
    draft_seconds: Mapping[int, float]


@dataclass(frozen=True)
class ControllerSettings:
    """max_budget      the largest tree (root counted)
    initial_budget  the choice before anything is learned
    exploration     the share of time exploration may cost (probes, trials, plain re-measures): the regret bound
    half_life       steps after which what a step taught weighs half (new text moves the estimates)
    cost_window     samples per size in the cost medians
    horizon         tokens over which a catch-up is paid back at most (fewer when the request has fewer left)
    plain_refresh   steps after which a drafted choice re-measures a plain step
    kind_floor      the least predictable text's factor can be (the package docstring): 1, or 0 for n-gram drafts"""

    max_budget: int = 64
    initial_budget: int = 16
    exploration: float = 0.03
    half_life: float = 16.0
    cost_window: int = 16
    horizon: int = 32
    plain_refresh: int = 64
    kind_floor: float = 1.0

    def __post_init__(self) -> None:
        for name, low, high in (("max_budget", 2, 4096), ("initial_budget", 2, self.max_budget),
                                ("cost_window", 1, 4096), ("horizon", 1, 10**6), ("plain_refresh", 1, 10**6)):
            if type(getattr(self, name)) is not int or not low <= getattr(self, name) <= high:
                raise bad_argument(name, getattr(self, name), f"an integer in [{low}, {high}]")
        for name, valid, expected in (("exploration", lambda x: 0 <= x < 1, "a number in [0, 1)"),
                                      ("half_life", lambda x: 0 < x < math.inf, "a number > 0"),
                                      ("kind_floor", lambda x: 0 <= x <= 1, "a number in [0, 1]")):
            if type(getattr(self, name)) not in (int, float) or not valid(getattr(self, name)):
                raise bad_argument(name, getattr(self, name), expected)


class Value:
    """Per candidate budget, aged sums over the steps that informed it of their weight, committed tokens at it and
    at the budget below and nodes, and its draft forwards by width (priced when read); and their count."""
    NAMES = ("weight", "tokens", "below", "nodes")

    def __init__(self, candidates: tuple[int, ...]) -> None:
        self.candidates = candidates
        self.sums = {name: [0.0] * len(candidates) for name in self.NAMES}
        self.widths: list[dict[int, float]] = [{} for _ in candidates]  # forward width -> count
        self.informed = [0] * len(candidates)

    def add(self, record: StepRecord) -> None:
        for i, k in enumerate(self.candidates[1:], start=1):
            if not informs(record, k):
                break
            outcome, below = prefix_outcome(record, k), prefix_outcome(record, self.candidates[i - 1])
            for name, amount in zip(self.NAMES, (1, outcome.accepted + 1, below.accepted + 1, outcome.tree_size)):
                self.sums[name][i] += amount
            for width in outcome.draft_widths:
                self.widths[i][width] = self.widths[i].get(width, 0.0) + 1
            self.informed[i] += 1

    def ratios(self) -> dict[int, float]:  # each budget's tokens over the budget below's on the steps informing it
        tokens, below = self.sums["tokens"], self.sums["below"]
        return {k: tokens[i] / below[i] for i, k in enumerate(self.candidates)
                if i and self.informed[i] >= TRUSTED and below[i] > 0}

    def shape(self, budget: int) -> tuple[dict[int, float], float]:
        """(draft forwards by width, verified nodes) of a step at ``budget`` on average; unknown: log2 N forwards."""
        i, guess = self.candidates.index(budget) if budget in self.candidates else -1, max(1.0, math.log2(budget))
        weight = self.sums["weight"][i] if i >= 0 else 0.0
        return ({w: n / weight for w, n in self.widths[i].items()}, self.sums["nodes"][i] / weight) if weight \
            else ({(budget - 1) / guess: guess}, budget)

    def age(self, factor: float) -> None:
        self.sums = {name: [x * factor for x in sums] for name, sums in self.sums.items()}
        self.widths = [{w: n * factor for w, n in counts.items()} for counts in self.widths]

    def load(self, data: dict) -> "Value":  # the sums and counts BudgetController.to_dict wrote
        self.sums, self.informed = {name: list(map(float, data["sums"][name])) for name in self.NAMES}, data["informed"]
        self.widths = [{int(w): float(n) for w, n in counts.items()} for counts in data["widths"]]
        if {len(self.informed), len(self.widths), *map(len, self.sums.values())} != {len(self.candidates)}:
            raise ValueError("controller state: per-candidate sums of another length")
        return self


class BudgetController:
    """Pure logic (no torch, no clock: times come in through :class:`StepRecord`); the same records give the
    same budgets. Protocol: ``next_budget`` before each step (then read ``reason``), ``observe`` after it."""

    def __init__(self, settings: ControllerSettings = ControllerSettings(), prior: CostPrior | None = None) -> None:
        self.settings = settings
        self.candidates = tuple(sorted({k for k in LADDER if k < settings.max_budget}
                                       | {settings.max_budget, settings.initial_budget}))
        self.verify = CostCurve(settings.cost_window, prior.verify_seconds if prior else None)  # tree size -> seconds
        self.draft = CostCurve(settings.cost_window, prior.draft_seconds if prior else None)  # rows forwarded -> seconds
        self.other = CostCurve(settings.cost_window)  # draft forwards in the step -> seconds of the rest of it
        self.value = Value(self.candidates)  # every drafted step
        self.by_kind = (Value(self.candidates), Value(self.candidates))  # the steps on open / predictable text
        self.confidence = 0.0  # the target's top-1 probability, an exponential mean over committed tokens (1/8 each)
        self.choice, self.reason = settings.initial_budget, "initial"
        self.credit = 0.0  # seconds exploration may still lose
        self._catch_up = 0  # tokens the drafter must catch up before the coming step's tree
        self.catch_up_row = 0.0  # > 0: a fresh start's catch-up is paid within exploration (at this a row unmeasured)

    def next_budget(self, catch_up_tokens: int = 0, tokens_left: int | None = None) -> int:
        """The coming step's budget N (1 = a plain step), given the committed tokens the drafter must forward before
        drafting (the prompt, plain steps' tokens) and the most the request may still commit (None: unknown)."""
        for name, value in (("catch_up_tokens", catch_up_tokens), ("tokens_left", tokens_left)):
            if (value is not None or name == "catch_up_tokens") and (type(value) is not int or value < 0):
                raise bad_argument(name, value, "an integer >= 0" + (" or None" if name == "tokens_left" else ""))
        self._catch_up = catch_up_tokens
        if tokens_left == 1:  # one token to go: no draft could be kept
            self.reason = "choice"
            return 1
        rates, s = self.rates(catch_up_tokens, tokens_left), self.settings
        if max(rates, default=1) == 1:  # no drafted budget known yet: a fresh start, or forgotten
            price = self.catch_up_row and self.catch_up_seconds(catch_up_tokens)  # priced where the loop asks
            free = s.exploration * (tokens_left or s.horizon) / rates[1] if 1 in rates else 0.0
            wait = price > self.credit + free  # a catch-up dearer than exploration may lose: plain until it is not
            self.credit -= 0.0 if wait else max(price - free, 0.0)
            self.reason = "plain-measure" if wait and 1 not in rates else "initial"
            self.choice = 1 if wait else self.choice if self.choice > 1 and 1 in rates else s.initial_budget
            return self.choice
        self.choice = max(rates, key=lambda k: (rates[k], -k))
        budget, self.reason = self.choice, "choice"
        action = self._exploration(rates, catch_up_tokens)
        if action is not None:
            budget, self.reason, loss = action
            self.credit -= max(loss, 0.0)
        return budget

    def observe(self, record: StepRecord) -> None:
        """Learn what the step cost and accepted."""
        self.credit += self.settings.exploration * (sum(record.draft_seconds) + (record.catch_up_seconds or 0.0)
                                                    + record.verify_seconds + record.other_seconds)
        self.verify.add(record.size, record.verify_seconds)
        self.other.add(len(record.forward_widths), record.other_seconds)
        values = (self.value, self.by_kind[self.predictable])  # the kind of text the step was chosen for
        for value in (self.value, *self.by_kind):  # every step ages what the steps before it taught
            value.age(0.5 ** (1 / self.settings.half_life))
        for confidence in record.confidence:
            self.confidence += (confidence - self.confidence) / CONFIDENCE_TOKENS
        if not record.forward_widths:
            return
        first_rows = record.forward_widths[0]  # the catch-up rides on the first forward, unless run apart
        if record.catch_up_seconds is not None and self._catch_up:
            self.draft.add(self._catch_up, record.catch_up_seconds)
        elif record.catch_up_seconds is None:
            first_rows += self._catch_up
        for rows, draft_seconds in zip((first_rows,) + record.forward_widths[1:], record.draft_seconds):
            self.draft.add(rows, draft_seconds)
        for value in values:
            value.add(record)

    @property
    def predictable(self) -> bool:  # whether the recent text is predictable: recent top-1 probability >= PREDICTABLE
        return self.confidence >= PREDICTABLE

    def expected_tokens(self) -> dict[int, float]:
        """Expected committed tokens per step by budget: all text's :meth:`Value.ratios` chained up from 1 at N = 1,
        the drafted ones scaled by what the recent kind of text accepted at N = 2 against all text."""
        every = self.value.ratios()
        own = self.by_kind[self.predictable].ratios().get(2, every.get(2))
        scale = (own - 1) / (every[2] - 1) if 2 in every and every[2] > 1 else 1.0
        scale = max(scale, self.settings.kind_floor) if self.predictable else scale
        expected, tokens = {1: 1.0}, 1.0
        for k in self.candidates[1:]:
            if k not in every:
                break
            tokens *= every[k]
            expected[k] = 1 + (tokens - 1) * scale
        return expected

    def seconds(self, budget: int, full: bool = False) -> float:
        """Expected seconds of a step at ``budget`` as measured (``full``: the verify of its tree filled)."""
        if budget == 1:
            return self.verify(1) + self.other(0)
        widths, nodes = self.value.shape(budget)
        return self.verify(budget if full else nodes) + sum(n * self.draft(w) for w, n in widths.items()) + \
            self.other(sum(widths.values()))

    def catch_up_seconds(self, tokens: int) -> float:
        """What forwarding ``tokens`` more rows adds to a draft forward: past the most rows measured at least their
        cost per row (a forward's fixed cost is in the measured one's); before any is measured, ``catch_up_row``."""
        if not self.draft(1):
            return tokens * self.catch_up_row
        largest, extra = max(self.draft.samples, default=1), self.draft(tokens + 1) - self.draft(1)
        return max(extra, tokens * self.draft(largest) / largest if tokens >= largest else 0.0) if tokens else 0.0

    def rates(self, catch_up_tokens: int = 0, tokens_left: int | None = None) -> dict[int, float]:
        """Expected committed tokens per second by budget (N = 1 once measured), drafting charged the catch-up."""
        rates = {1: 1.0 / self.seconds(1)} if self.verify.has(1) else {}
        horizon = min(tokens_left or self.settings.horizon, self.settings.horizon)
        catch_up = self.catch_up_seconds(catch_up_tokens) / horizon  # seconds per committed token
        rates.update({k: tokens / (self.seconds(k) + catch_up * tokens)
                      for k, tokens in self.expected_tokens().items() if k > 1})
        return rates

    def _exploration(self, rates: dict[int, float], catch_up: int) -> tuple[int, str, float] | None:
        """(budget, reason, the most it can lose) of an exploration step that the credit covers now, or None."""
        if 1 not in rates:
            return 1, "plain-measure", 0.0  # a fresh controller measures one plain step, credit or not
        s, choice = self.settings, self.choice
        if choice > 1 and self.verify.age(1) >= s.plain_refresh:
            action = 1, "plain-measure", 1 / rates[1] - 1 / rates[choice]
        elif choice > 1:
            reach = min(max(2 * choice, s.initial_budget), s.max_budget)  # far enough past a dip in the rate
            larger = [k for k in self.candidates if k >= reach and k > choice]
            if not larger:
                return None
            action = larger[0], "probe", self.seconds(larger[0], full=True) - self.seconds(choice)
        else:
            trial = max(max((k for k in rates if k > 1), key=rates.get, default=1), s.initial_budget)  # best or initial
            action = trial, "trial", self.seconds(trial, full=True) + self.catch_up_seconds(catch_up) - self.seconds(1)
            if self.by_kind[self.predictable].informed[1] < TRUSTED:  # a kind of text hardly drafted: try it
                return trial, "trial", 0.0
        return action if self.credit >= action[2] else None

    def for_next_sequence(self) -> "BudgetController":
        return copy.deepcopy(self)  # a copy continues with the next request; this one stays as it is

    def to_dict(self) -> dict:
        """What it learned, as JSON-ready data (:meth:`from_dict` reads it back)."""
        values = [{"sums": v.sums, "widths": v.widths, "informed": v.informed} for v in (self.value, *self.by_kind)]
        return {"version": STATE_VERSION, "settings": asdict(self.settings), "choice": self.choice,
                "credit": self.credit, "confidence": self.confidence, "values": values,
                "costs": [curve.to_dict() for curve in (self.verify, self.draft, self.other)]}

    @classmethod
    def from_dict(cls, data: dict) -> "BudgetController":
        """The controller :meth:`to_dict` wrote; ValueError for data of another version or shape."""
        try:
            if data["version"] != STATE_VERSION or len(data["values"]) != 3 or len(data["costs"]) != 3:
                raise ValueError(f"controller state: not of version {STATE_VERSION}")
            controller = cls(ControllerSettings(**data["settings"]))
            controller.value, *kinds = (Value(controller.candidates).load(saved) for saved in data["values"])
            controller.by_kind = tuple(kinds)
            controller.verify, controller.draft, controller.other = map(CostCurve.from_dict, data["costs"])
            controller.choice, controller.credit, controller.confidence = \
                int(data["choice"]), float(data["credit"]), float(data["confidence"])
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"controller state: {error!r}") from error
        return controller


def share_budget(expected_tokens: Sequence[Mapping[int, float]],
                 step_seconds: Callable[[list[int]], float]) -> list[int]:
    """One verify budget shared by R requests: ``budgets[r]`` (1 = a plain row) of the batch's most expected tokens
    per second, given each request's expected tokens by budget (``expected_tokens[r]``, its controller's, 1 -> 1.0)
    and the seconds of one batched step of given budgets. Each move raises the request of best marginal tokens
    per added row to its next budget; of every allocation passed, all plain included, the fastest wins."""
    budgets = [1] * len(expected_tokens)
    best_rate, best = len(budgets) / step_seconds(budgets), list(budgets)
    while True:
        moves = []
        for r, table in enumerate(expected_tokens):
            k = min((k for k in table if k > budgets[r]), default=None)  # the request's next budget
            if k is not None:
                moves.append(((table[k] - table[budgets[r]]) / (k - budgets[r]), -r, r, k))
        if not moves:
            return best
        *_, r, k = max(moves)  # the best gain; on a tie, the first request
        budgets[r] = k
        rate = sum(table[b] for table, b in zip(expected_tokens, budgets)) / step_seconds(budgets)
        if rate > best_rate:
            best_rate, best = rate, list(budgets)
