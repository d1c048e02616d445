"""Online tree-budget control: each verify step's budget N, for the most committed tokens per second.

The loop asks ``next_budget(catch_up_tokens, tokens_left)`` before each step (N = 1: a plain step), reads ``reason``
(:data:`REASONS`) and tells ``observe(StepRecord)`` what the step built, accepted and cost. The controller decides
how many tokens are drafted, never which are emitted: the output does not depend on it.

Value: the prefix property
    A TALON tree of budget k is the first k nodes of the tree of any budget M >= k (arXiv 2601.07353, Alg. 2;
    chain and EAGLE's reranked tree too), and verification accepts in it the big tree's path cut at the first node
    of position >= k, greedy or sampled (a position's draw does not depend on the tree, :mod:`talon_sd.verify`):
    one verified tree of M nodes tells every k <= M what it would have committed and run (:func:`prefix_outcome`).
    Per budget the controller keeps sums over the steps that informed it (:class:`Value`), a step's weight halving
    every ``half_life`` steps. Above the choice only probes inform a budget: its expected tokens are its ratio to
    the budget below on those steps, chained up from N = 1 (what the probes' text had in common cancels).

The text: the target's confidence
    An exponential mean of the target's top-1 probability over committed tokens (1/8 each) tells predictable text
    (>= 0.9: code) from open text (chat). Drafted steps are also kept per kind; each budget's drafted tokens are
    scaled by the recent kind's acceptance at N = 2 over all text's (predictable text's by >= ``kind_floor``: 1 for
    a draft model, 0 for n-gram drafts); a kind few drafted steps have seen gets a trial tree from plain at once.

Costs
    Measured seconds (:class:`CostCurve`): verify by tree size, a draft forward by rows, the rest by draft forwards;
    a step at budget k costs them as the steps informing k ran. After plain steps a draft LM first forwards the
    tokens it skipped (the prompt, plain steps' tokens): a catch-up charged to drafting over ``horizon`` (32) tokens.

Choice and exploration
    The choice: the budget of most expected tokens per second, plain decoding included, among those informed by
    4 steps or more. Exploring is paid from a credit of ``exploration`` (3%) of the time run, so it loses at most
    that share (but for a fresh controller's plain step and a few trees per kind of text): a probe at the rung
    >= twice the choice and ``initial_budget`` (float32 CPUs: trees of 2-8 may lose where 16 wins); while drafting,
    a plain step every ``plain_refresh`` steps; while plain, a trial tree; each priced at its tree filled. Where the
    loop sets ``catch_up_row`` (sampled: drafts agree less), a fresh start's catch-up is paid from the credit and the
    request's share, before a draft forward is measured at ``catch_up_row`` seconds a row.

Many requests: :func:`share_budget` shares one verify budget among a batch's requests by their expected tokens.
State: JSON data (``to_dict``, ``from_dict``; :mod:`talon_sd.controller_memory` keeps it between processes).
"""

from .controller import (LADDER, REASONS, BudgetController, ControllerSettings, CostPrior,  # noqa: F401
                         Value, share_budget)
from .costs import CostCurve  # noqa: F401
from .records import PrefixOutcome, StepRecord, informs, prefix_outcome  # noqa: F401
