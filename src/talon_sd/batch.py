"""Several requests verified in one target forward: a padded batch of KV caches and the step loop over it.

Each request keeps its own drafter, builder, sampling, budget controller and stop condition (a
:class:`talon_sd.decoding.Request`); what the batch shares is the target: every step, one forward verifies
all the requests' trees (a plain step is a root-only tree), each tree seeing only its own request's cache
row and its own ancestors. Requests join (:meth:`BatchDecoder.add`) and leave (when their stop condition
holds, or :meth:`BatchDecoder.remove`) between steps. The draft LMs of one model run batched too: the builders
grow in lockstep (:meth:`talon_sd.builders.TreeBuilder.grow`) and each round of their asks is one draft forward.
The TALON paper (arXiv 2601.07353) leaves batch > 1 open. Here requests with an online budget share one verify
budget (:meth:`BatchDecoder._share`): each step the rows go where they add most expected tokens per second of the
whole batch (:func:`talon_sd.control.share_budget`), priced by the batch's own measured costs, so where extra rows
are dear every request runs plain and where they are nearly free the confident ones get deep trees; and the batch
drafts only while its drafted steps measure more tokens per second than its plain ones (:class:`StepRates`).

Cache layout (:class:`BatchedCache`, the target's and each draft LM's), ``width`` columns, row r one request::

    row r:  [ committed tokens but the root (lengths[r]) | holes up to width | tree nodes of this step ]
                                                            (never visible)    (columns width .. width + T)

The mask is ``[R, 1, T, width + T]`` (additive, the model's dtype): a node sees its row's committed columns
and its own ancestors; the padding queries of a tree smaller than the largest see only themselves (so that
no attention row is empty). After acceptance each row's path moves to its committed columns (one gather
and one scatter per tensor over the kept slots only) and the cache is cut to the longest row.

A row's logits can differ from the single-request forward's in the last bits (other shapes of the same
matmuls), as a tree's already do from plain decoding's: greedy output is the target's own up to
floating-point near-ties (exact in float32 on the test models). Only full-attention models are batched.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable

import torch
from transformers import DynamicCache

from .builders import StepPlan
from .control import CostCurve, share_budget
from .control.controller import TRUSTED
from .decoding import Pipeline, Request, StopCondition
from .drafters import ModelDrafter
from .errors import TalonError
from .lm import CausalLM, KVCache, additive_mask
from .stats import DecodeStats
from .tree import DraftTree

RowQueries = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]  # tokens [F], positions [F] or None
# (continue the row), visible [F, row length + F] or None (causal after the whole row)


class BatchedCache:
    """A model's KV cache of R requests, one row each (module docstring): ``lengths[r]`` columns in use."""

    def __init__(self) -> None:
        self.cache = DynamicCache()
        self.lengths: list[int] = []

    @property
    def width(self) -> int:
        return self.cache.get_seq_length() if self.cache.layers else 0

    @torch.inference_mode()
    def add(self, single: KVCache) -> None:
        """Append a request whose prompt is in ``single`` (a one-request cache, which is left empty)."""
        for layer in self.cache.layers:  # an empty row, then the request's content
            layer.keys = torch.cat([layer.keys, layer.keys.new_zeros((1,) + layer.keys.shape[1:])])
            layer.values = torch.cat([layer.values, layer.values.new_zeros((1,) + layer.values.shape[1:])])
        self.lengths.append(0)
        self.set_row(len(self.lengths) - 1, single)

    @torch.inference_mode()
    def remove(self, row: int) -> None:
        """Drop request ``row``; the rows after it move up one."""
        keep = torch.tensor([r for r in range(len(self.lengths)) if r != row], dtype=torch.long)
        self.lengths.pop(row)
        for layer in self.cache.layers:
            index = keep.to(layer.keys.device)
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self._cut()

    @torch.inference_mode()
    def forward(self, lm: CausalLM, queries: list[RowQueries | None], hidden: bool = False):
        """One forward of ``lm``'s model over every row's queries (None: a row with none this time, given one
        padding query): ``(model output, width)``; the output's ``[R, T, ...]`` row r, first ``F_r`` positions, are
        row r's. Every row gets T columns at ``width``: :meth:`commit` keeps the ones wanted."""
        rows, width = len(self.lengths), self.width
        size = max(len(q[0]) for q in queries if q is not None)
        tokens = torch.zeros(rows, size, dtype=torch.long)
        positions = torch.tensor(self.lengths, dtype=torch.long)[:, None].repeat(1, size)  # [R, T]
        visible = torch.zeros(rows, size, width + size, dtype=torch.bool)
        padding = torch.arange(size)
        visible[:, padding, width + padding] = True  # every query sees itself (padding queries nothing else)
        for r, query in enumerate(queries):
            if query is None:
                continue
            row_tokens, row_positions, row_visible = query
            count, length = len(row_tokens), self.lengths[r]
            tokens[r, :count] = row_tokens.cpu()
            if row_positions is not None:
                positions[r, :count] = row_positions.cpu()
            else:
                positions[r, :count] += torch.arange(count)
            if row_visible is None:  # causal over the new rows, after all of the row's cache
                row_visible = torch.cat([torch.ones(count, length, dtype=torch.bool),
                                         torch.ones(count, count, dtype=torch.bool).tril()], 1)
            row_visible = row_visible.cpu()
            visible[r, :count, :length] = row_visible[:, :length]
            visible[r, :count, width : width + count] = row_visible[:, length:]
        output = lm.model(input_ids=tokens.to(lm.device), position_ids=positions.to(lm.device),
                          attention_mask=additive_mask(visible, lm.dtype, lm.device)[:, None],  # [R, 1, T, width + T]
                          **{lm.cache_keyword: self.cache},
                          use_cache=True, output_hidden_states=hidden)
        return output, width

    @torch.inference_mode()
    def set_row(self, row: int, single: KVCache) -> None:
        """Row ``row`` becomes ``single``'s content (a one-request cache, which is left empty)."""
        length = single.length
        if length:
            if not self.cache.layers:  # nothing forwarded yet: the other rows hold zeros
                for layer in single.cache.layers:
                    keys = layer.keys.new_zeros((len(self.lengths),) + layer.keys.shape[1:])
                    values = layer.values.new_zeros((len(self.lengths),) + layer.values.shape[1:])
                    keys[row], values[row] = layer.keys[0], layer.values[0]
                    layer.keys, layer.values = keys, values
                self.cache = single.cache
            else:
                width = max(self.width, length)
                for mine, other in zip(self.cache.layers, single.cache.layers):
                    mine.keys, mine.values = _pad(mine.keys, width), _pad(mine.values, width)
                    mine.keys[row, :, :length] = other.keys[0]
                    mine.values[row, :, :length] = other.values[0]
        self.lengths[row] = length
        single.reset()
        self._cut()

    @torch.inference_mode()
    def keep_row(self, row: int, start: int, offsets: torch.Tensor) -> None:
        """Row ``row`` keeps columns ``[:start]`` and then ``start + offsets`` (ascending), as KVCache.keep."""
        count = int(offsets.numel())
        for layer in self.cache.layers:
            source = (offsets.to(torch.long) + start).to(layer.keys.device)
            layer.keys[row, :, start : start + count] = layer.keys[row, :, source]
            layer.values[row, :, start : start + count] = layer.values[row, :, source]
        self.lengths[row] = start + count
        self._cut()

    def reset_row(self, row: int) -> None:
        self.lengths[row] = 0
        self._cut()

    @torch.inference_mode()
    def commit(self, width: int, paths: list[list[int]]) -> None:
        """After a forward that appended T columns at ``width``: row r keeps the nodes ``paths[r]`` (root first)."""
        rows, source, destination = [], [], []
        for r, path in enumerate(paths):
            rows += [r] * len(path)
            source += [width + node for node in path]
            destination += range(self.lengths[r], self.lengths[r] + len(path))
            self.lengths[r] += len(path)
        for layer in self.cache.layers:
            device = layer.keys.device
            r, s, d = (torch.tensor(x, dtype=torch.long, device=device) for x in (rows, source, destination))
            layer.keys[r, :, d] = layer.keys[r, :, s]  # [K, H, D] gathered, then scattered
            layer.values[r, :, d] = layer.values[r, :, s]
        self._cut()

    def _cut(self) -> None:
        longest = max(self.lengths, default=0)
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, :longest], layer.values[:, :, :longest]


PLAIN = "plain"  # the kind of an all-plain step, beside the drafters' names


class StepRates:
    """Committed tokens per second of whole batched steps (their draft catch-ups excepted), by batch size and kind:
    all-plain steps, or steps drafted by the requests' draft LMs (``"model"``) or n-gram drafters (``"ngram"``). It
    is the measured check on the shared budget's model of costs: a batch of R requests runs the kind that measured
    the most tokens per second. Plain is measured first (a plain step costs what batched plain decoding costs); a
    drafting kind, while unmeasured, is tried when it did not measure slower than plain at a smaller batch and the
    exploration credit (``exploration`` of the time run, as the controller's) covers its draft LMs' catch-up (its
    first measurement at a batch size, where the shared model predicts it a gain, may also spend that share of the
    batch's plain time to come), and what a drafted step lost against plain steps, its catch-ups included, is paid
    from it; after ``refresh`` steps of one kind in a row the other kinds' figures are dropped and measured again,
    so the check follows the batch's text and its host's speed."""

    def __init__(self, window: int = 16, refresh: int = 64, exploration: float = 0.03) -> None:
        self.window, self.refresh, self.exploration = window, refresh, exploration
        self.steps: dict[tuple[int, str], deque] = {}  # (R, kind) -> (tokens, seconds) of the last steps
        self.runs: dict[int, tuple[str, int]] = {}  # R -> (kind, steps of that kind in a row)
        self.credit = 0.0  # seconds exploration may still lose
        self.measured_once: set[tuple[int, str]] = set()  # (R, kind) measured at least once (TRUSTED steps)

    def add(self, size: int, kind: str, tokens: int, seconds: float, catch_up: float = 0.0) -> None:
        """A step of ``size`` requests and ``kind`` committed ``tokens`` in ``seconds``, plus ``catch_up`` seconds
        of catch-ups."""
        plain = self.rate(size, PLAIN)
        self.credit += self.exploration * (seconds + catch_up)
        if kind != PLAIN and plain is not None:
            self.credit -= max(seconds + catch_up - tokens / plain, 0.0)
        self.steps.setdefault((size, kind), deque(maxlen=self.window)).append((tokens, seconds))
        if len(self.steps[(size, kind)]) >= TRUSTED:
            self.measured_once.add((size, kind))
        last, count = self.runs.get(size, (kind, 0))
        count = count + 1 if last == kind else 1
        if count >= self.refresh:  # what the other kinds measured is old: measure them again
            for other in [key for key in self.steps if key[0] == size and key[1] != kind]:
                del self.steps[other]
            count = 0
        self.runs[size] = (kind, count)

    def rate(self, size: int, kind: str) -> float | None:
        """Tokens per second of the last steps of this kind (None: fewer than ``TRUSTED`` measured)."""
        steps = self.steps.get((size, kind), ())
        return sum(t for t, _ in steps) / sum(s for _, s in steps) if len(steps) >= TRUSTED else None

    def choose(self, size: int, catch_ups: dict[str, float], predicted: set[str] = frozenset(),
               tokens_left: int = 0) -> str:
        """The kind a batch of ``size`` runs next, among plain and the drafting kinds ``catch_ups`` names (with what
        their draft LMs' catch-up would cost now, seconds): plain until measured; then a drafting kind not yet
        measured, in the order given, where it did not measure slower at a smaller batch (more requests only make
        rows dearer and plain tokens cheaper) and the credit covers its catch-up, or, where the shared model predicts
        it a gain (``predicted``) and it was never measured at this size, the credit and the exploration share of the
        batch's plain time to come (``tokens_left`` in all) do; else the fastest measured."""
        rates = {kind: self.rate(size, kind) for kind in [PLAIN, *catch_ups]}
        if rates[PLAIN] is None:
            return PLAIN
        share = self.exploration * tokens_left / rates[PLAIN]  # what exploring the time to come may lose
        for kind, catch_up in catch_ups.items():
            first = kind in predicted and (size, kind) not in self.measured_once  # a first trial, on the model's word
            if rates[kind] is None and self.credit + (share if first else 0.0) > catch_up and \
                    not any(self._slower(smaller, kind) for smaller in range(2, size)):
                return kind
        return max((kind for kind, rate in rates.items() if rate is not None), key=rates.get)

    def _slower(self, size: int, kind: str) -> bool:
        plain, drafted = self.rate(size, PLAIN), self.rate(size, kind)
        return plain is not None and drafted is not None and drafted <= plain


def _pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, L, D] -> [B, H, width, D], zeros after L."""
    extra = width - tensor.shape[-2]
    return torch.nn.functional.pad(tensor, (0, 0, 0, extra)) if extra > 0 else tensor


class _DraftRow:
    """A :class:`~talon_sd.drafters.ModelDrafter`'s draft LM while its request is in a batch: what the drafter uses of
    a :class:`CausalLM` (``device``, ``reset``, ``prefill``, ``cache.length``, ``cache.keep``), on its row of the
    batch's draft cache; its forwards run batched (:meth:`BatchDecoder.step`)."""

    def __init__(self, group: "_DraftGroup", single: CausalLM) -> None:
        self.group, self.single, self.device, self.cache = group, single, single.device, self

    @property
    def row(self) -> int:
        return self.group.rows.index(self)

    @property
    def length(self) -> int:
        return self.group.cache.lengths[self.row]

    def keep(self, start: int, offsets: torch.Tensor) -> None:
        self.group.cache.keep_row(self.row, start, offsets)

    def reset(self) -> None:
        self.group.cache.reset_row(self.row)

    def prefill(self, tokens: torch.Tensor) -> None:  # the prompt's catch-up: alone, then moved into the row
        self.single.prefill(tokens)
        self.group.cache.set_row(self.row, self.single.cache)

    def forward(self, *args, **kwargs):
        raise RuntimeError("a batched draft LM forwards through its batch (BatchDecoder.step)")


class _DraftGroup:
    """The batch's requests whose drafter is a draft LM of one model: their caches, one row each."""

    def __init__(self, lm: CausalLM) -> None:
        self.lm, self.cache, self.rows = lm, BatchedCache(), []


class BatchDecoder:
    """Runs requests that share one target model in lockstep verify steps (module docstring).

    ``add`` prefills a request and puts it in the batch; ``step`` runs one verify step for every request
    and returns what each committed, cut at its stop; a request whose stop condition holds leaves the batch
    (its stats then complete). Draft LMs of one model forward all their requests' frontiers in one batched
    forward per tree layer (the builders run in lockstep, :meth:`~talon_sd.builders.TreeBuilder.grow`); other
    drafters (n-gram, EAGLE-3 heads) run per request. Not thread-safe: one caller drives it."""

    def __init__(self, target: CausalLM) -> None:
        if target.layout.has_sliding:
            raise TalonError(f"{target.role}: sliding-window attention layers are not supported in batched decoding")
        self.target = target
        self.cache = BatchedCache()
        self.requests: list[Request] = []
        self.groups: dict[int, _DraftGroup] = {}  # id(draft model) -> its requests' draft caches
        self.verify_cost = CostCurve()  # rows verified in all -> seconds of the batched target forward
        self.draft_cost = CostCurve()  # rows in a batched draft-LM forward -> seconds
        self.last_sizes: dict[int, int] = {}  # id(request) -> its last tree's size
        self.measured = StepRates()  # committed tokens per second of whole steps, plain against drafted
        self.kind: str | None = None  # what the measured check chose for this step (None: it did not apply)

    def add(self, pipeline: Pipeline, prompt_ids: torch.Tensor, stop: StopCondition, stats: DecodeStats,
            alternate: Pipeline | None = None) -> Request:
        """Prefill a request (its pipeline's target must wrap the batch's model) and add it to the batch; with
        ``alternate`` (:class:`~talon_sd.decoding.Request`: the same request with an n-gram drafter) each step's
        measured check chooses which of the two drafts (:meth:`_share`)."""
        if pipeline.target.model is not self.target.model:
            raise TalonError("pipeline: its target is not the batch's target model")
        drafter = pipeline.drafter
        if isinstance(drafter, ModelDrafter) and drafter.lm.layout.has_sliding:
            raise TalonError("draft: sliding-window attention layers are not supported in batched decoding")
        request = Request(pipeline, stop, stats, alternate)
        request.start(prompt_ids)  # the target's prefill, alone; the draft LM's prompt waits for its first forward
        if isinstance(drafter, ModelDrafter):  # nothing of the batch changed before this point
            if id(drafter.lm.model) not in self.groups:
                self.groups[id(drafter.lm.model)] = _DraftGroup(drafter.lm)
            group = self.groups[id(drafter.lm.model)]
            group.cache.add(KVCache())
            group.rows.append(_DraftRow(group, drafter.lm))
            drafter.lm = group.rows[-1]
        controller = pipeline.controller
        if controller is not None and not self.verify_cost.points() and controller.verify.samples:
            self.verify_cost = CostCurve(prior=controller.verify.medians())  # one request's tree ~ rows in all
            self.draft_cost = CostCurve(prior=controller.draft.medians())
        self.cache.add(pipeline.target.cache)
        self.requests.append(request)
        return request

    def remove(self, request: Request) -> None:
        """Take a request out of the batch (e.g. its client went away); its stats complete."""
        row = self.requests.index(request)
        self.requests.pop(row)
        self.cache.remove(row)
        drafter = _draft_lm_drafter(request)
        if drafter is not None and isinstance(drafter.lm, _DraftRow):
            draft_row = drafter.lm
            draft_row.group.cache.remove(draft_row.row)
            draft_row.group.rows.remove(draft_row)
            drafter.lm = draft_row.single
        request.stats.finish(len(request.stop.tokens))

    def step(self) -> list[tuple[Request, list[int]]]:
        """One verify step for every request: ``(request, tokens it committed, cut at its stop)`` each."""
        requests = list(self.requests)
        step_started = time.perf_counter()
        trees = self._draft(requests)  # each request's own drafter and budget, draft LMs batched
        started = time.perf_counter()
        capture = sorted({layer for request in requests for layer in request.capture})
        queries = [(tree.tokens, self.cache.lengths[r] + tree.depth, tree.visibility(self.cache.lengths[r]))
                   for r, tree in enumerate(trees)]
        output, width = self.cache.forward(self.target, queries, hidden=bool(capture))
        logits = output.logits.float()  # [R, T, V]
        rows = [logits[r, : tree.size] for r, tree in enumerate(trees)]
        acceptances = [request.accept(tree, row) for request, tree, row in zip(requests, trees, rows)]
        verify_seconds = time.perf_counter() - started
        self.verify_cost.add(len(trees) * max(tree.size for tree in trees), verify_seconds)  # rows computed
        self.last_sizes = {id(request): tree.size for request, tree in zip(requests, trees)}
        self.cache.commit(width, [acceptance.path for acceptance in acceptances])
        committed = []
        for r, (request, tree, acceptance) in enumerate(zip(requests, trees, acceptances)):
            features = torch.cat([output.hidden_states[layer][r, : tree.size] for layer in request.capture], -1) \
                if request.capture else None  # [N, H * layers]
            request.commit(tree, rows[r], features, acceptance, verify_seconds)
            kept = []
            for token in acceptance.new_tokens:
                kept.append(token)
                if request.stop.done(token):
                    break
            committed.append((request, kept))
        seconds = time.perf_counter() - step_started
        catch_up = sum(request.forwards.catch_up_seconds or 0.0 for request in requests)  # paid once, priced apart
        if self.kind is not None:  # a kind's rate counts all its steps, root-only trees included
            self.measured.add(len(requests), self.kind, sum(len(acceptance.new_tokens) for acceptance in acceptances),
                              seconds - catch_up, catch_up)
        for request, _ in committed:
            if request.stop.reason is not None:
                self.remove(request)
        return committed

    def _share(self, requests: list[Request]) -> None:
        """Each request's drafter and budget this step. Where two or more requests all have an online budget, the
        batch's measured steps choose (:class:`StepRates`): all plain, or every request drafting with its draft LM
        or with its n-gram drafter (a request's ``alternate``: no draft forward, so in a batch where the draft LM's
        forwards cost more than they save it can still pay). Then, where two or more requests' budgets have learned
        what trees accept, the batch shares one verify budget among them (:func:`share_budget`; their own
        exploration steps are not taken: a probe of one request pads every request's rows), priced by what the
        batch measured: seconds by rows computed (padded, R x the largest), lockstep draft forwards (for draft
        LMs), and for a request that drafts after plain steps its draft LM's catch-up, paid back over the coming
        tokens as its own controller charges it (:meth:`~talon_sd.control.BudgetController.rates`)."""
        if len(requests) > 1 and all(p.controller is not None for r in requests for p in r.pipelines):
            kinds = set.intersection(*({p.drafter.name for p in r.pipelines if p.drafter} for r in requests))
            catch_ups = sorted((sum(r.catch_up_seconds(kind) for r in requests), kind) for kind in kinds)
            cheapest_first = {kind: seconds for seconds, kind in catch_ups}
            predicted = {kind for kind in kinds if self._predicts_gain(requests, kind)}
            left = sum(max(request.stop.max_new_tokens - len(request.stop.tokens), 0) for request in requests)
            self.kind = self.measured.choose(len(requests), cheapest_first, predicted, left)
            if self.kind == PLAIN:  # no request's own choice is asked for
                for request in requests:
                    request.plan = StepPlan(budget=1, reason="choice")
                return
            for request in requests:
                request.use(self.kind)
        else:
            self.kind = None
            for request in requests:
                request.use(None)
        tables = {i: request.pipeline.controller.expected_tokens()
                  for i, request in enumerate(requests) if request.pipeline.controller is not None}
        shared = [i for i, table in tables.items() if len(table) > 1]
        plans = [request.plan_step() for request in requests]
        if len(shared) < 2 or not self.verify_cost.points() or not self.draft_cost.points():
            return
        other_sizes = [plan.budget if plan is not None else self.last_sizes.get(id(request), 1)
                       for i, (request, plan) in enumerate(zip(requests, plans)) if i not in shared]
        draft_lms = any(isinstance(r.pipeline.drafter, ModelDrafter) for r in requests)
        budgets = self._allocation([requests[i] for i in shared], [tables[i] for i in shared], other_sizes, draft_lms)
        for i, budget in zip(shared, budgets):
            requests[i].plan = StepPlan(budget=budget, reason="choice")

    def _allocation(self, requests: list[Request], tables: list[dict[int, float]], other_sizes: list[int],
                    draft_lms: bool) -> list[int]:
        """:func:`share_budget`'s budgets for ``requests`` (their controllers' expected tokens ``tables``) beside
        trees of ``other_sizes``, priced by the batch's measured costs (lockstep draft-LM forwards where
        ``draft_lms``) plus each request's catch-up spread over its horizon (:func:`catch_up_charge`)."""
        controllers = [request.pipeline.controller for request in requests]
        charges = [catch_up_charge(request) for request in requests]  # seconds per committed token, when drafting
        draft_cost = self.draft_cost if draft_lms else None

        def seconds(budgets: list[int]) -> float:
            catch_up = sum(charge * table[budget] for charge, table, budget in zip(charges, tables, budgets)
                           if budget > 1)
            return step_seconds(budgets, controllers, other_sizes, self.verify_cost, draft_cost) + catch_up

        return share_budget(tables, seconds)

    def _predicts_gain(self, requests: list[Request], kind: str) -> bool:
        """Whether :meth:`_allocation` gives some request a tree were every request to draft with ``kind``."""
        if not self.verify_cost.points() or not self.draft_cost.points():
            return False
        running = [request.pipeline.drafter.name if request.pipeline.drafter else None for request in requests]
        for request in requests:
            request.use(kind)
        tables = [request.pipeline.controller.expected_tokens() for request in requests]
        gain = any(budget > 1 for budget in self._allocation(requests, tables, [], kind == ModelDrafter.name))
        for request, name in zip(requests, running):
            request.use(name)
        return gain

    def _draft(self, requests: list[Request]) -> list[DraftTree]:
        """Every request's tree: the builders run in lockstep; each round, the asks of draft LMs of one model
        are one batched forward, the others' are run one by one."""
        started = time.perf_counter()
        self._share(requests)
        growths = [request.begin_draft() for request in requests]
        trees: list[DraftTree | None] = [None] * len(requests)
        answers: dict[int, torch.Tensor | None] = {i: None for i in range(len(requests))}
        while answers:
            asks = {}
            for i, answer in answers.items():
                try:
                    asks[i] = growths[i].send(answer)  # (tree, nodes); the first send(None) starts the coroutine
                except StopIteration as done:
                    trees[i] = done.value
            answers, batched = {}, {}
            for i, (tree, nodes) in asks.items():
                drafter = requests[i].pipeline.drafter
                if isinstance(drafter, ModelDrafter) and isinstance(drafter.lm, _DraftRow):
                    batched.setdefault(id(drafter.lm.group), {})[i] = (tree, nodes)
                else:
                    answers[i] = requests[i].clock.expand(tree, nodes)
            for group_asks in batched.values():
                answers.update(self._draft_forward(requests, group_asks))
        seconds = time.perf_counter() - started
        for request in requests:
            request.end_draft(seconds)
        return trees

    def _draft_forward(self, requests: list[Request], asks: dict) -> dict[int, torch.Tensor]:
        """One batched forward of a draft LM for the asks ``{request index: (tree, nodes)}`` of one group."""
        group = requests[next(iter(asks))].pipeline.drafter.lm.group
        queries: list[RowQueries | None] = [None] * len(group.rows)
        for i, (tree, nodes) in asks.items():
            requests[i].clock.catch_up()  # a prompt's catch-up runs alone, timed apart, then joins the row
            drafter = requests[i].pipeline.drafter
            queries[drafter.lm.row] = drafter.forward_input(tree, nodes)
        started = time.perf_counter()
        output, width = group.cache.forward(group.lm, queries)
        logits = output.logits.float()  # [R, T, V_draft]
        seconds = time.perf_counter() - started
        self.draft_cost.add(len(queries) * max(len(q[0]) for q in queries if q is not None), seconds)
        group.cache.commit(width, [list(range(len(q[0]))) if q is not None else [] for q in queries])
        answers = {}
        for i, (tree, nodes) in asks.items():
            drafter = requests[i].pipeline.drafter
            row = drafter.lm.row
            count = len(queries[row][0])
            answers[i] = drafter.forward_output(nodes, logits[row, :count] if drafter.drafted
                                                else logits[row, count - 1 : count])
            requests[i].clock.record(tree, nodes, seconds)
        return answers


def step_seconds(budgets: list[int], controllers: list, other_sizes: list[int], verify_cost: CostCurve,
                 draft_cost: CostCurve | None) -> float:
    """Expected seconds of a batched step where request i (``controllers[i]``'s) gets ``budgets[i]`` and the rest of
    the batch trees of ``other_sizes``. Rows are padded to the largest tree, so the target computes R x the largest
    rows; the draft LM runs as many lockstep forwards as the request needing most, each over R x the widest
    request's rows of a forward, as each controller saw its budget's trees forward
    (:meth:`talon_sd.control.Value.shape`; ``log2(budget)`` forwards where unseen); ``draft_cost`` None: drafters
    that run no forward."""
    sizes = list(budgets) + list(other_sizes)
    forwards, width = 0.0, 0.0
    for controller, budget in zip(controllers, budgets):
        if budget > 1:
            widths, _ = controller.value.shape(budget)
            count = sum(widths.values())
            forwards = max(forwards, count)
            width = max(width, sum(w * n for w, n in widths.items()) / count)
    draft = forwards * draft_cost(len(sizes) * width) if forwards and draft_cost is not None else 0.0
    return verify_cost(len(sizes) * max(sizes)) + draft


def _draft_lm_drafter(request: Request) -> ModelDrafter | None:
    """The request's draft-LM drafter, whichever pipeline runs now."""
    return next((p.drafter for p in request.pipelines if isinstance(p.drafter, ModelDrafter)), None)


def catch_up_charge(request: Request) -> float:
    """Seconds per committed token that drafting this step adds for ``request``'s draft catch-up: the catch-up's
    seconds spread over the coming tokens (its controller's horizon, or fewer where fewer are left)."""
    left = max(request.stop.max_new_tokens - len(request.stop.tokens), 1)
    return request.catch_up_seconds() / min(left, request.pipeline.controller.settings.horizon)


def decode_batch(target: CausalLM, requests: Iterable[tuple[Pipeline, torch.Tensor, StopCondition, DecodeStats,
                                                           Pipeline | None]]):
    """Decode requests together until all stop: yields ``(index, token)`` in commit order, ``index`` the
    request's place in ``requests``. Each request's tokens are those :func:`talon_sd.decoding.decode` gives it
    alone (module docstring: up to near-ties)."""
    decoder = BatchDecoder(target)
    index = {id(decoder.add(*request)): i for i, request in enumerate(requests)}
    try:
        while decoder.requests:
            for request, tokens in decoder.step():
                for token in tokens:
                    yield index[id(request)], token
    finally:
        for request in list(decoder.requests):
            decoder.remove(request)
