"""The decoding loop: plan -> draft -> build -> verify -> accept -> commit, as one token generator.

Every front end (the Python API, the CLI, the benchmark, the server) consumes :func:`decode`; one request's part
of a step is a :class:`Request`, which :mod:`talon_sd.batch` also runs, several requests per target forward.
Plain autoregressive decoding is the same loop with the ``ar`` builder (a root-only tree, no drafter),
so the baseline and the speculative methods share every line of code but the tree.

Invariant at the top of each step: the target's cache holds every committed token except the last
one, which is the root of the next tree (node 0). The verify forward covers the root and the drafts.
With an online controller (``budget="auto"``, :mod:`talon_sd.control`) each step's budget comes
from the controller, which is then told what the step cost and accepted; it never changes which
tokens are emitted, only how many are drafted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from .builders import Growth, StepPlan, TreeBuilder, drive
from .config import SamplingConfig
from .drafters import Drafter
from .lm import CausalLM
from .stats import DecodeStats
from .tree import DraftTree
from .verify import Acceptance, PositionNoise, accept

if TYPE_CHECKING:
    from .control import BudgetController, StepRecord

STOP_REASONS = ("eos", "stop_string", "max_new_tokens", "context")  # why a generation ended


@dataclass
class StopCondition:
    """Stops on an EOS id, when ``text_of(new tokens)`` contains a stop string, after ``max_new_tokens``
    (or ``context``: ``max_new_tokens`` was lowered to fit the model's context). Records why in
    :attr:`reason` (one of :data:`STOP_REASONS`) and the stop string found in :attr:`stop_string`."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    text_of: Callable[[list[int]], str] | None = None
    length_reason: str = "max_new_tokens"  # the reason recorded when the token limit ends the generation
    tokens: list[int] = field(default_factory=list, init=False)
    reason: str | None = field(default=None, init=False)
    stop_string: str | None = field(default=None, init=False)

    def done(self, token: int) -> bool:
        """Record one emitted token; True when it must be the last."""
        self.tokens.append(token)
        if token in self.eos_token_ids:
            self.reason = "eos"
        elif self.stop_strings and self.text_of is not None:
            longest = max(map(len, self.stop_strings))
            tail = self.text_of(self.tokens[-(longest + 64):])
            self.stop_string = next((s for s in self.stop_strings if s in tail), None)
            self.reason = "stop_string" if self.stop_string is not None else None
        if self.reason is None and len(self.tokens) >= self.max_new_tokens:
            self.reason = self.length_reason
        return self.reason is not None

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's name: ``stop`` (EOS or a stop string) or ``length``; None while running."""
        if self.reason is None:
            return None
        return "stop" if self.reason in ("eos", "stop_string") else "length"


@dataclass(frozen=True)
class Pipeline:
    """The parts one generation runs with (each generation owns its caches and controller)."""

    target: CausalLM
    drafter: Drafter | None  # None only with the ``ar`` builder
    builder: TreeBuilder
    sampling: SamplingConfig
    controller: "BudgetController | None" = None  # None: the builder's fixed budget


def decode(pipeline: Pipeline, prompt_ids: torch.Tensor, stop: StopCondition, stats: DecodeStats) -> Iterator[int]:
    """Yield new tokens for ``prompt_ids`` [L >= 1] until ``stop`` says so, never one past the stop
    (even inside an accepted path). ``stats`` is complete once the generator is exhausted or closed.
    Sampling draws each position's token with noise keyed by (seed, position) (:mod:`talon_sd.verify`);
    without a seed a fresh one is drawn and reported in ``stats.seed``."""
    request = Request(pipeline, stop, stats)
    capture = request.capture
    try:
        request.start(prompt_ids)
        while True:
            tree = request.draft()  # 1-2. plan the budget, draft and build the tree
            started = time.perf_counter()  # 3. verify: one target forward over the whole tree, then the rule
            logits, features = _verify_forward(pipeline.target, tree, capture)
            acceptance = request.accept(tree, logits)
            verify_seconds = time.perf_counter() - started
            pipeline.target.commit_tree(tree.size, acceptance.path)  # 4. commit: keep the root and the path
            request.commit(tree, logits, features, acceptance, verify_seconds)  # 5. drafter, stats, controller
            for token in acceptance.new_tokens:  # 6. emit, stopping inside the path if needed
                yield token
                if stop.done(token):
                    return
    finally:
        stats.finish(len(stop.tokens))


class Request:
    """One request's decoding state between verify steps: everything of a step but the target's forward and
    cache commit, which :func:`decode` runs for one request and :mod:`talon_sd.batch` for several at once.

    Invariant at the top of each step: the target's cache holds every committed token except the last one,
    :attr:`root`, which is node 0 of the next tree; :attr:`context` is its position."""

    def __init__(self, pipeline: Pipeline, stop: StopCondition, stats: DecodeStats,
                 alternate: Pipeline | None = None) -> None:
        """``alternate``: a second pipeline on the same target and sampling with another drafter that reads no target
        states (a batch's n-gram drafter beside a draft LM, :mod:`talon_sd.batch`); :meth:`use` chooses between them
        before a step, and every drafter sees every commit."""
        self.pipeline, self.stop, self.stats = pipeline, stop, stats
        self.pipelines = [pipeline] + ([alternate] if alternate is not None else [])
        if alternate is not None and (alternate.drafter is None or alternate.drafter.feature_layers
                                      or alternate.drafter.name == getattr(pipeline.drafter, "name", None)):
            raise ValueError("alternate: a pipeline with another drafter that reads no target states")
        sampling = pipeline.sampling
        if not sampling.greedy:
            stats.seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(7), "little")
        self.noise = None if sampling.greedy else PositionNoise(stats.seed)
        self.clocks = [_DraftClock(p.drafter) for p in self.pipelines]
        self.clock = self.clocks[0]
        self.capture = pipeline.drafter.feature_layers if pipeline.drafter is not None else ()  # target states read
        self.root, self.context = -1, 0
        self.plan: StepPlan | None = None
        self.forwards = Forwards()
        self.other_seconds = 0.0  # this step's seconds outside draft forwards and verification

    def start(self, prompt_ids: torch.Tensor) -> None:
        """Prefill the target's cache with the prompt but its last token (the first root); start the drafter."""
        target, drafter = self.pipeline.target, self.pipeline.drafter
        self.stats.prompt_tokens = int(prompt_ids.numel())
        self.stats.started = started = time.perf_counter()
        features = target.prefill(prompt_ids[:-1], self.capture)
        prefill_row = (time.perf_counter() - started) / max(int(prompt_ids.numel()) - 1, 1)  # seconds
        controller, greedy = self.pipeline.controller, self.pipeline.sampling.greedy
        if controller is not None:  # a sampled request's unmeasured catch-up, priced as the target's prefill per row
            # x the draft's share of its weights (prefill is compute-bound; talon_sd.control: Choice and exploration)
            sampled_draft = drafter is not None and not greedy
            share = drafter.linear_weights / max(target.linear_weights, 1) if sampled_draft else 0.0
            controller.catch_up_row = share * prefill_row
        if drafter is not None:
            drafter.start(prompt_ids, features)
        for other in self.pipelines[1:]:
            other.drafter.start(prompt_ids)
        self.stats.seconds_prefill += time.perf_counter() - started
        self.root, self.context = int(prompt_ids[-1]), int(prompt_ids.numel()) - 1

    def _pipeline_index(self, drafter_name: str) -> int:
        return next(i for i, p in enumerate(self.pipelines) if p.drafter is not None and p.drafter.name == drafter_name)

    def use(self, drafter_name: str | None) -> None:
        """Run the next steps with the pipeline whose drafter is ``drafter_name`` (one of :attr:`pipelines`'), or
        None: the request's own."""
        index = 0 if drafter_name is None else self._pipeline_index(drafter_name)
        self.pipeline, self.clock = self.pipelines[index], self.clocks[index]

    def catch_up_seconds(self, drafter_name: str | None = None) -> float:
        """What the catch-up of the drafter named (None: the one running) costs if it drafts now (the committed
        tokens a draft LM has not forwarded), as its pipeline's controller prices it."""
        pipeline = self.pipeline if drafter_name is None else self.pipelines[self._pipeline_index(drafter_name)]
        tokens = pipeline.drafter.catch_up_tokens if pipeline.drafter is not None else 0
        return pipeline.controller.catch_up_seconds(tokens) if tokens else 0.0

    def draft(self) -> DraftTree:
        """Plan this step's budget, draft and build the tree from :attr:`root`."""
        started = time.perf_counter()
        self.plan_step()
        tree = drive(self.begin_draft(), self.clock.expand)
        self.end_draft(time.perf_counter() - started)
        return tree

    def plan_step(self) -> StepPlan | None:
        """This step's budget from the controller (None: the builder's own), kept in :attr:`plan`, which a batch
        may replace before :meth:`begin_draft` (a verify budget shared across requests)."""
        self.plan = _plan(self.pipeline.controller, self.pipeline.drafter, self.stop)
        return self.plan

    def begin_draft(self) -> Growth:
        """The builder's coroutine for this step's tree at :attr:`plan` (:meth:`TreeBuilder.grow`): it asks for the
        draft forwards, which :meth:`draft` runs one by one and a batch runs for several requests at once (timed
        through :attr:`clock`)."""
        pipeline = self.pipeline
        if pipeline.drafter is not None:
            pipeline.drafter.begin_step(self.root)
        return pipeline.builder.grow(self.root, pipeline.target.device, self.plan)

    def end_draft(self, seconds: float) -> None:
        """The tree is built, the drafting having taken ``seconds`` of this request's time."""
        self.forwards = self.clock.take()
        self.other_seconds = max(seconds - self.forwards.seconds, 0.0)

    def accept(self, tree: DraftTree, logits: torch.Tensor) -> Acceptance:
        """The verdict on ``tree`` given the target's ``logits`` [N, V] over it."""
        return accept(tree, logits, self.pipeline.sampling, self.noise, self.context)

    def commit(self, tree: DraftTree, logits: torch.Tensor, features: torch.Tensor | None, acceptance: Acceptance,
               verify_seconds: float) -> None:
        """After the target's cache kept the path: the drafter's commit, the stats, what the controller learns;
        the next root. ``features`` [N, H'] of the tree's nodes when the drafter reads target states."""
        started = time.perf_counter()
        pipeline, plan, forwards = self.pipeline, self.plan, self.forwards
        if pipeline.drafter is not None:
            pipeline.drafter.accept(tree, acceptance, None if features is None else features[acceptance.path])
        for other in self.pipelines:  # an idle drafter takes the tokens as after a plain step (its catch-up)
            if other is not pipeline:
                other.drafter.accept(tree, acceptance)
        self.stats.observe(tree, acceptance, forwards.count, plan.budget if plan else tree.size,
                           plan.reason if plan else "")
        other_seconds = self.other_seconds + time.perf_counter() - started
        self.stats.add_seconds(forwards.seconds, verify_seconds, other_seconds)
        if pipeline.controller is not None:
            pipeline.controller.observe(step_record(pipeline.builder, tree, acceptance, forwards, plan, verify_seconds,
                                                    other_seconds, target_confidence(logits, acceptance)))
        self.root, self.context = acceptance.bonus_token, self.context + len(acceptance.path)


def _verify_forward(target: CausalLM, tree: DraftTree, capture: tuple[int, ...]):
    """(logits [N, V], features [N, H'] or None) of one target forward over the tree."""
    if capture:
        return target.forward_tree(tree, capture)
    return target.forward_tree(tree), None


@dataclass
class Forwards:
    """The draft forwards of one step: width, seconds and the tree size they were given."""

    widths: list[int] = field(default_factory=list)
    seconds_each: list[float] = field(default_factory=list)
    sizes_before: list[int] = field(default_factory=list)  # tree size when each forward was asked for
    catch_up_seconds: float | None = None  # a catch-up forward run apart before the first (Drafter.catch_up)

    @property
    def count(self) -> int:
        return len(self.widths)

    @property
    def seconds(self) -> float:
        """All draft seconds of the step, a separate catch-up included."""
        return sum(self.seconds_each) + (self.catch_up_seconds or 0.0)


class _DraftClock:
    """Wraps ``drafter.expand`` to record every draft forward of the step (and, before the first, a catch-up
    the drafter runs as a forward of its own: :meth:`talon_sd.drafters.Drafter.catch_up`)."""

    def __init__(self, drafter: Drafter | None) -> None:
        self.drafter, self.step = drafter, Forwards()

    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        self.catch_up()
        started = time.perf_counter()
        log_p_draft = self.drafter.expand(tree, nodes)  # [F, V]
        self.record(tree, nodes, time.perf_counter() - started)
        return log_p_draft

    def catch_up(self) -> None:
        """Before the step's first forward: the drafter's catch-up, if it runs one apart, timed apart."""
        started = time.perf_counter()
        if not self.step.widths and self.drafter.catch_up():
            self.step.catch_up_seconds = time.perf_counter() - started

    def record(self, tree: DraftTree, nodes: torch.Tensor, seconds: float) -> None:
        """One draft forward over ``nodes`` of ``tree`` took ``seconds`` (run here, or by a batch)."""
        self.step.seconds_each.append(seconds)
        self.step.widths.append(int(nodes.numel()))
        self.step.sizes_before.append(tree.size)

    def take(self) -> Forwards:
        taken, self.step = self.step, Forwards()
        return taken


def _plan(controller: "BudgetController | None", drafter: Drafter | None, stop: StopCondition) -> StepPlan | None:
    """This step's budget from the controller (None: the builder's own budget)."""
    if controller is None:
        return None
    budget = controller.next_budget(drafter.catch_up_tokens if drafter is not None else 0,
                                    max(stop.max_new_tokens - len(stop.tokens), 0))
    return StepPlan(budget=budget, reason=controller.reason)


def target_confidence(logits: torch.Tensor, acceptance: Acceptance) -> tuple[float, ...]:
    """The target's top-1 probability before each token the step commits (at the root and each accepted node):
    how predictable the text is, which the controller reads."""
    rows = logits[acceptance.path].float()  # [A + 1, V]
    return tuple(torch.softmax(rows, dim=-1).amax(dim=-1).tolist())


def step_record(builder: TreeBuilder, tree: DraftTree, acceptance: Acceptance, forwards: Forwards,
                plan: StepPlan | None, verify_seconds: float, other_seconds: float,
                confidence: tuple[float, ...] = ()) -> "StepRecord":
    """The controller's view of a verified step: nodes in the builder's inclusion order (so the first k
    nodes are the tree budget k would have built), the usable prefix after each draft forward and the
    target's confidence before each committed token."""
    from .control import StepRecord

    order = builder.inclusion_order(tree)  # inclusion position -> node index
    position = {node: index for index, node in enumerate(order)}
    parents = tree.parents.tolist()
    if builder.layered:  # forward j makes the nodes present when forward j + 1 was asked for
        prefix = forwards.sizes_before[1:] + [tree.size] if forwards.count else []
    else:
        prefix = [1] * (forwards.count - 1) + [tree.size] if forwards.count else []
    budget = plan.budget if plan is not None else tree.size
    return StepRecord(
        node_parent=tuple(position[parents[node]] if parents[node] >= 0 else -1 for node in order),
        accepted=tuple(sorted(position[node] for node in acceptance.path[1:])),
        forward_widths=tuple(forwards.widths),
        prefix_after_forward=tuple(prefix),
        draft_seconds=tuple(forwards.seconds_each),
        verify_seconds=verify_seconds,
        other_seconds=max(other_seconds, 0.0),
        budget=budget,
        complete=tree.size < budget,
        catch_up_seconds=forwards.catch_up_seconds,
        confidence=confidence,
    )
