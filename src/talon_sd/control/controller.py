"""The online budget controller (:class:`BudgetController`): each step's tree budget from measured costs
and counterfactual acceptance; the contract and the designs are in the package docstring of
:mod:`talon_sd.control`."""

from __future__ import annotations

import copy
import math
from collections import Counter, deque
from typing import Sequence

from ..errors import TalonError, bad_argument
from ._checks import check_int, check_number, is_int, is_number, median
from .acceptance import Calibration, Predictability
from .costs import CostCurve, CostPrior
from .records import PrefixOutcome, StepRecord, informs, prefix_outcome
from .settings import ANCHOR_GAP, CHECK_MARGIN, EARLY_CHECK_SHORTFALL, FAR_VERIFY_RATIO, LEAN_FLOOR, ControllerSettings

LENGTHS_KEPT = 3  # finished sequences whose lengths estimate the tokens a request has left (design 9)
RELEASE_Z = 2.5  # a change point also needs the own mean this many standard errors from the carried one
PREDICTED_WIN = 1.1  # from plain, a probe predicted this much faster starts a trial before it is due (design 12)
OWN_CONFIDENCES = 4  # a large catch-up waits for this many of the sequence's own confidences (design 14)
CATCH_UP_MARGIN = 2.0  # ... when the carried rate pays it back less than this many times over (design 14)
SHAPE_PRIOR_STEPS = 1.0  # the chain bound's weight, in steps, beside drafted steps in a predicted rate (design 23)
PRIOR_NEIGHBOURS = 2  # a prompt prior needs this many earlier sequences near the prompt's agreement (design 29)
PRIOR_MIN_TOKENS = 4  # a sequence teaches the prior only after this many tokens from its drafted steps (design 29)
PRIOR_PAIRS = 64  # (agreement, drafted speed over plain) pairs kept, newest last (design 29)
PRIOR_SAMPLE_EVERY = 4  # where no agreement could change a start, only every 4th sequence measures its prompt (design 32)
PRIOR_SAMPLE_MAX = 32  # ... an interval that doubles after each sample that drafted clearly faster than plain (design 35)
CHECK_VERIFY_RATIO = 1.5  # design 46 checks a carried choice where its tree costs this many plain verifies or more
NEW_COMMAND_MARGIN = 1.25  # a new command keeps the carried drafted choice only if it beat plain by this factor (design 27)
# why a step got its budget (:attr:`BudgetController.reason`, recorded per step in the decoding stats)
REASONS = {
    "choice": "the current choice; no trial due and no lean (or the choice is the largest candidate)",
    "trial": "a step of a trial of a larger budget (design 3)",
    "lean": "the lean rung above the choice, within lean_margin of it or not yet trusted (designs 17, 18)",
    "plain-measure": "a plain step measuring verify(1): first samples, then every plain_refresh_interval (design 13)",
    "cost-refresh": "the candidate below a drafted choice, or the choice, run once cost_refresh_interval steps "
                    "ran after its last step: its verify cost re-measured (design 21)",
    "catch-up-skip": "the drafted choice run as a plain step: its catch-up would not pay (designs 6, 14)",
    "trial-untrusted": "a trial was due but the choice has no trusted rate yet",
    "trial-no-own-draft": "a trial was due but the choice ran no drafted step in this sequence or the last (design 11)",
    "trial-catch-up": "a trial was due but its catch-up costs more than the rest affords (designs 6, 11, 15)",
    "trial-exploration": "a trial was due but trials lost their exploration share already (design 8)",
    "trial-regret": "a trial was due but its catch-up would take trials' losses past the exploration share (design 54)",
    "trial-dominated": "a trial was due but no probe could beat the choice: counted lost (design 3)",
    "trial-unpredictable": "a trial from plain was due but the recent text predicts no probe wins (design 12)",
    "trial-postponed": "a trial was due but the probe's last trials lost more than the rest affords (design 11)",
    "trial-short": "a trial was due but the sequence is expected to end within explore_min_tokens tokens (design 24)",
    "plain-check": "a plain step checking a carried drafted choice on the new text's own steps (designs 46, 51)",
}


def _seconds_saved(tokens: float, plain: float, drafted: float) -> float:
    """Seconds that committing ``tokens`` at rate ``drafted`` saves over plain decoding's rate ``plain``."""
    return tokens * (1.0 / plain - 1.0 / drafted)


def _bucket(tokens: int) -> int:
    """The catch-up curve's size for ``tokens``: the next power of two (its samples are scaled to it)."""
    return 1 << max(tokens - 1, 0).bit_length()


class _Sample:
    """One drafted step, as the candidates it informs see it."""

    __slots__ = ("index", "widths", "outcomes", "stamp", "cumulative_draft", "weight", "scale")

    def __init__(self, index: int, widths: tuple[int, ...], outcomes: list[tuple[int, int, int]]) -> None:
        self.index = index  # step number
        self.widths = widths  # [F] forward widths
        self.outcomes = outcomes  # per informed candidate, ascending: (committed tokens, tree size, forwards)
        self.stamp = -1  # controller version the two caches below belong to
        self.cumulative_draft: list[float] = []  # [F + 1] draft seconds of the first j forwards
        self.weight = 0.0
        self.scale = 1.0  # product of the carried_weight caps of the sequences it was carried into


class BudgetController:
    """Chooses every step's tree budget from measured costs and counterfactual acceptance (the package
    docstring of :mod:`talon_sd.control`). One instance serves one generation; feed it every verified step in
    order."""

    def __init__(self, settings: ControllerSettings = ControllerSettings(), prior: CostPrior | None = None) -> None:
        if not isinstance(settings, ControllerSettings):
            raise bad_argument("settings", settings, "a ControllerSettings")
        if prior is not None and not isinstance(prior, CostPrior):
            raise bad_argument("prior", prior, "a CostPrior or None")
        self.settings = settings
        self.candidates = settings.candidates()  # ascending budgets
        self._index_of = {k: i for i, k in enumerate(self.candidates)}
        prior = prior or CostPrior({}, {})
        refresh = settings.cost_refresh_interval  # design 21: verify samples older than 2 intervals leave the fit
        self.verify_cost = CostCurve(settings.cost_samples, prior.verify_seconds,  # by tree size
                                     horizon=2 * refresh if refresh > 0 else None,
                                     paired=1 if settings.paired_plain else None,  # design 42
                                     follow=settings.follow_plain)  # design 53
        self.draft_cost = CostCurve(settings.cost_samples, prior.draft_seconds)  # by forward width
        self.overhead_cost = CostCurve(settings.cost_samples, prior.overhead_seconds)  # by draft forwards per step
        self.catch_up_cost = CostCurve(settings.cost_samples)  # by catch-up tokens (bucketed): extra first-forward seconds
        self.predictability = Predictability(settings.confidence_window, settings.calibration_decay,
                                             settings.calibration_prior_strength, settings.bet_window)
        self.calibration = Calibration(settings.calibration_edges, settings.calibration_decay,
                                       settings.calibration_prior_strength)
        self._samples = [deque(maxlen=settings.window) for _ in self.candidates]  # per candidate
        self._table_top = settings.max_budget  # the cost tables cover sizes 0..top (grown to what records show)
        self._rebuild_tables()
        self._branch_added = 0.0  # decayed nodes added by forwards after the first...
        self._branch_width = 0.0  # ... per node those forwards expanded
        self._step = 0  # steps observed
        self._version = 0  # bumped at every observe (invalidates the per-sample caches)
        self._choice = settings.initial_budget
        self._planned: int | None = None
        self._reason = "choice"  # why the planned budget (a key of REASONS)
        self._previous_plain = True  # the drafter has tokens to catch up (its prompt; a plain step's tokens)
        self._catch_up_tokens = 0  # what the loop said the drafter has to catch up, for the planned step
        self._sequence_tokens = 0  # tokens committed in this sequence
        self._sequence_confidences = 0  # target confidences reported in this sequence (design 14)
        self._tokens_left: int | None = None  # what the loop said before the planned step
        self._cut_by_limit = False  # the last step committed all the tokens that were left
        self._lengths: deque[int] = deque(maxlen=LENGTHS_KEPT)  # tokens of the last finished sequences
        self._catch_up_skips = 0  # drafted choices run as plain steps because the catch-up would not pay
        self._sequence_start = 0  # the step this sequence started at: samples before it were carried
        self._own_outcomes: list[list[tuple[int, int, int]]] = []  # this sequence's drafted steps' outcomes
        self._released_at: int | None = None  # own drafted steps after which the carried samples were released
        self._observed_seconds = 0.0  # steps' seconds, decayed (carried over)
        self._lost_seconds = 0.0  # seconds trials lost against the choice's rate (signed, decayed; carried over)
        self._exploration_keep = 0.5 ** (1.0 / settings.exploration_half_life)  # weight kept a step
        self._trial_losses: dict[int, float] = {}  # by probe budget: what its last trials lost (design 11)
        self._last_plain = 0
        self._last_refresh = 0  # the step of the last cost refresh (design 21)
        self._last_ran: dict[int, int] = {}  # budget -> steps observed when its last step was (design 21)
        self._drafted_before = True  # the previous sequence ran a drafted step (this one's: _own_outcomes)
        self._last_trial_end = 0  # the step the last trial ended at (design 12)
        self._prompt_pairs: deque[tuple[float, float]] = deque(maxlen=PRIOR_PAIRS)  # design 29, carried over
        self._agreement: float | None = None  # this sequence's prompt agreement, once the loop measured it
        self._prior: dict | None = None  # what design 29 predicted for this sequence (summary)
        self._own_drafted = [0, 0.0]  # this sequence's drafted steps: committed tokens, seconds
        self._own_catch_up = 0.0  # ... of those seconds, the drafter's catch-up (design 46)
        self._early_plain: float | None = None  # a kept early check's plain seconds, judged again later (design 51)
        self._plain_checks = Counter()  # design 46: checks by outcome ("kept", "plain")
        self._sequences = 0  # sequences before this one (for_next_sequence)
        self._sample_every = PRIOR_SAMPLE_EVERY  # sequences between two prompt samples (designs 32, 35)
        self._sample_base = 0  # the sequence number of the last prompt sample: one is due every _sample_every after
        self._reset_schedule()
        self._rates: dict[int, float] = {}
        self._histogram: Counter = Counter()
        self._reasons: Counter = Counter()  # planned steps by reason (REASONS)
        self._probes = Counter()
        self._growth_checks = 0
        self._early_stops = 0

    def for_next_sequence(self) -> "BudgetController":
        """A copy of this controller to run the next generation with (this one is left unchanged).

        What was learned carries over: the cost curves, the acceptance samples (their ages go on
        counting, so they fade with ``half_life`` as the new sequence brings its own), the calibration,
        the current choice and the probe schedule. Improvement over starting each call afresh: requests
        are short (a QA answer is 5-20 verify steps), and a fresh controller spends its first steps
        trusting an initial budget and probing twice that, which on such requests is a fifth or more of
        all steps (docs/BENCHMARKS.md section 5). What belongs to one sequence is reset: the planned
        budget and the drafter's catch-up flag (a new sequence's drafter starts with its prompt to
        forward). The carried acceptance samples are scaled so that none weighs more than
        ``carried_weight`` steps in all (design 7); the finished sequence's length joins the lengths that
        estimate a request's tokens left (design 6). Tried and left out: resetting the probe schedule per
        request (short requests on hostile costs then probe in every request: 0.91 of plain against 0.95
        carried, in tests/test_control.py's world), and ageing the carried samples by a fixed gap of
        16-32 steps (0.87-0.88 of the best fixed N on a synthetic code -> chat switch against 0.89):
        a gap halves 32 samples to 16 steps' worth, still more than a short request's own steps."""
        follower = copy.deepcopy(self)
        speed = self._drafted_speed()
        if speed is not None:  # design 29: what a prompt agreeing this much drafted at, on this machine
            follower._prompt_pairs.append((self._agreement, speed))
        if self._agreement is not None:  # design 35: samples are counted from this one, the interval doubled on a clear win
            follower._sample_base = self._sequences
            won = speed is not None and speed >= NEW_COMMAND_MARGIN
            follower._sample_every = (min(2 * self._sample_every, PRIOR_SAMPLE_MAX) if won
                                      else self._sample_every if speed is None else PRIOR_SAMPLE_EVERY)
        follower._agreement, follower._prior, follower._own_drafted = None, None, [0, 0.0]
        follower._own_catch_up, follower._early_plain = 0.0, None
        follower._sequences += 1
        follower._planned = None
        follower._previous_plain = True  # the new sequence's drafter starts with its prompt to forward
        if follower._sequence_tokens > 0:  # a sequence cut by its token limit would have gone on: length unknown
            follower._lengths.append(math.inf if follower._cut_by_limit else follower._sequence_tokens)
        follower._sequence_tokens = 0
        follower._sequence_confidences = 0
        follower._sequence_start = follower._step
        follower._drafted_before = bool(self._own_outcomes)
        follower._own_outcomes = []
        follower._released_at = None
        follower._cap_carried_weight(follower.settings.carried_weight)
        follower._catch_up_skips = 0
        if follower._trial_left > 0:  # a trial cut by the end of its sequence is judged on the steps it ran:
            follower._trial_left = 0  # its next step would be the new sequence's first, which pays the
            follower._finish_trial()  # drafter's catch-up over a new prompt (design 14)
        follower._histogram = Counter()
        follower._reasons = Counter()
        follower._probes = Counter()
        follower._plain_checks = Counter()
        follower._growth_checks = follower._early_stops = 0
        return follower

    def for_new_command(self) -> "BudgetController":
        """A copy of this controller for a new command's generations (design 27; this one is left unchanged):
        the same, unless plain decoding is allowed and the carried best drafted rate beats plain decoding's by
        less than :data:`NEW_COMMAND_MARGIN`; then the acceptance samples and the last text's confidences are
        dropped, the choice is plain decoding and the probe schedule starts over, while the measured costs and
        what predicts acceptance from a text's confidences stay. Call :meth:`for_next_sequence` on the result as
        for any carried controller."""
        follower = copy.deepcopy(self)
        rates = self.rates()
        plain = rates.get(1)
        drafted = max((rate for budget, rate in rates.items() if budget > 1), default=0.0)
        if not self.settings.allow_plain or plain is None or drafted >= NEW_COMMAND_MARGIN * plain:
            return follower
        follower._samples = [deque(maxlen=self.settings.window) for _ in self.candidates]
        follower.predictability.recent.clear()  # the last command's text: design 12 predicts from the new one's
        follower._choice = 1
        follower._rates = {1: plain}
        follower._reset_schedule()
        follower._version += 1
        return follower

    def _reset_schedule(self) -> None:
        """The probe schedule as at the start: no trial or lean running, the first trial ``min_probe_interval``
        steps from now, from the first probe level (``__init__``; design 27's new command)."""
        self._trial_budget: int | None = None
        self._trial_left = 0
        self._trial_reference: float | None = None  # the choice's rate when the running trial started
        self._lean_reference: float | None = None  # the choice's rate when leaning to an untrusted rung (design 17)
        self._trial_loss = 0.0  # seconds the running trial lost so far against that rate, its catch-up left out
        self._probe_level = 0  # trials since the last win, modulo probe_levels
        self._interval = self.settings.min_probe_interval
        self._next_trial = self._step + self.settings.min_probe_interval

    @property
    def choice(self) -> int:
        """The budget currently preferred (what runs outside trials, lean steps one rung above it (design 17),
        plain-step refreshes and catch-up skips)."""
        return self._choice

    # ------------------------------------------------------------------ the loop's three calls
    def next_budget(self, catch_up_tokens: int = 0, tokens_left: int | None = None,
                    context_tokens: int | None = None) -> int:
        """The budget N of the coming step (asking twice before the step is observed gives the same N).

        ``catch_up_tokens``: committed tokens the drafter must forward before it drafts, because steps
        ran without drafting (:attr:`talon_sd.drafters.Drafter.catch_up_tokens`: the prompt, then plain
        steps' tokens); ``tokens_left``: at most this many tokens are still to come (None: unknown).
        With both, a drafted step pays the catch-up only when it is worth it (design 6).
        ``context_tokens``: the tokens in the target's cache the step's tree will attend to; verify costs are
        read at that context (design 33; None: as measured)."""
        if self._planned is not None:
            return self._planned
        if not is_int(catch_up_tokens) or catch_up_tokens < 0:
            raise bad_argument("catch_up_tokens", catch_up_tokens, "an integer >= 0")
        if tokens_left is not None and (not is_int(tokens_left) or tokens_left < 0):
            raise bad_argument("tokens_left", tokens_left, "an integer >= 0 or None")
        if context_tokens is not None and (not is_int(context_tokens) or context_tokens < 0):
            raise bad_argument("context_tokens", context_tokens, "an integer >= 0 or None")
        self._read_verify_at(context_tokens)  # design 33: the costs of this context
        self._catch_up_tokens, self._tokens_left = catch_up_tokens, tokens_left
        catch_up, expected = self._catch_up_seconds(catch_up_tokens), self._expected_tokens_left(tokens_left)
        if self._trial_left > 0:
            budget, self._reason = self._trial_budget, "trial"
        else:
            self._choose()
            budget, self._reason = self._choice, "choice"
            check = self._plain_check_due()
            plain_due = check or self._plain_due()
            # design 24: a sequence about to end cannot use what exploring would learn
            short = expected is not None and expected < self.settings.explore_min_tokens
            refresh = None if plain_due or short else self._refresh_due()
            if refresh is not None and not self._worth_catching_up(refresh, catch_up, expected):
                refresh = None
            lean = None if plain_due or short or refresh is not None else self._lean()
            # a lean needs the choice and the rung to pass the catch-up test (an untrusted rung passes it: no rate);
            # otherwise the choice's own test decides below (designs 6, 14)
            if lean is not None and not all(self._worth_catching_up(k, catch_up, expected) for k in (budget, lean)):
                lean = None
            if plain_due:
                budget, self._reason = 1, "plain-check" if check else "plain-measure"
            elif refresh is not None:
                budget, self._reason = refresh, "cost-refresh"
                self._last_refresh = self._step
            elif lean is not None:
                budget, self._reason = lean, "lean"
                # an untrusted rung is explored: its losses count against the exploration share (design 8)
                self._lean_reference = None if lean in self._rates else self._rates[self._choice]
                self._next_trial = max(self._next_trial, self._step + self._interval)  # the lean is the probe
            else:
                if (self._step >= self._next_trial or self._predicted_win()) and budget < self.candidates[-1]:
                    blocked = "trial-short" if short else self._trial_blocked(catch_up, expected)
                    if blocked is None:
                        budget = self._start_trial(catch_up, expected)  # sets the reason
                    else:
                        self._reason = blocked
                if self._trial_left == 0 and budget > 1 and not self._worth_catching_up(budget, catch_up, expected):
                    budget, self._reason = 1, "catch-up-skip"
                    self._catch_up_skips += 1
        self._planned = budget
        self._histogram[budget] += 1
        self._reasons[self._reason] += 1
        return budget

    def _read_verify_at(self, context_tokens: int | None) -> None:
        """Read the verify curve at ``context_tokens`` (design 33; None: leave it where it is read)."""
        if self.verify_cost.read_at(context_tokens):
            self.verify_cost.refit()
            self._rebuild_tables()
            self._version += 1

    @property
    def released_after(self) -> int | None:
        """This sequence's own drafted steps after which its carried samples were released (designs 8 and 47), or
        None."""
        return self._released_at

    @property
    def reason(self) -> str:
        """Why the planned (or last planned) step got its budget: a key of :data:`REASONS`."""
        return self._reason

    @property
    def prompt_prior(self) -> dict | None:
        """What designs 29 and 30 made of this sequence's prompt (agreement, neighbours, predicted speed, far below the
        last pair's agreement on steep verification, started plain), or None before :meth:`observe_prompt`."""
        return self._prior

    def prompt_agreement_due(self, catch_up_tokens: int = 0, tokens_left: int | None = None,
                             context_tokens: int | None = None) -> bool:
        """Whether the loop should measure this sequence's prompt agreement before its first step (design 29): the
        sequence has run no step, the prior is on (``prompt_prior_width`` > 0, plain decoding allowed), and the
        first step would draft (:meth:`next_budget` with the same arguments, asked of a copy: this controller is
        left as it was). A plain first step has nothing to be spared, and the draft's prompt forward, which the
        measurement runs at once, is then one the first step would have run anyway. ``context_tokens``: the
        target's cache at the first step (the prompt but its last token), where its verify costs are read (design
        34; None: where the last step read them)."""
        if (self._sequence_tokens or self._agreement is not None or not self.settings.allow_plain
                or self.settings.prompt_prior_width <= 0 or self._planned is not None):
            return False
        ahead = copy.deepcopy(self)
        ahead._read_verify_at(context_tokens)
        if not ahead._prior_can_start_plain() and (self._sequences - self._sample_base) % self._sample_every:
            return False  # no agreement could change this start (design 32): only a sample of the prompts pays (35)
        return ahead.next_budget(catch_up_tokens, tokens_left, context_tokens) > 1

    def _prior_can_start_plain(self) -> bool:
        """Whether some agreement could make :meth:`observe_prompt` start this sequence plain (design 32): the earlier
        measured prompts near some agreement drafted, on average, slower than plain decoding (design 29), or one taught
        the prior and verifying the first step's tree costs at least :data:`FAR_VERIFY_RATIO` plain verifies (design
        30)."""
        if self._a_near_set_loses():
            return True
        if self.settings.prompt_gap <= 0 or not self.verify_cost.has(1):
            return False
        tree_size = max(self._choice, self.settings.plain_probe_budget)
        return self._verify(tree_size) >= FAR_VERIFY_RATIO * self._verify(1)

    def observe_prompt(self, agreement: float, context_tokens: int | None = None) -> None:
        """The prompt's draft/target agreement in [0, 1] (designs 29, 30; the loop's measure since design 44: the
        draft's mean probability of the target's argmax over the prompt positions it compares). When the
        earlier sequences whose agreement lies within ``prompt_prior_width`` of it (at least
        :data:`PRIOR_NEIGHBOURS`) drafted, on average, slower than plain decoding on this machine, the carried
        acceptance samples are dropped and the choice is plain decoding: the sequence then drafts only once its own
        text shows it pays (trials from plain, design 12). The same when too few earlier prompts are near and none of
        them drafted as fast as plain, the agreement lies more than ``prompt_gap`` below the last pair's (the
        sequence whose samples are carried) and verifying the first step's tree costs at least :data:`FAR_VERIFY_RATIO`
        plain verifies (design 30), read at ``context_tokens`` (the target's cache at the first step, design 34; None:
        where the last step read them). Call before the sequence's first step."""
        if not is_number(agreement) or not 0 <= agreement <= 1:
            raise bad_argument("agreement", agreement, "a number in [0, 1]")
        if context_tokens is not None and (not is_int(context_tokens) or context_tokens < 0):
            raise bad_argument("context_tokens", context_tokens, "an integer >= 0 or None")
        if self._sequence_tokens:
            raise TalonError("observe_prompt: the sequence has already run steps (call it before the first)")
        self._read_verify_at(context_tokens)
        self._agreement = float(agreement)
        width = self.settings.prompt_prior_width
        near = [speed for other, speed in self._prompt_pairs if abs(other - agreement) <= width]
        predicted = sum(near) / len(near) if len(near) >= PRIOR_NEIGHBOURS else None
        gap = self.settings.prompt_gap
        last_agreement = self._prompt_pairs[-1][0] if self._prompt_pairs else None
        plain_verify = self._verify(1) if self.verify_cost.has(1) else 0.0
        tree_size = max(self._choice, self.settings.plain_probe_budget)  # the first step's tree, or about a probe's
        far = (predicted is None and all(speed < 1.0 for speed in near) and last_agreement is not None and gap > 0
               and last_agreement - agreement > gap
               and plain_verify > 0 and self._verify(tree_size) >= FAR_VERIFY_RATIO * plain_verify)
        start_plain = (far or (predicted is not None and predicted < 1.0)) and self.settings.allow_plain and width > 0
        self._prior = {"agreement": round(self._agreement, 4), "neighbours": len(near),
                       "predicted_speed": None if predicted is None else round(predicted, 4),
                       "far_below": far and start_plain, "started_plain": start_plain}
        if start_plain:
            self._drop_to_plain()  # all samples carried: the sequence has none of its own yet
            self.predictability.recent.clear()  # the last text's confidences: design 12 predicts from this one's
            if far:
                self._lengths.clear()  # design 30: how long the other text's answers ran says nothing of this one's
            self._next_trial = max(self._next_trial, self._step + self._interval)  # no scheduled probe at once
            self._planned = None

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """The drafter forwarded ``tokens`` committed tokens outside any step, in ``seconds``: a sample of the catch-up
        curve (design 6), as a step's first forward gives one. The loop reports the draft's prompt forward that
        measuring a prompt's agreement runs (design 29), which leaves the first drafted step nothing to catch up;
        without it a run whose every prompt is measured never learns what a catch-up costs, and a catch-up never
        measured costs nothing (design 38)."""
        check_int("tokens", tokens, 0, "an integer >= 0")
        check_number("seconds", seconds, "a finite number >= 0", lambda x: x >= 0)
        if tokens == 0:
            return
        self._add_catch_up(tokens, float(seconds))
        self.catch_up_cost.refit()
        self._planned = None

    def _add_catch_up(self, tokens: int, seconds: float) -> None:
        """One catch-up sample: ``seconds`` for ``tokens`` > 0, scaled to their bucket (refit by the caller)."""
        bucket = _bucket(tokens)
        self.catch_up_cost.add(bucket, seconds * bucket / tokens)

    def _a_near_set_loses(self) -> bool:
        """Whether some agreement in [0, 1] has at least :data:`PRIOR_NEIGHBOURS` earlier prompts within
        ``prompt_prior_width`` that drafted, on average, slower than plain decoding (design 29 would start it plain;
        design 32). The near set changes only where an agreement crosses a pair's edge (its agreement +- the width),
        so those edges and the midpoints between them near a losing pair are the agreements to try."""
        width, pairs = self.settings.prompt_prior_width, self._prompt_pairs
        losing = [other for other, speed in pairs if speed < 1]
        if not losing:
            return False
        edges = sorted({edge for other, _ in pairs for edge in (other - width, other + width)})
        tries = set(edges) | {(left + right) / 2 for left, right in zip(edges, edges[1:])}
        for agreement in tries:
            if not 0 <= agreement <= 1 or all(abs(other - agreement) > width for other in losing):
                continue
            near = [speed for other, speed in pairs if abs(other - agreement) <= width]
            if len(near) >= PRIOR_NEIGHBOURS and sum(near) < len(near):
                return True
        return False

    def _drafted_speed(self) -> float | None:
        """This sequence's drafted steps' tokens per second over plain decoding's modelled rate, when its prompt
        agreement is known and they committed at least :data:`PRIOR_MIN_TOKENS` (design 29); else None."""
        tokens, seconds = self._own_drafted
        plain = self._plain_rate()
        if self._agreement is None or tokens < PRIOR_MIN_TOKENS or seconds <= 0 or not plain:
            return None
        return tokens / seconds / plain

    def keep_growing(self, tree_log_p: Sequence[float], frontier: Sequence[int], widths_so_far: Sequence[int],
                     budget: int) -> bool:
        """Whether to run the next draft forward (design 4). ``tree_log_p`` [size] cumulative draft log p of
        the partial tree (index order, root first), ``frontier`` [F'] the indices the forward would
        expand, ``widths_so_far`` [F] the widths of this step's forwards so far, ``budget`` the step's N."""
        self._growth_checks += 1
        if not self.settings.early_stop or self.calibration.steps == 0 or not self.draft_cost.xs:
            return True
        if not frontier:
            return False
        size = len(tree_log_p)
        calibration = self.calibration
        accept, child, bin_of = calibration.accept, calibration.child, calibration.bin
        nodes = tree_log_p[1:]
        if size > budget:  # a reranking builder (EAGLE) keeps the best budget - 1
            nodes = sorted(nodes, reverse=True)[: max(budget - 1, 0)]
        expected_accepted = sum(accept[bin_of(p)] for p in nodes)
        expected_gain = sum(child[bin_of(tree_log_p[v])] for v in frontier)
        if self._branch_width > 0:
            branching = self._branch_added / self._branch_width
        else:
            branching = (size - 1) / max(1, sum(widths_so_far))
        next_width = max(1, round(branching * len(frontier)))
        forwards = len(widths_so_far)
        draft_now = sum(self._draft(width) for width in widths_so_far)
        time_now = self._overhead(forwards) + draft_now + self._verify(min(size, budget))
        time_next = (self._overhead(forwards + 1) + draft_now + self._draft(len(frontier))
                     + self._verify(min(budget, size + next_width)))
        if time_next <= 0:
            return True
        grow = (expected_accepted + expected_gain + 1.0) * time_now > (expected_accepted + 1.0) * time_next
        self._early_stops += not grow
        return grow

    def observe(self, record: StepRecord) -> None:
        """Learn from one verified step: its costs, its counterfactual outcomes, the calibration."""
        if not isinstance(record, StepRecord):
            raise TypeError(f"observe() takes a StepRecord, got {type(record).__name__}")
        forwards = len(record.forward_widths)
        # 1. costs
        self.verify_cost.add(record.size, record.verify_seconds, record.context_tokens)
        self.overhead_cost.add(forwards, record.other_seconds)
        apart = record.catch_up_seconds  # design 23: a catch-up timed apart leaves the first forward clean
        catching_up = (self._previous_plain or self._catch_up_tokens > 0) and apart is None
        for j, (width, seconds) in enumerate(zip(record.forward_widths, record.draft_seconds)):
            if j > 0 or not catching_up:  # the first forward after a plain step also catches up
                self.draft_cost.add(width, seconds)
        if forwards > 0 and self._catch_up_tokens > 0:  # what the catch-up cost on top of that forward
            if apart is None:
                self.draft_cost.refit()
                extra = max(record.draft_seconds[0] - self.draft_cost(record.forward_widths[0]), 0.0)
            else:
                extra = apart
            self._add_catch_up(self._catch_up_tokens, extra)
            self._own_catch_up += extra
        for curve in (self.verify_cost, self.draft_cost, self.overhead_cost, self.catch_up_cost):
            curve.refit()
        self._table_top = max(self._table_top, record.size, forwards, max(record.forward_widths, default=0))
        self._rebuild_tables()
        # 2. what every candidate budget would have done (plain steps say nothing about acceptance)
        if forwards > 0 or record.complete:
            outcomes = []
            for k in self.candidates:
                if not informs(record, k):
                    break
                outcome = prefix_outcome(record, k)
                outcomes.append((outcome.accepted + 1, outcome.tree_size, outcome.forwards))
            sample = _Sample(self._step, record.forward_widths, outcomes)
            for i in range(len(outcomes)):
                if self.candidates[i] > 1:
                    self._samples[i].append(sample)
            if forwards > 0:
                self._own_outcomes.append(outcomes)
                self._release_if_changed()
        self.predictability.observe(record)
        self._sequence_confidences += len(record.confidence)
        if forwards > 0:
            self.calibration.observe(record)
            decay = self.settings.calibration_decay
            self._branch_added = decay * self._branch_added + record.size - record.prefix_after_forward[0]
            self._branch_width = decay * self._branch_width + sum(record.forward_widths[1:])
        # 3. bookkeeping
        seconds = sum(record.draft_seconds) + (apart or 0.0) + record.verify_seconds + record.other_seconds
        if forwards > 0:
            self._own_drafted[0] += len(record.accepted) + 1
            self._own_drafted[1] += seconds
            if self._early_plain is not None and len(self._own_outcomes) >= self.settings.plain_check_steps:
                plain, self._early_plain = self._early_plain, None  # design 51: design 46's judgement, on that step
                if self._choice != 1:
                    self._judge_plain_check(plain)
        keep = self._exploration_keep
        self._observed_seconds = keep * self._observed_seconds + seconds
        self._lost_seconds *= keep
        if self._trial_left > 0 and self._trial_reference:  # what the trial step cost against the choice
            lost = seconds - (len(record.accepted) + 1) / self._trial_reference
            self._lost_seconds += lost
            self._trial_loss += lost - self._catch_up_seconds(self._catch_up_tokens)
        elif self._reason == "lean" and self._lean_reference:  # an untrusted rung's step, likewise (design 17)
            self._lost_seconds += seconds - (len(record.accepted) + 1) / self._lean_reference
        if self._reason == "plain-check" and forwards == 0:
            self._judge_plain_check(seconds)
        self._previous_plain = forwards == 0
        self._catch_up_tokens = 0
        self._sequence_tokens += len(record.accepted) + 1
        self._cut_by_limit = self._tokens_left is not None and len(record.accepted) + 1 >= self._tokens_left
        if forwards == 0:
            self._last_plain = self._step
        self._step += 1
        self._last_ran[record.budget] = self._step
        self._version += 1
        self._planned = None
        if self._trial_left > 0:
            self._trial_left -= 1
            if self._trial_left == 0:
                self._finish_trial()

    # ------------------------------------------------------------------ reports
    def summary(self) -> dict:
        """Budgets chosen (mean, histogram, plain fraction), the current choice and rate estimates
        (tokens/s), probe bookkeeping, cost tables (fitted seconds) and the calibration table."""
        chosen = sum(self._histogram.values())
        return {
            "steps": self._step,
            "budget": self._choice,
            "mean_budget": round(sum(k * n for k, n in self._histogram.items()) / chosen, 3) if chosen else 0.0,
            "budget_histogram": dict(sorted(self._histogram.items())),
            "plain_fraction": round(self._histogram.get(1, 0) / chosen, 4) if chosen else 0.0,
            "reasons": dict(sorted(self._reasons.items())),
            "rates": {k: round(rate, 6) for k, rate in sorted(self._rates.items())},
            "probe_interval": self._interval,
            "probes": dict(self._probes),
            "costs": {
                "verify_seconds": self.verify_cost.points(),
                "draft_seconds": self.draft_cost.points(),
                "overhead_seconds": self.overhead_cost.points(),
            },
            "catch_up_seconds": self.catch_up_cost.points(),
            "catch_up_skips": self._catch_up_skips,
            "carried_released_after": self._released_at,
            "plain_checks": dict(self._plain_checks),
            "prompt_prior": self.prompt_prior,
            "exploration_lost_seconds": round(self._lost_seconds, 6),
            "growth_checks": self._growth_checks,
            "early_stops": self._early_stops,
            "calibration": self.calibration.rows(),
        }

    def cost_prior(self) -> CostPrior | None:
        """The fitted cost curves as a :class:`CostPrior` for the next generation (None before any step)."""
        if not self.verify_cost.samples:
            return None
        return CostPrior(self.verify_cost.points(), self.draft_cost.points(), self.overhead_cost.points())

    def estimated_seconds(self, outcome: PrefixOutcome) -> float:
        """The seconds the cost model gives a step with this outcome: overhead(forwards) + the draft
        forwards' costs + verify(tree size)."""
        return (self._overhead(outcome.forwards) + sum(self._draft(w) for w in outcome.draft_widths)
                + self._verify(outcome.tree_size))

    def rates(self) -> dict[int, float]:
        """Current trusted rate estimates (committed tokens per second) by candidate budget."""
        return self._estimate_rates()

    # ------------------------------------------------------------------ internals: costs
    def _rebuild_tables(self) -> None:
        """Dense copies of the three curves over every size a record has shown (lookups by index)."""
        top = self._table_top
        self._verify_table = self.verify_cost.table(top)  # [top + 1] by tree size
        self._draft_table = self.draft_cost.table(top)  # [top + 1] by forward width
        self._overhead_table = self.overhead_cost.table(top)  # [top + 1] by draft forwards per step

    def _verify(self, size: int) -> float:
        return self._verify_table[size] if size <= self._table_top else self.verify_cost(size)

    def _draft(self, width: int) -> float:
        return self._draft_table[width] if width <= self._table_top else self.draft_cost(width)

    def _overhead(self, forwards: int) -> float:
        return self._overhead_table[forwards] if forwards <= self._table_top else self.overhead_cost(forwards)

    def _plain_rate(self) -> float | None:
        if not self.verify_cost.has(1):
            return None
        seconds = self._overhead(0) + self._verify(1)
        return 1.0 / seconds if seconds > 0 else math.inf

    def _optimistic_rate(self, budget: int) -> float:
        """An upper bound on rate(budget). Each draft forward adds at most one layer, so a step with F
        forwards accepts at most F drafts: max over F < budget of (F + 1) / (overhead(F) + F draft(1)
        + verify(budget)) (draft(1) is the cheapest forward)."""
        if budget == 1:
            rate = self._plain_rate()
            return math.inf if rate is None else rate
        return self._best_chain_rate(budget, range(1, budget + 1))

    def _best_chain_rate(self, budget: int, tokens: Sequence[float]) -> float:
        """max over F < budget of tokens[F] / (overhead(F) + F draft(1) + verify(budget)): the best rate of a chain of
        F one-node forwards that commits tokens[F] (inf where the costs read 0)."""
        verify, draft = self._verify(budget), self._draft(1)
        best = 0.0
        for forwards in range(1, budget):
            seconds = self._overhead(forwards) + forwards * draft + verify
            if seconds <= 0:
                return math.inf
            best = max(best, tokens[forwards] / seconds)
        return best

    def _predicted_rate(self, budget: int, last: int | None = None) -> float | None:
        """rate(budget) on text like the last ``confidence_window`` committed tokens (design 12), None without
        confidences. Over the drafted steps that inform ``budget``, their weighted mean of chain_tokens(F) over
        their weighted mean seconds (F: the forwards each would have run), blended with the bound max over F <
        budget of chain_tokens(F) / (overhead(F) + F draft(1) + verify(budget)) as a prior of
        :data:`SHAPE_PRIOR_STEPS` steps (design 23): a TALON tree's shape follows the text (deep and narrow where
        the target is confident), so one old step drafted on chat, two forwards where code runs eight, is little
        evidence; alone it kept a float32 run on plain decoding through every code prompt. ``last``: replay the last
        that many confidences instead (up to ``bet_window``, design 28)."""
        tokens = self.predictability.chain_tokens(budget - 1, last)
        if not tokens:
            return None
        bound = self._best_chain_rate(budget, self.predictability.chain_tokens(budget - 1, last, top=True))
        if math.isinf(bound):
            return bound
        index, verify_table, overhead = self._index_of[budget], self._verify_table, self._overhead_table
        weight = expected = seconds = 0.0
        for sample in self._samples[index]:
            if sample.stamp != self._version:
                self._prepare(sample)
            _, size, forwards = sample.outcomes[index]
            weight += sample.weight
            expected += sample.weight * tokens[min(forwards, budget - 1)]
            seconds += sample.weight * (overhead[forwards] + sample.cumulative_draft[forwards] + verify_table[size])
        if weight <= 0 or seconds <= 0:
            return bound
        return (weight * expected / seconds + SHAPE_PRIOR_STEPS * bound) / (weight + SHAPE_PRIOR_STEPS)

    def _probe_rungs(self) -> list[int]:
        """From plain decoding, the probes of the levels up to the current one (design 3a)."""
        above, base = self.candidates[1:], self.settings.plain_probe_budget
        return [next((k for k in above if k >= base * 2 ** level), above[-1]) for level in range(self._probe_level + 1)]

    def _predicted_win(self) -> bool:
        """From plain decoding, with no trial due: True when the recent text predicts a probe rung wins by
        ``PREDICTED_WIN`` over plain decoding (design 12: a change of text is tried when it shows, not when the
        schedule says), at most once every ``min_probe_interval`` steps after the last trial, and only from a full
        ``confidence_window`` of confidences."""
        if (self._choice != 1 or not self.settings.predict_trials or len(self.candidates) < 2
                or self._step < self._last_trial_end + self.settings.min_probe_interval
                or len(self.predictability.recent) < self.settings.confidence_window):
            return False  # (design 27: a new command's first tokens are too few to predict from)
        plain = self._rates.get(1)
        if plain is None:
            return False
        return any((self._predicted_rate(k) or 0.0) > PREDICTED_WIN * plain for k in self._probe_rungs())

    def _unpredictable(self, budget: int, reference: float | None) -> bool:
        """True when even the predicted rate of ``budget`` on the recent text is below (1 - margin) x
        ``reference`` (False without a reference or confidences)."""
        predicted = self._predicted_rate(budget)
        if reference is None or predicted is None:
            return False
        return predicted < (1.0 - self.settings.dominance_margin) * reference

    def _dominated(self, budget: int, reference: float | None) -> bool:
        """True when no acceptance could make ``budget`` reach (1 - margin) x ``reference``."""
        if reference is None:
            return False
        return self._optimistic_rate(budget) < (1.0 - self.settings.dominance_margin) * reference

    # ------------------------------------------------------------------ internals: catch-up and carried samples
    def _catch_up_seconds(self, tokens: int) -> float:
        """Extra seconds the drafter's first forward takes to catch up on ``tokens`` (0 when none, or
        before any catch-up was measured: then drafting is judged as before design 6)."""
        if tokens <= 0 or not self.catch_up_cost.samples:
            return 0.0
        bucket, bottom, top = _bucket(tokens), min(self.catch_up_cost.samples), max(self.catch_up_cost.samples)
        if bucket < bottom:  # below the smallest bucket measured, in proportion to tokens (design 23): a flat curve
            seconds = self.catch_up_cost(bottom) * tokens / bottom  # charged one plain step's token as a whole prompt
        else:
            seconds = self.catch_up_cost(bucket)
            if bucket > top:  # past the largest bucket measured, at least linear in tokens (a flat curve would
                seconds = max(seconds, self.catch_up_cost(top) * bucket / top)  # charge 700 tokens as 128, design 14)
            seconds *= tokens / bucket
        # design 26: at most what the width curve says ``tokens`` more rows of a draft forward cost. The catch-up
        # curve is measured only when a catch-up is paid, and its first sample is the draft's first forward ever
        # (cold: 2-4x); the width curve is measured every drafted step
        if len(self.draft_cost.samples) >= 2 and tokens <= 4 * max(self.draft_cost.samples):  # not far past it
            rows = self.draft_cost(tokens + 1) - self.draft_cost(1)
            if rows > 0:
                seconds = min(seconds, rows)
        return seconds

    def _expected_tokens_left(self, tokens_left: int | None) -> float | None:
        """Tokens the sequence is expected to still commit: ``tokens_left`` capped by the median of what the
        last finished sequences that outlasted this one's tokens so far went on to commit (design 9: a QA
        answer ends long before max_new_tokens, and 15 tokens into a 20-token answer 5 are left; a sequence
        its token limit cut counts as endless, so a short warm-up run does not pass for a short answer; a
        sequence already longer than all of them is judged by ``tokens_left`` alone); None when unknown."""
        committed = self._sequence_tokens
        rest = [length - committed for length in self._lengths if length > committed]
        typical = median(rest) if rest else None
        if tokens_left is None:
            return typical
        return float(tokens_left) if typical is None else min(float(tokens_left), typical)

    def _worth_catching_up(self, budget: int, catch_up: float, expected: float | None) -> bool:
        """Whether drafting at ``budget`` for the expected rest of the sequence saves more than the catch-up
        costs: expected x (1 / rate(1) - 1 / rate(budget)) > catch-up seconds. True without the numbers."""
        plain, drafted = self._plain_rate(), self._rates.get(budget)
        if catch_up <= 0 or expected is None or plain is None or drafted is None or not self.settings.allow_plain:
            return True
        large = catch_up > self.settings.trial_cost_share * expected / plain  # design 25: more than a trial may pay
        if (self.settings.predict_trials and not self._own_outcomes and self.predictability.recent
                and (large or CATCH_UP_MARGIN * catch_up > _seconds_saved(expected, plain, drafted))):
            # design 14: a catch-up that the last sequences' rate would not pay back twice over waits for the
            # target's confidence on this sequence's own text to predict the rate; design 25: so does one larger
            # than a trial's share of the rest, however well the last sequences' text drafted
            if self._sequence_confidences < OWN_CONFIDENCES:
                return False
            # design 28: the rest of the sequence is judged on all of its own text so far (up to bet_window tokens)
            own = min(self._sequence_confidences, self.settings.bet_window)
            drafted = min(drafted, self._predicted_rate(budget, own) or drafted)
            if large:  # design 28: a bet larger than a trial's share is paid only with a margin
                return self.settings.bet_margin * catch_up < _seconds_saved(expected, plain, drafted)
        return catch_up < _seconds_saved(expected, plain, drafted)

    def _trial_affordable(self, catch_up: float, expected: float | None, probe: int | None = None) -> bool:
        """A trial explores at most ``trial_cost_share`` of the expected rest's plain seconds on catch-up
        (a 700-token prompt is not forwarded through the draft LM to try a probe on a 64-token answer);
        with ``probe``, on catch-up plus what the last trials of that probe lost (design 11)."""
        plain = self._plain_rate()
        cost = catch_up + (max(self._trial_losses.get(probe, 0.0), 0.0) if probe is not None else 0.0)
        if cost <= 0 or expected is None or plain is None:
            return True
        if cost <= self.settings.trial_cost_share * expected / plain:
            return True
        return self._repaid_by_prediction(cost, expected, plain, probe)  # design 15: more than the share

    def _repaid_by_prediction(self, cost: float, expected: float, plain: float, probe: int | None) -> bool:
        """Whether the sequence's own text predicts that drafting the expected rest at ``probe`` (None: the best
        probe rung) pays ``cost`` seconds back :data:`CATCH_UP_MARGIN` times over (designs 15, 54)."""
        return CATCH_UP_MARGIN * cost <= self._predicted_saving(expected, plain, probe)

    def _predicted_saving(self, expected: float, plain: float, probe: int | None) -> float:
        """From plain decoding, the seconds that drafting the expected rest at ``probe`` (None: the best probe
        rung) saves over plain decoding at the rate the sequence's own target confidences predict (design
        12); 0 before ``confidence_window`` of them or when no rung is predicted to beat plain decoding."""
        window = self.settings.confidence_window
        if self._choice != 1 or not self.settings.predict_trials or self._sequence_confidences < window:
            return 0.0
        rungs = self._probe_rungs() if probe is None else [probe]
        best = max((self._predicted_rate(k, window) or 0.0 for k in rungs), default=0.0)
        return _seconds_saved(expected, plain, best) if best > plain else 0.0

    def _cap_carried_weight(self, limit: float) -> None:
        """Scale every carried acceptance sample (one from before this sequence) by one factor so that no
        candidate's carried weight exceeds ``limit`` steps: rates (ratios of sums) are unchanged until the
        new sequence's own steps arrive, which then outweigh the carried ones after a few steps (design 7)."""
        start = self._sequence_start
        heaviest = max((sum(self._age_weight(s) for s in samples if s.index < start)
                        for samples in self._samples), default=0.0)
        if heaviest <= limit:
            return
        factor = limit / heaviest
        for sample in {id(s): s for samples in self._samples for s in samples if s.index < start}.values():
            sample.scale *= factor
        self._version += 1

    def _release_if_changed(self) -> None:
        """Design 8 (change point): once ``release_steps`` of this sequence's drafted steps are in, compare
        their mean committed tokens with the carried samples' weighted mean at the largest budget all of
        them inform; if the two differ by more than ``release_ratio`` and by more than ``RELEASE_Z`` standard
        errors (the carried samples' standard deviation, floored at one token, over the square root of the
        own steps' count) the text has changed, and the carried samples are scaled down to one step's
        weight in all (they still say something of budgets this sequence has not tried). Design 47, one-sided:
        while every own step accepted nothing there (committed one token), it has changed too once q ** k <
        ``release_nothing_p``, with k the own steps and q the carried samples' weighted share of steps that accepted
        nothing there, (weight + 0.5) / (total + 1). A budget that informs fewer candidates (a trial of a smaller tree)
        narrows the budget read, for both tests alike."""
        settings = self.settings
        if self._released_at is not None or self._sequence_start == 0 or len(self._own_outcomes) < settings.release_steps:
            return
        index = min(len(outcomes) for outcomes in self._own_outcomes) - 1
        if index < 0 or self.candidates[index] < 2:
            return
        own = sum(outcomes[index][0] for outcomes in self._own_outcomes) / len(self._own_outcomes)
        start = self._sequence_start
        weight = tokens = squares = nothing = 0.0  # nothing: the weight of carried steps that accepted nothing
        for sample in self._samples[index]:
            if sample.index < start:
                w, committed = self._age_weight(sample), sample.outcomes[index][0]
                weight, tokens, squares = weight + w, tokens + w * committed, squares + w * committed * committed
                nothing += w if committed == 1 else 0.0
        if weight < 1.0:  # too little carried to disagree with
            return
        carried = tokens / weight
        standard_error = math.sqrt(max(squares / weight - carried * carried, 1.0) / len(self._own_outcomes))
        changed = (max(own / carried, carried / own) > settings.release_ratio
                   and abs(own - carried) > RELEASE_Z * standard_error)
        if not changed and own == 1.0 and carried > 1.0 and math.isfinite(settings.release_ratio):  # design 47
            share = (nothing + 0.5) / (weight + 1.0)  # the carried steps' share that accepted nothing
            changed = share ** len(self._own_outcomes) < settings.release_nothing_p
        if changed:
            self._released_at = len(self._own_outcomes)
            self._cap_carried_weight(1.0)

    def _exploration_affordable(self, catch_up: float = 0.0) -> bool:
        """Bounded regret (design 8): trials may lose at most ``exploration_share`` of the observed seconds
        against the rate of the choice they left (a trial that won gave its loss back), both weighted
        ``0.5 ** (age / exploration_half_life)`` and carried across sequences: the bound holds locally, over
        about the last ``exploration_half_life`` steps, not only over a long run. With ``catch_up`` (seconds a trial
        is known to cost before it starts, design 54), whether the bound still holds once it is paid. The observed
        seconds level off at about ``exploration_half_life / ln 2`` steps' worth (92 steps at 64), so the share
        admits at most about 4.6 steps' seconds at 5%."""
        return self._lost_seconds + catch_up <= self.settings.exploration_share * self._observed_seconds

    # ------------------------------------------------------------------ internals: rates and choice
    def _sums(self, samples: deque, index: int, other: int) -> tuple[float, float, float, float]:
        """Weighted (tokens, seconds) of candidates ``index`` and ``other`` (<= index) over ``samples``."""
        tokens = seconds = other_tokens = other_seconds = 0.0
        verify, overhead, version = self._verify_table, self._overhead_table, self._version
        for sample in samples:
            if sample.stamp != version:
                self._prepare(sample)
            weight, draft = sample.weight, sample.cumulative_draft
            committed, size, forwards = sample.outcomes[index]
            tokens += weight * committed
            seconds += weight * (overhead[forwards] + draft[forwards] + verify[size])
            committed, size, forwards = sample.outcomes[other]
            other_tokens += weight * committed
            other_seconds += weight * (overhead[forwards] + draft[forwards] + verify[size])
        return tokens, seconds, other_tokens, other_seconds

    def _age_weight(self, sample: _Sample) -> float:
        """A sample's weight now: its carried scale times ``0.5 ** (age / half_life)`` (design 2)."""
        return sample.scale * 0.5 ** ((self._step - sample.index) / self.settings.half_life)

    def _prepare(self, sample: _Sample) -> None:
        cumulative, draft = [0.0], self._draft_table
        for width in sample.widths:
            cumulative.append(cumulative[-1] + draft[width])
        sample.cumulative_draft = cumulative
        sample.weight = self._age_weight(sample)
        sample.stamp = self._version

    def _estimate_rates(self) -> dict[int, float]:
        """Trusted rates by candidate, chained from the smallest (design 2): the smallest trusted drafted
        budget takes its own rate; each larger one, the previous one's rate times how the two compared
        on the steps that inform the larger one (every such step informs the smaller one too)."""
        rates: dict[int, float] = {}
        plain = self._plain_rate()
        if plain is not None:
            rates[1] = plain
        previous: tuple[int, float] | None = None  # (index, rate) of the last trusted drafted budget
        for index, budget in enumerate(self.candidates):
            samples = self._samples[index]
            if budget == 1 or len(samples) < self.settings.min_steps:
                continue
            tokens, seconds, previous_tokens, previous_seconds = self._sums(
                samples, index, index if previous is None else previous[0])
            if tokens <= 0 or seconds <= 0:
                continue
            rate = tokens / seconds
            if previous is not None and previous_tokens > 0 and previous_seconds > 0:
                rate = previous[1] * rate * previous_seconds / previous_tokens
            rates[budget] = rate
            previous = (index, rate)
        return rates

    def _choose(self) -> None:
        """Update the current choice: the best trusted candidate among those the anchor admits (design 19); an
        untrusted choice (the initial budget) stays until even its optimistic rate loses clearly. From plain decoding,
        a drafted candidate must beat plain decoding's rate by more than ``leave_plain_margin`` (design 28)."""
        rates = self._rates = self._estimate_rates()
        if not rates:
            return
        eligible = {k: rate for k, rate in rates.items() if self._admitted(k)}
        best = max(eligible, key=lambda k: (eligible[k], -k))
        current, before = eligible.get(self._choice), self._choice
        if current is not None:
            # a tie keeps the current choice; design 28: leaving plain decoding needs a clear win
            to_beat = current * (1.0 + self.settings.leave_plain_margin) if self._choice == 1 else current
            if eligible[best] > to_beat:
                self._choice = best
        elif self._choice in rates or self._dominated(self._choice, eligible[best]):
            self._choice = best  # a trusted choice the anchor no longer admits, or a dominated untrusted one
        if 1 < self._choice < before and self.settings.reopen_on_fall:
            # design 45: the trials that lengthened the interval probed above the old choice, on the text before the fall
            self._interval = self.settings.min_probe_interval
            self._next_trial = min(self._next_trial, self._step + self._interval)

    def _admitted(self, budget: int) -> bool:
        """Design 19: plain decoding, the anchor (``initial_budget``) and every candidate while the anchor is
        untrusted are admitted; another drafted candidate only while, below the anchor, its rate beats the anchor's
        by more than :data:`ANCHOR_GAP`, or its paired rate beats the anchor's by more than ``anchor_z`` standard errors
        (:meth:`_paired_z`)."""
        anchor, z = self.settings.initial_budget, self.settings.anchor_z
        if z <= 0 or budget in (1, anchor) or anchor == 1 or anchor not in self._rates:
            return True
        rate, anchor_rate = self._rates.get(budget, 0.0), self._rates[anchor]
        if rate < anchor_rate:
            return True  # slower than the (always admitted) anchor, never chosen: no paired test needed
        if budget < anchor and rate > (1.0 + ANCHOR_GAP) * anchor_rate and (
                len(self._samples[self._index_of[anchor]]) >= self.settings.anchor_gap_steps
                or anchor_rate <= self._rates.get(1, 0.0)):
            return True  # every step at the anchor measures it: a wrong anchor (float32: 16 nodes verify dear)
        return self._paired_z(budget, anchor) > z

    def _paired_z(self, budget: int, other: int) -> float:
        """How many standard errors ``budget``'s rate beats ``other``'s by, on the samples that inform both (those of
        the larger): rates are weighted ratios of sums, R = sum w t / sum w s, and the difference's variance is the
        delta method's with the weights as counts of steps, sum over samples of w (u_budget - u_other) ** 2 with
        u = (t - R s) / sum w s: aged samples and carried ones (capped at ``carried_weight`` steps, design 7) are
        that much less evidence. (With w squared instead, a uniform scale cancels: 32 carried samples capped at 8
        steps' worth still admitted the last dataset's 32 nodes for a whole sum request, sweep 15.)"""
        index, other_index = self._index_of[budget], self._index_of[other]
        rows = []
        tokens = seconds = other_tokens = other_seconds = 0.0
        verify, overhead, version = self._verify_table, self._overhead_table, self._version
        for sample in self._samples[max(index, other_index)]:
            if sample.stamp != version:
                self._prepare(sample)
            weight, draft = sample.weight, sample.cumulative_draft
            row = [weight]
            for at in (index, other_index):
                committed, size, forwards = sample.outcomes[at]
                row += [committed, overhead[forwards] + draft[forwards] + verify[size]]
            rows.append(row)
            tokens, seconds = tokens + weight * row[1], seconds + weight * row[2]
            other_tokens, other_seconds = other_tokens + weight * row[3], other_seconds + weight * row[4]
        if len(rows) < 2 or seconds <= 0 or other_seconds <= 0:
            return 0.0
        rate, other_rate = tokens / seconds, other_tokens / other_seconds
        variance = sum(w * ((t - rate * s) / seconds - (t_other - other_rate * s_other) / other_seconds) ** 2
                       for w, t, s, t_other, s_other in rows)
        if variance <= 0:
            return math.inf if rate > other_rate else 0.0
        return (rate - other_rate) / math.sqrt(variance)

    def _lean(self) -> int | None:
        """Design 17: the candidate one rung above a drafted choice, to run instead of it, or None. It runs while
        its trusted rate is within ``lean_margin`` of the choice's, or, untrusted, while its optimistic rate is not
        dominated and trials have not lost their exploration share; every step it runs informs the choice and
        every budget below it, paired, on the same steps."""
        choice, rates, margin = self._choice, self._rates, self.settings.lean_margin
        if margin <= 0 or choice == 1 or choice not in rates or choice == self.candidates[-1]:
            return None
        if not (self._own_outcomes or self._drafted_before):  # as for a trial (design 11b): the choice first
            return None
        above = self._lean_rung(choice)
        if above in rates:
            return above if rates[above] >= (1.0 - margin) * rates[choice] else None
        if self._dominated(above, rates[choice]) or not self._exploration_affordable():
            return None
        return above

    def _lean_rung(self, choice: int) -> int:
        """The candidate a drafted choice leans to (design 17): the next one above it, and at least
        min(``initial_budget``, :data:`LEAN_FLOOR`) (from N = 5 the next rung, 6, adds a draft forward for one
        node and loses on text where 8 wins: it would stop a climb); below ``initial_budget``, at least
        ``lean_reach`` x the choice, up to ``initial_budget`` (design 18: from 8, 16; from 4, 8)."""
        above = [k for k in self.candidates if k > choice]  # callers never pass the largest candidate
        initial = self.settings.initial_budget  # design 18: below it, at least lean_reach x the choice
        floor = min(initial, max(LEAN_FLOOR, self.settings.lean_reach * choice))
        return next((k for k in above if k >= floor), above[-1])

    def _refresh_due(self) -> int | None:
        """Design 21: the budget whose verify cost is re-measured now, or None. At most once every
        ``cost_refresh_interval`` steps: of the candidate just below a drafted choice and the choice itself,
        the one whose last step is older, once ``cost_refresh_interval`` or more steps ran after it (budgets
        never run are left to the cost curve's interpolation). Like plain-measure steps (design 13), a refresh
        is not charged to the exploration share: it is at most one step in ``cost_refresh_interval``."""
        interval, choice = self.settings.cost_refresh_interval, self._choice
        if (interval == 0 or choice == 1 or self._step - self._last_refresh < interval
                or not (self._own_outcomes or self._drafted_before)):
            return None
        below = [k for k in self.candidates if 1 < k < choice]
        since = {budget: self._step - self._last_ran[budget] for budget in below[-1:] + [choice]
                 if budget in self._last_ran}
        since = {budget: steps for budget, steps in since.items() if steps >= interval}
        return max(since, key=since.get) if since else None

    def _plain_due(self) -> bool:
        """A plain step that measures verify(1) is due: while it has fewer than ``min_steps`` measured samples
        (from step 1 on, unless a prior gives verify(1)) and every ``plain_refresh_interval`` steps
        after (design 13)."""
        settings = self.settings
        if not settings.allow_plain or self._choice == 1:
            return False
        if not self.verify_cost.has(1, samples=settings.min_steps):
            return self._step >= 1
        refresh = settings.plain_refresh_interval
        return refresh > 0 and self._step - self._last_plain >= refresh

    def _plain_check_due(self) -> bool:
        """Design 46: a plain step checks the choice now: the sequence is not the first, opened on a drafted choice and
        ran ``plain_check_steps`` drafted steps and no plain one, and the choice's tree costs :data:`CHECK_VERIFY_RATIO`
        times the fastest plain verify kept or more. Design 51: also at or after ``early_check_steps`` drafted steps
        (and before ``plain_check_steps``) while they ran more than :data:`EARLY_CHECK_SHORTFALL` below rate(1)."""
        steps, plain = self.settings.plain_check_steps, self.verify_cost.samples.get(1)
        early, own = self.settings.early_check_steps, len(self._own_outcomes)
        if (steps == 0 or not self.settings.allow_plain or self._choice == 1 or self._sequence_start == 0
                or self._last_plain >= self._sequence_start or own < min(steps, early or steps) or not plain):
            return False
        if self._verify(self._choice) < CHECK_VERIFY_RATIO * min(plain):
            return False
        if own >= steps:
            return True
        drafted, rate = self._own_drafted_rate(), self._plain_rate()  # design 51: already clearly slower than plain
        return drafted is not None and rate is not None and drafted < (1.0 - EARLY_CHECK_SHORTFALL) * rate

    def _own_drafted_rate(self) -> float | None:
        """Committed tokens per second of this sequence's own drafted steps, their catch-up left out (designs 46, 51);
        None before any drafting seconds."""
        tokens, seconds = self._own_drafted
        drafting = seconds - self._own_catch_up
        return tokens / drafting if drafting > 0 else None

    def _judge_plain_check(self, plain_seconds: float) -> None:
        """Design 46, after the check's plain step of ``plain_seconds``: where the sequence's own drafted steps (their
        catch-up left out) committed tokens more than :data:`CHECK_MARGIN` slower than it, the acceptance samples go,
        verify(1) and the plain overhead keep only this sample, and the choice is plain decoding with its schedule
        started over. An early check (design 51: fewer than ``plain_check_steps`` own drafted steps) leaves only below
        :data:`EARLY_CHECK_SHORTFALL`, and when it keeps drafting its plain seconds judge the drafted steps again, with
        :data:`CHECK_MARGIN`, once there are ``plain_check_steps`` of them (no second plain step)."""
        drafted = self._own_drafted_rate()
        early = len(self._own_outcomes) < self.settings.plain_check_steps  # design 51: fewer steps, a wider margin
        margin = EARLY_CHECK_SHORTFALL if early else CHECK_MARGIN
        if drafted is None or plain_seconds <= 0 or drafted >= (1.0 - margin) / plain_seconds:
            self._plain_checks["kept"] += 1
            if early:
                self._early_plain = plain_seconds
            return
        self._plain_checks["plain"] += 1
        self.verify_cost.keep_newest(1, 1)
        self.overhead_cost.keep_newest(0, 1)
        for curve in (self.verify_cost, self.overhead_cost):
            curve.refit()
        self._rebuild_tables()
        self._drop_to_plain()
        self._reset_schedule()
        # design 51: the check measured drafting on this text and it lost, as a trial can; design 12's predictions
        # (read from confidences that are mostly the last text's this early) wait min_probe_interval steps, as after one
        self._last_trial_end = self._step

    def _drop_to_plain(self) -> None:
        """Forget every acceptance sample and choose plain decoding (rates: plain's alone), so that trials re-measure
        drafting on the text at hand (designs 29, 30 and 46)."""
        for samples in self._samples:
            samples.clear()
        self._choice = 1
        plain = self._plain_rate()
        self._rates = {1: plain} if plain is not None else {}
        self._version += 1

    def _trial_blocked(self, catch_up: float, expected: float | None) -> str | None:
        """Why a due trial cannot start now (a key of :data:`REASONS`), or None when it may."""
        if self._choice not in self._rates:
            return "trial-untrusted"
        # a drafted choice that ran no drafted step in this sequence or the last one (catch-up skips)
        # runs itself before a trial probes above it (design 11)
        if self._choice != 1 and not (self._own_outcomes or self._drafted_before):
            return "trial-no-own-draft"
        if not self._trial_affordable(catch_up, expected):
            return "trial-catch-up"
        if not self._exploration_affordable():
            return "trial-exploration"
        # design 54: from plain decoding the catch-up is the trial's own known cost (a drafted choice pays it anyway);
        # it counts before the trial starts, unless the text predicts a win
        if (self.settings.regret_catch_up and self._choice == 1 and catch_up > 0 and expected is not None
                and not self._exploration_affordable(catch_up)):
            plain = self._plain_rate()
            if plain is not None and not self._repaid_by_prediction(catch_up, expected, plain, None):
                return "trial-regret"
        return None

    def _start_trial(self, catch_up: float, expected: float | None) -> int:
        """Begin a trial at the probe budget and return it; the current choice when every probe is dominated
        (a lost trial) or when the probe's trials lost more than the rest of the sequence affords (postponed)."""
        settings, choice = self.settings, self._choice
        above = [k for k in self.candidates if k > choice]
        # from a tiny choice (2-3), twice the choice says nothing of the larger budgets left behind
        if choice > 1 and settings.lean_margin > 0:  # design 17: from a drafted choice, the lean rung
            top = self._lean_rung(choice)
        else:
            base = settings.plain_probe_budget if choice == 1 else max(settings.probe_factor * choice,
                                                                       settings.initial_budget)
            # from plain decoding each lost trial probes twice as far, then starts over (design 3a); from a
            # drafted choice always the next rungs up to base (design 10)
            target = base * 2 ** (self._probe_level if choice == 1 else 0)
            top = next((k for k in above if k >= target), above[-1])
        reference = self._rates.get(choice)
        probe = next((k for k in reversed(above) if k <= top and not self._dominated(k, reference)), None)
        if probe is None:
            self._probes["skipped"] += 1
            self._reason = "trial-dominated"
            self._lose()
            return choice
        if choice == 1 and settings.predict_trials:  # design 12: the largest level the recent text could win
            rungs = self._probe_rungs()
            probe = next((k for k in reversed(rungs) if k <= probe and not self._unpredictable(k, reference)), None)
            if probe is None:
                self._probes["unpredictable"] += 1
                self._reason = "trial-unpredictable"
                return choice
        if not self._trial_affordable(catch_up, expected, probe):
            self._probes["postponed"] += 1
            self._reason = "trial-postponed"
            return choice
        self._trial_budget, self._trial_reference, self._trial_loss = probe, reference, 0.0
        have = len(self._samples[self._index_of[probe]])
        self._trial_left = max(settings.probe_steps, settings.min_steps - have)
        self._reason = "trial"
        return probe

    def _finish_trial(self) -> None:
        before, probe = self._choice, self._trial_budget
        self._last_trial_end = self._step
        if self._trial_reference:
            last = self._trial_losses.get(probe)
            self._trial_losses[probe] = self._trial_loss if last is None else 0.5 * (last + self._trial_loss)
        self._trial_budget = None
        self._choose()
        if self._choice > before:
            self._probes["won"] += 1
            self._probe_level = 0
            self._interval = self.settings.min_probe_interval
            self._next_trial = self._step + self._interval
        else:
            self._probes["lost"] += 1
            self._lose()

    def _lose(self) -> None:
        self._probe_level = (self._probe_level + 1) % self.settings.probe_levels
        self._interval = min(2 * self._interval, self.settings.max_probe_interval)
        self._next_trial = self._step + self._interval
