"""Online tree-budget control: each verify step's budget N, for the most committed tokens per second.

The loop asks ``next_budget(catch_up_tokens, tokens_left)`` before each step (N = 1: a plain step), reads ``reason``
(:data:`REASONS`) and tells ``observe(StepRecord)`` what the step built, accepted and cost. The controller decides
how many tokens are drafted, never which are emitted: the output does not depend on it.

Value: the prefix property
    A TALON tree of budget k is the first k nodes of the tree of any budget M >= k (arXiv 2601.07353,
    Algorithm 2; chain, and EAGLE after its rerank, too), and verification accepts in it the big tree's path cut
    at the first node of position >= k, for greedy and sampling alike (the target's draw at a position does not
    depend on the tree, :mod:`talon_sd.verify`). So one verified tree of M nodes tells every k <= M what it would
    have committed and run (:func:`prefix_outcome`). Per budget the controller keeps sums over the steps that
    informed it (:class:`Value`), each step's weight halving every ``half_life`` steps so that new text moves
    them. Above the choice only probes inform a budget, so its expected tokens are its ratio to the budget below
    on those same steps, chained up from N = 1: what the probes' text had in common cancels.

The text: the target's confidence
    Acceptance depends on the text (code is predictable, open chat is not). An exponential mean of the target's
    top-1 probability over the committed tokens (weight 1/8 each) tells predictable text (>= 0.9) from open
    text. Drafted steps are also kept per kind of text; every budget's drafted tokens are scaled by what the
    recent kind accepted at N = 2 (which every drafted step informs) against all text; a kind of text that few
    drafted steps have seen gets a trial tree from plain decoding at once.

Costs
    Measured seconds by size (:class:`CostCurve`): the verify by tree size, a draft forward by rows forwarded,
    the rest of a step by its draft forwards. A step at budget k costs verify(nodes) + forwards x draft(rows per
    forward) + rest(forwards), with the shape of the steps that informed k. After plain steps a draft LM must
    first forward the tokens it skipped (the prompt, plain steps' tokens): that catch-up costs what so many more
    rows cost and is charged to drafting, spread over at most ``horizon`` (32) coming tokens, so a long prompt's
    catch-up is paid only where drafting should repay it soon (a new text may draft worse than the last).

Choice and exploration
    The choice is the budget of most expected tokens per second, plain decoding included, among those informed
    by 4 steps or more. Exploring is paid from a credit of ``exploration`` (3%) of the time run, so it loses at
    most that share (but for a fresh controller's plain step and a few trees per kind of text): a probe at the
    rung at or above twice the choice and ``initial_budget`` (past a dip in the rate: on a float32 CPU trees of
    2-8 nodes may lose where 16 wins; a larger tree commits at least what the choice would, so it loses at most
    its extra seconds); while drafting, a plain step every ``plain_refresh`` steps; while plain, a trial tree
    priced with its catch-up. A fresh controller runs ``initial_budget`` until 4 steps inform it.

Many requests: :func:`share_budget` shares one verify budget among a batch's requests by their expected tokens.
State: JSON data (``to_dict``, ``from_dict``; :mod:`talon_sd.controller_memory` keeps it between processes).
"""

from .controller import (LADDER, REASONS, BudgetController, ControllerSettings, CostPrior,  # noqa: F401
                         Value, share_budget)
from .costs import CostCurve  # noqa: F401
from .records import PrefixOutcome, StepRecord, informs, prefix_outcome  # noqa: F401
