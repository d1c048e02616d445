"""Measurements for ``talon tune``: forward costs of the target and the draft, and calibration runs.

* :func:`measure_forward_costs` times one forward over ``T`` new tokens on a cache of ``context``
  tokens (median of ``repeats``, after one untimed warm-up per size; sizes interleaved inside each
  repeat so that drift spreads over all of them). The target is timed as in verification (a tree
  mask, logits for every node); the draft as in a tree expansion (logits + log-softmax for every
  node) and, for the first forward of a step, as the root expansion (``last_only`` logits).
* :func:`calibrate` runs the real decoding loop (:func:`talon_sd.decoding.decode`) for one tree
  configuration on a few prompts, greedy or sampled (prompt i with seed + i, so every configuration
  sees the same random streams), and returns an :class:`~talon_sd.bench.tune.AcceptancePoint`:
  MAT, the distribution of tree sizes, the widths of the draft forwards (recorded by wrapping the
  drafter) and the measured per-step overhead.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Callable, Sequence

import torch

from ..builders import make_builder
from ..config import SamplingConfig, TreeConfig
from ..decoding import Pipeline, StopCondition, decode
from ..drafters import Drafter, ModelDrafter
from ..lm import CausalLM
from ..stats import DecodeStats
from ..tree import DraftTree
from .tune import AcceptancePoint

Tick = Callable[[], None]


def _bushy_tree(size: int, vocab_size: int, device) -> DraftTree:
    """A 4-ary tree of ``size`` nodes (the cost of a forward depends on the node count, not the shape)."""
    index = torch.arange(size, device=device)
    parents = torch.where(index > 0, (index - 1) // 4, torch.full_like(index, -1))
    depth = torch.zeros(size, dtype=torch.long, device=device)
    for i in range(1, size):
        depth[i] = depth[parents[i]] + 1
    tokens = (index * 13 + 5) % vocab_size
    return DraftTree(tokens, parents, depth, torch.zeros(size, device=device))


def _context_ids(lm: CausalLM, context: int, largest: int) -> torch.Tensor:
    length = max(1, min(context, lm.max_positions - largest - 2))
    generator = torch.Generator().manual_seed(0)
    return torch.randint(3, lm.vocab_size, (length,), generator=generator)


@torch.inference_mode()
def measure_forward_costs(lm: CausalLM, sizes: Sequence[int], role: str, context: int = 200, repeats: int = 5,
                          tick: Tick | None = None) -> dict[int, float]:
    """Median seconds of one forward over each size in ``sizes``; ``role`` is ``verify``, ``draft`` or ``draft_root``.

    verify      target forward over a tree of T nodes, logits for every node (as in verification)
    draft       draft forward over w frontier nodes + log-softmax of every row (a tree expansion)
    draft_root  draft forward over w committed tokens, last logits only + log-softmax (a step's first expansion)
    ``tick`` is called after every timed forward (progress bars).
    """
    if role not in ("verify", "draft", "draft_root"):
        raise ValueError(f"role must be verify, draft or draft_root, got {role!r}")
    sizes = sorted(set(int(s) for s in sizes))
    ids = _context_ids(lm, context, max(sizes))
    lm.prefill(ids)
    past = lm.cache.length
    timings: dict[int, list[float]] = {size: [] for size in sizes}
    for repeat in range(repeats + 1):  # repeat 0 is the untimed warm-up
        for size in sizes:
            started = time.perf_counter()
            _one_forward(lm, size, role, past)
            seconds = time.perf_counter() - started
            lm.cache.crop(past)
            if repeat:
                timings[size].append(seconds)
                if tick:
                    tick()
    lm.reset()
    return {size: statistics.median(values) for size, values in timings.items()}


def _one_forward(lm: CausalLM, size: int, role: str, past: int) -> None:
    if role == "verify":
        lm.forward_tree(_bushy_tree(size, lm.vocab_size, lm.device))
        return
    tokens = (torch.arange(size) * 13 + 5) % lm.vocab_size
    if role == "draft_root":
        torch.log_softmax(lm.forward(tokens, last_only=True), dim=-1)
        return
    visible = torch.cat([torch.ones(size, past, dtype=torch.bool), torch.eye(size, dtype=torch.bool)], dim=1)
    positions = torch.full((size,), past, dtype=torch.long)
    torch.log_softmax(lm.forward(tokens, positions, visible), dim=-1)


class RecordingDrafter(Drafter):
    """Delegates to a drafter and records the width of every draft forward (root ones apart)."""

    name = "recording"

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.root_widths: Counter = Counter()  # pending committed tokens forwarded with the root -> count
        self.widths: Counter = Counter()  # frontier size of the later expansions -> count
        self.first = True

    def start(self, prompt_ids, features=None):
        self.inner.start(prompt_ids, features)

    def begin_step(self, root_token):
        self.inner.begin_step(root_token)
        self.first = True

    def expand(self, tree, nodes):
        if self.first:  # the root expansion forwards every committed token not yet in the draft cache
            self.root_widths[len(getattr(self.inner, "pending", ())) or 1] += 1
            self.first = False
        else:
            self.widths[int(nodes.numel())] += 1
        return self.inner.expand(tree, nodes)

    def accept(self, tree, acceptance, features=None):
        self.inner.accept(tree, acceptance, features)


def calibrate(generator, tree: TreeConfig, prompts: Sequence[torch.Tensor], max_new_tokens: int,
              temperature: float = 0.0, seed: int = 0) -> AcceptancePoint:
    """Decoding of ``prompts`` (token ids [L] each) with ``tree``, greedy at ``temperature`` 0, else
    sampled (prompt i with ``seed + i``); pooled stats as an AcceptancePoint."""
    steps = committed = new_tokens = 0
    decode_seconds = overhead_seconds = 0.0
    sizes: Counter = Counter()
    recorder = None
    for index, ids in enumerate(prompts):
        sampling = SamplingConfig(do_sample=temperature > 0, temperature=temperature or 1.0, seed=seed + index)
        drafter = None
        if tree.method != "ar":
            recorder = RecordingDrafter(ModelDrafter(generator.draft, target_vocab_size=generator.target.vocab_size)) if recorder is None else recorder
            drafter = recorder
        room = generator.target.max_positions - int(ids.numel()) - tree.budget
        stop = StopCondition(max_new_tokens=max(1, min(max_new_tokens, room)), eos_token_ids=generator.eos_token_ids)
        stats = DecodeStats(method=tree.label)
        pipeline = Pipeline(generator.target, drafter, make_builder(tree), sampling)
        for _ in decode(pipeline, ids, stop, stats):
            pass
        steps += stats.target_forwards
        committed += stats.committed
        new_tokens += stats.new_tokens
        sizes.update(stats.tree_sizes)
        loop_seconds = stats.seconds_total - stats.seconds_prefill
        decode_seconds += loop_seconds
        overhead_seconds += loop_seconds - stats.seconds_draft - stats.seconds_verify
    steps = max(steps, 1)
    options = {name: getattr(tree, name) for name in ("budget", "topk", "mu", "depth")}
    return AcceptancePoint(
        method=tree.method,
        options=options,
        mat=committed / steps,
        tree_sizes={size: count / steps for size, count in sorted(sizes.items())},
        draft_widths={w: n / steps for w, n in sorted(recorder.widths.items())} if recorder else {},
        root_widths={w: n / steps for w, n in sorted(recorder.root_widths.items())} if recorder else {},
        overhead_seconds=overhead_seconds / steps,
        measured_tokens_per_s=new_tokens / decode_seconds if decode_seconds > 0 else None,
    )
