"""The controller's settings (:class:`ControllerSettings`, frozen, checked on construction) and the
defaults that its designs name (:mod:`talon_sd.control`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import bad_argument
from ._checks import check_int, check_number, is_int, is_number
from .acceptance import DEFAULT_CALIBRATION_EDGES

DEFAULT_LADDER = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
ANCHOR_GAP = 0.1  # below the anchor, a candidate this much faster needs no paired test (design 19)
LEAN_FLOOR = 8  # a drafted choice below this leans to the first candidate >= it (or initial_budget if less; design 17)
FAR_VERIFY_RATIO = 1.75  # design 30 acts where verifying the first step's tree costs this many plain verifies or more
# (at the new prompt's context; 1.5 before design 34)
CHECK_MARGIN = 0.1  # design 46 leaves a carried choice when its drafted steps ran more than this much slower than the
# plain step
EARLY_CHECK_SHORTFALL = 0.2  # design 51: checked from early_check_steps on while their rate is this much below rate(1),
# and left when it is this much below the check's plain step's


@dataclass(frozen=True)
class ControllerSettings:
    """How the online controller chooses budgets (the package docstring, "Design").

    max_budget              largest budget N it may choose (root counted)
    initial_budget          the first step's budget (or a tuned profile's N)
    allow_plain             N = 1 (a plain decoding step) is a candidate
    ladder                  candidate budgets (cut at max_budget; max_budget and initial_budget added)
    window                  samples each candidate keeps (the most recent steps that inform it)
    half_life               steps after which a sample's weight halves
    min_steps               samples before a candidate's rate is trusted
    probe_factor            a trial probes the smallest candidate >= probe_factor x the current choice (with
                            lean_margin 0; otherwise a drafted choice's probe is its lean rung, design 17)
                            (and >= initial_budget)
    plain_probe_budget      ... and from plain (N = 1), the smallest candidate >= this
    probe_levels            from plain decoding, after a lost trial the next probes twice as far, up to
                            2 ** (levels - 1) x
    probe_steps             steps per trial (more while the probe has fewer than min_steps samples)
    min_probe_interval      steps between trials after one that moved the choice up (and at the start)
    max_probe_interval      cap of the interval, which doubles after each trial that did not
    plain_refresh_interval  steps between plain steps that re-measure verify(1) (0: never)
    cost_refresh_interval   at most once in this many steps, the candidate below a drafted choice or the choice
                            runs one step once this many steps ran after its last one (its verify cost
                            re-measured); the verify curve fits each size from its samples of the last twice
                            this many steps, at least its newest RECENT_SAMPLES (0: neither; design 21)
    explore_min_tokens      trials, lean steps and cost refreshes run only while the sequence is expected to commit at
                            least this many more tokens (design 24; 0: always)
    dominance_margin        skip a probe whose optimistic rate is below (1 - margin) x the current rate
    cost_samples            recent samples kept per size in each cost curve
    calibration_edges       bin edges of cumulative draft log p, from 0.0 down (the last bin goes to -inf)
    calibration_decay       weight kept by past calibration counts at each drafted step
    calibration_prior_strength  pseudo-nodes of the calibration's Beta prior
    early_stop              keep_growing may stop a step's growth (False: it always says grow)
    carried_weight          at a new sequence, the carried acceptance samples are scaled down so that no
                            candidate's total weight exceeds this many steps (math.inf: kept as they were)
    trial_cost_share        a trial starts only if its catch-up plus what the last trials of its probe lost
                            cost at most this share of the plain seconds of the tokens expected to be left, or
                            less than half of what the sequence's own text predicts a win saves (design 15)
    release_ratio           a new sequence's carried samples are released (weighed as one step) once its own
                            drafted steps' mean committed tokens differ from theirs by more than this factor
    release_steps           ... judged from this many of its own drafted steps on
    release_nothing_p       ... or while all of those steps accepted nothing, once a run that long is less likely than
                            this among the carried steps (design 47; 0: never; math.inf release_ratio: neither)
    exploration_share       a trial starts only while the seconds trials lost against the choice's rate are at
                            most this share of the seconds observed (bounded regret, design 8) ...
    exploration_half_life   ... both counted with weights halving every this many steps (math.inf: all alike)
    predict_trials          from plain decoding, postpone a trial while the target's confidence on the last
                            ``confidence_window`` tokens says the probe cannot win (design 12)
    confidence_window       committed tokens whose confidence the prediction replays
    lean_margin             a drafted choice runs the next candidate above it (at least min(initial_budget,
                            LEAN_FLOOR)) while that one's rate is within this share of the choice's or not yet
                            trusted (design 17; 0: never)
    lean_reach              ... and, below initial_budget, at least this many times the choice, up to
                            initial_budget (design 18; 1: the next rung)
    anchor_z                a drafted candidate other than initial_budget may be chosen only while its paired rate
                            beats initial_budget's by more than this many standard errors on the steps that
                            inform both (design 19; 0: any trusted candidate, as in design 18)
    anchor_gap_steps        ... or, below it, by more than ANCHOR_GAP, once initial_budget has this many samples
                            or is no faster than plain decoding (design 20; 0: as soon as it is trusted, design 19)
    bet_window              a catch-up judged on the sequence's own text (designs 14, 25) reads the rate predicted
                            from up to this many of its target confidences, not the last confidence_window (design 28;
                            the trials of design 15 still read confidence_window; below it, the bet reads fewer)
    bet_margin              ... and such a catch-up, when above trial_cost_share of the rest's plain seconds (a bet),
                            is paid only when the rest, drafted at that rate, saves this many times its seconds
                            (design 28; 1: once over, as a smaller catch-up)
    leave_plain_margin      from plain decoding, a drafted candidate becomes the choice only when its rate beats
                            plain decoding's by more than this share (design 28; 0: any faster candidate)
    prompt_prior_width      a new sequence whose prompt agreement is known starts plain when the earlier sequences
                            whose agreement lies within this distance of it drafted, on average, slower than plain
                            decoding (design 29; 0: never, design 30 included)
    prompt_gap              ... and also when its agreement lies more than this below that of the last sequence that
                            taught the prior, too few are near and none of those drafted as fast as plain, and
                            verifying the first step's tree costs at least FAR_VERIFY_RATIO plain verifies (design 30;
                            0: never; prompt_prior_width 0 turns it off too)
    paired_plain            while fewer than RECENT_SAMPLES plain steps lie within the verify curve's horizon (twice
                            cost_refresh_interval; none without one), verify(1) is read from plain steps' seconds against
                            the drafted steps' around them, at the host speed of the drafted sizes' fit (design 42;
                            False: as measured)
    follow_plain            while the plain steps are fresh (RECENT_SAMPLES of them within the verify curve's horizon,
                            twice cost_refresh_interval) and no drafted size is, the drafted sizes' verify seconds are
                            read at the plain steps' current speed: times (verify(1) now) / (verify(1) beside their
                            samples) (design 53; False: as measured; needs paired_plain and cost_refresh_interval > 0)
    regret_catch_up         from plain decoding, a due trial's catch-up counts against the exploration share before it
                            starts: it starts only if the seconds trials lost plus that catch-up stay within
                            exploration_share of the observed seconds, unless the sequence's own text predicts a win
                            that pays the catch-up back twice over or the rest's length is unknown (design 54; False:
                            the share is checked on past losses alone). The share admits at most about 4.6 steps'
                            seconds of catch-up at 5% (the observed seconds level off at exploration_half_life / ln 2
                            steps' worth), so from plain a longer prompt is tried only on a predicted win
    reopen_on_fall          when the choice falls to a smaller drafted budget, the trial interval starts over at
                            ``min_probe_interval`` (design 45; False: it keeps the length the last trials left)
    plain_check_steps       where verification is steep, a sequence that opened on a carried drafted choice runs one
                            plain step after this many of its own drafted steps and goes plain if they were more than
                            CHECK_MARGIN slower than it (design 46; 0: never)
    early_check_steps       ... and already from this many (fewer) drafted steps on while their rate is more than
                            EARLY_CHECK_SHORTFALL below rate(1), leaving drafting if it is that much below the check's
                            plain step's (design 51; 0: only after plain_check_steps)
    """

    max_budget: int = 64
    initial_budget: int = 8
    allow_plain: bool = True
    ladder: tuple[int, ...] = DEFAULT_LADDER
    window: int = 32
    half_life: float = 32.0
    min_steps: int = 3
    probe_factor: float = 2.0
    plain_probe_budget: int = 4
    probe_steps: int = 2
    probe_levels: int = 3
    min_probe_interval: int = 4
    max_probe_interval: int = 64
    plain_refresh_interval: int = 64
    dominance_margin: float = 0.05
    cost_samples: int = 9
    calibration_edges: tuple[float, ...] = DEFAULT_CALIBRATION_EDGES
    calibration_decay: float = 0.97
    calibration_prior_strength: float = 2.0
    early_stop: bool = False  # off by default: see design 4 (it starved chat trees on the real pair)
    carried_weight: float = 8.0
    trial_cost_share: float = 0.05
    release_ratio: float = 1.5
    release_steps: int = 2
    release_nothing_p: float = 0.05
    exploration_share: float = 0.05
    exploration_half_life: float = 64.0
    predict_trials: bool = True
    confidence_window: int = 16
    lean_margin: float = 0.01
    lean_reach: float = 2.0
    anchor_z: float = 1.0
    anchor_gap_steps: int = 8
    cost_refresh_interval: int = 16
    explore_min_tokens: int = 32
    bet_window: int = 64
    bet_margin: float = 1.5
    leave_plain_margin: float = 0.05
    prompt_prior_width: float = 0.05
    prompt_gap: float = 0.15
    paired_plain: bool = True
    follow_plain: bool = True
    regret_catch_up: bool = True
    reopen_on_fall: bool = True
    plain_check_steps: int = 5
    early_check_steps: int = 2

    def __post_init__(self) -> None:
        for name in ("allow_plain", "early_stop", "predict_trials", "paired_plain", "follow_plain", "regret_catch_up",
                     "reopen_on_fall"):
            if not isinstance(getattr(self, name), bool):
                raise bad_argument(name, getattr(self, name), "True or False")
        check_int("max_budget", self.max_budget, 1 if self.allow_plain else 2,
                   "an integer >= 1" if self.allow_plain else "an integer >= 2 (allow_plain is False)")
        check_int("initial_budget", self.initial_budget, 1 if self.allow_plain else 2,
                   f"an integer in [{1 if self.allow_plain else 2}, max_budget={self.max_budget}]", self.max_budget)
        if (not isinstance(self.ladder, (tuple, list)) or not self.ladder
                or not all(is_int(k) and k >= 1 for k in self.ladder)):
            raise bad_argument("ladder", self.ladder, "a non-empty tuple of integers >= 1")
        object.__setattr__(self, "ladder", tuple(sorted(set(self.ladder))))
        for name, low in (("window", 1), ("min_steps", 1), ("plain_probe_budget", 2), ("probe_steps", 1),
                          ("probe_levels", 1), ("min_probe_interval", 1), ("cost_samples", 1),
                          ("plain_refresh_interval", 0), ("release_steps", 1), ("confidence_window", 1),
                          ("anchor_gap_steps", 0), ("cost_refresh_interval", 0), ("explore_min_tokens", 0),
                          ("bet_window", 1), ("plain_check_steps", 0),
                          ("early_check_steps", 0)):
            check_int(name, getattr(self, name), low, f"an integer >= {low}")
        if self.min_steps > self.window:
            raise bad_argument("min_steps", self.min_steps, f"at most window={self.window}")
        check_int("max_probe_interval", self.max_probe_interval, self.min_probe_interval,
                   f"an integer >= min_probe_interval={self.min_probe_interval}")
        check_number("half_life", self.half_life, "a number > 0", lambda x: x > 0)
        check_number("carried_weight", self.carried_weight, "a number > 0 (math.inf: no cap)", lambda x: x > 0,
                      infinite_ok=True)
        check_number("trial_cost_share", self.trial_cost_share, "a number >= 0", lambda x: x >= 0)
        check_number("release_ratio", self.release_ratio, "a number > 1 (math.inf: never release)",
                      lambda x: x > 1, infinite_ok=True)
        check_number("release_nothing_p", self.release_nothing_p, "a number in [0, 1] (0: no design 47)",
                      lambda x: 0 <= x <= 1)
        check_number("exploration_half_life", self.exploration_half_life, "a number > 0 (math.inf: no decay)",
                      lambda x: x > 0, infinite_ok=True)
        check_number("exploration_share", self.exploration_share, "a number >= 0 (math.inf: no bound)",
                      lambda x: x >= 0, infinite_ok=True)
        check_number("probe_factor", self.probe_factor, "a number > 1", lambda x: x > 1)
        check_number("dominance_margin", self.dominance_margin, "a number in [0, 1)", lambda x: 0 <= x < 1)
        check_number("bet_margin", self.bet_margin, "a finite number >= 1", lambda x: x >= 1)
        check_number("leave_plain_margin", self.leave_plain_margin, "a finite number >= 0", lambda x: x >= 0)
        check_number("prompt_prior_width", self.prompt_prior_width, "a number in [0, 1] (0: no prompt prior)",
                      lambda x: 0 <= x <= 1)
        check_number("prompt_gap", self.prompt_gap, "a number in [0, 1] (0: no gap rule)", lambda x: 0 <= x <= 1)
        check_number("lean_reach", self.lean_reach, "a number >= 1 (1: the next rung)", lambda x: x >= 1)
        check_number("anchor_z", self.anchor_z, "a number >= 0 (0: no anchor)", lambda x: x >= 0)
        check_number("lean_margin", self.lean_margin, "a number in [0, 1) (0: never lean)", lambda x: 0 <= x < 1)
        check_number("calibration_decay", self.calibration_decay, "a number in (0, 1]", lambda x: 0 < x <= 1)
        check_number("calibration_prior_strength", self.calibration_prior_strength, "a number > 0",
                      lambda x: x > 0)
        edges = self.calibration_edges
        if (not isinstance(edges, (tuple, list)) or len(edges) < 2 or edges[0] != 0
                or not all(is_number(e) and math.isfinite(e) for e in edges)
                or any(a <= b for a, b in zip(edges, edges[1:]))):
            raise bad_argument("calibration_edges", edges, "finite log-probabilities decreasing from 0.0 "
                               "(at least two)")
        object.__setattr__(self, "calibration_edges", tuple(float(e) for e in edges))

    def candidates(self) -> tuple[int, ...]:
        """The candidate budgets, ascending: the ladder up to max_budget, plus max_budget and
        initial_budget; without 1 unless allow_plain."""
        chosen = {k for k in self.ladder if k <= self.max_budget} | {self.max_budget, self.initial_budget}
        return tuple(sorted(k for k in chosen if self.allow_plain or k >= 2))
