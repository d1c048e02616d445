"""The decoding loop: draft -> build -> verify -> accept -> commit, as one token generator.

Every front end (the Python API, the CLI, the benchmark) consumes :func:`decode`.
Plain autoregressive decoding is the same loop with the ``ar`` builder (a root-only tree, no drafter),
so the baseline and the speculative methods share every line of code but the tree.

Invariant at the top of each step: the target's cache holds every committed token except the last
one, which is the root of the next tree (node 0). The verify forward covers the root and the drafts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .builders import TreeBuilder
from .config import SamplingConfig
from .drafters import Drafter
from .lm import CausalLM
from .stats import DecodeStats
from .verify import accept


@dataclass
class StopCondition:
    """Stops after ``max_new_tokens``, on an EOS id, or when ``text_of(new tokens)`` contains a stop string."""

    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    text_of: Callable[[list[int]], str] | None = None

    def __post_init__(self) -> None:
        self.tokens: list[int] = []

    def done(self, token: int) -> bool:
        """Record one emitted token; True when it must be the last."""
        self.tokens.append(token)
        if len(self.tokens) >= self.max_new_tokens or token in self.eos_token_ids:
            return True
        if self.stop_strings and self.text_of is not None:
            tail = self.text_of(self.tokens[-64:])
            return any(s in tail for s in self.stop_strings)
        return False


@dataclass(frozen=True)
class Pipeline:
    """The parts one generation runs with."""

    target: CausalLM
    drafter: Drafter | None  # None only with the ``ar`` builder
    builder: TreeBuilder
    sampling: SamplingConfig


def decode(pipeline: Pipeline, prompt_ids: torch.Tensor, stop: StopCondition, stats: DecodeStats) -> Iterator[int]:
    """Yield new tokens for ``prompt_ids`` [L >= 1] until ``stop`` says so, never one past the stop
    (even inside an accepted path). ``stats`` is complete once the generator is exhausted or closed."""
    target, drafter, builder, sampling = pipeline.target, pipeline.drafter, pipeline.builder, pipeline.sampling
    seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(7), "little")
    generator = torch.Generator().manual_seed(seed)
    draft_clock = _DraftClock(drafter)
    stats.prompt_tokens = int(prompt_ids.numel())
    stats.started = started = time.perf_counter()
    target.prefill(prompt_ids[:-1])
    if drafter is not None:
        drafter.start(prompt_ids)
    stats.seconds_prefill += time.perf_counter() - started
    root = int(prompt_ids[-1])
    try:
        while True:
            # 1-2. draft and build the tree (the builder calls the drafter once per layer)
            started = time.perf_counter()
            tree = builder.build(root, draft_clock.expand, target.device)
            draft_seconds, draft_forwards = draft_clock.take()
            stats.seconds_draft += draft_seconds
            stats.seconds_build += time.perf_counter() - started - draft_seconds
            # 3. verify: one target forward over the whole tree, then the acceptance rule
            started = time.perf_counter()
            acceptance = accept(tree, target.forward_tree(tree), sampling, generator)
            stats.seconds_verify += time.perf_counter() - started
            # 4. commit: keep the root and the accepted path in both caches (one gather each)
            target.cache.keep(target.cache.length - tree.size, torch.tensor(acceptance.path))
            if drafter is not None:
                drafter.accept(acceptance.new_tokens)
            stats.observe(tree, acceptance, draft_forwards)
            # 5. emit, stopping inside the path if needed
            for token in acceptance.new_tokens:
                yield token
                if stop.done(token):
                    return
            root = acceptance.bonus_token
    finally:
        stats.finish(len(stop.tokens))


class _DraftClock:
    """Wraps ``drafter.expand`` to count draft forwards and their wall time for the stats."""

    def __init__(self, drafter: Drafter | None) -> None:
        self.drafter, self.calls, self.seconds = drafter, 0, 0.0

    def expand(self, tree, nodes):
        started = time.perf_counter()
        log_p_draft = self.drafter.expand(tree, nodes)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return log_p_draft

    def take(self) -> tuple[float, int]:
        """(seconds, forwards) since the last take."""
        taken = (self.seconds, self.calls)
        self.seconds, self.calls = 0.0, 0
        return taken
