"""Several requests verified in one target forward: a padded batch of KV caches and the step loop over it.

Each request keeps its own drafter, builder, sampling, budget controller and stop condition (a
:class:`talon_sd.decoding.Request`); what the batch shares is the target: every step, one forward verifies
all the requests' trees (a plain step is a root-only tree), each tree seeing only its own request's cache
row and its own ancestors. Requests join (:meth:`BatchDecoder.add`) and leave (when their stop condition
holds, or :meth:`BatchDecoder.remove`) between steps. The TALON paper (arXiv 2601.07353) leaves batch > 1 open;
here each request's tree is still its own budget's (a verify budget shared across requests,
:func:`talon_sd.control.share_budget`, and batched draft forwards are the next steps).

Cache layout (:class:`BatchedCache`), ``width`` columns, row r one request::

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
from typing import Iterable

import torch
from transformers import DynamicCache

from .decoding import Pipeline, Request, StopCondition
from .errors import TalonError
from .lm import CausalLM, KVCache, _cache_keyword
from .stats import DecodeStats
from .tree import DraftTree


class BatchedCache:
    """The target's KV cache of R requests, one row each (module docstring): ``lengths[r]`` committed columns."""

    def __init__(self) -> None:
        self.cache = DynamicCache()
        self.lengths: list[int] = []

    @property
    def width(self) -> int:
        return self.cache.get_seq_length() if self.cache.layers else 0

    @torch.inference_mode()
    def add(self, single: KVCache) -> None:
        """Append a request whose prompt is in ``single`` (a one-request cache, which is left empty)."""
        length, theirs = single.length, single.cache.layers if single.length else []
        if self.lengths and self.cache.layers and theirs:
            width = max(self.width, length)
            for mine, other in zip(self.cache.layers, theirs):
                mine.keys = torch.cat([_pad(mine.keys, width), _pad(other.keys, width)])
                mine.values = torch.cat([_pad(mine.values, width), _pad(other.values, width)])
        elif theirs and not self.lengths:
            self.cache = single.cache
        elif theirs:  # the rows so far hold no token yet (one-token prompts): zero rows beside the new one
            for other in theirs:
                other.keys = torch.cat([other.keys.new_zeros((len(self.lengths),) + other.keys.shape[1:]), other.keys])
                other.values = torch.cat([other.values.new_zeros((len(self.lengths),) + other.values.shape[1:]),
                                          other.values])
            self.cache = single.cache
        elif self.cache.layers:  # a one-token prompt beside rows that hold tokens
            for mine in self.cache.layers:
                mine.keys = torch.cat([mine.keys, mine.keys.new_zeros((1,) + mine.keys.shape[1:])])
                mine.values = torch.cat([mine.values, mine.values.new_zeros((1,) + mine.values.shape[1:])])
        self.lengths.append(length)
        single.reset()

    @torch.inference_mode()
    def remove(self, row: int) -> None:
        """Drop request ``row``; the rows after it move up one."""
        keep = torch.tensor([r for r in range(len(self.lengths)) if r != row], dtype=torch.long)
        self.lengths.pop(row)
        for layer in self.cache.layers:
            index = keep.to(layer.keys.device)
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self._cut()

    def mask_and_positions(self, trees: list[DraftTree], dtype: torch.dtype, device) -> tuple[torch.Tensor, ...]:
        """(tokens [R, T], positions [R, T], additive mask [R, 1, T, width + T]) for one tree per row."""
        rows, size, width = len(trees), max(tree.size for tree in trees), self.width
        tokens = torch.zeros(rows, size, dtype=torch.long)
        positions = torch.tensor(self.lengths, dtype=torch.long)[:, None].repeat(1, size)  # [R, T]
        visible = torch.zeros(rows, size, width + size, dtype=torch.bool)
        padding = torch.arange(size)
        visible[:, padding, width + padding] = True  # every query sees itself (padding queries nothing else)
        for r, tree in enumerate(trees):
            n = tree.size
            tokens[r, :n] = tree.tokens.cpu()
            positions[r, :n] += tree.depth.cpu()
            visible[r, :n, : self.lengths[r]] = True
            visible[r, :n, width : width + n] = tree.ancestors.cpu()
        mask = torch.zeros(visible.shape, dtype=dtype)
        mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return tokens.to(device), positions.to(device), mask[:, None].to(device)

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


def _pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """[B, H, L, D] -> [B, H, width, D], zeros after L."""
    extra = width - tensor.shape[-2]
    return torch.nn.functional.pad(tensor, (0, 0, 0, extra)) if extra > 0 else tensor


class BatchDecoder:
    """Runs requests that share one target model in lockstep verify steps (module docstring).

    ``add`` prefills a request and puts it in the batch; ``step`` runs one verify step for every request
    and returns what each committed, cut at its stop; a request whose stop condition holds leaves the batch
    (its stats then complete). Not thread-safe: one caller drives it."""

    def __init__(self, target: CausalLM) -> None:
        if target.layout.has_sliding:
            raise TalonError(f"{target.role}: sliding-window attention layers are not supported in batched decoding")
        self.target = target
        self.cache = BatchedCache()
        self.requests: list[Request] = []

    def add(self, pipeline: Pipeline, prompt_ids: torch.Tensor, stop: StopCondition, stats: DecodeStats) -> Request:
        """Prefill a request (its pipeline's target must wrap the batch's model) and add it to the batch."""
        if pipeline.target.model is not self.target.model:
            raise TalonError("pipeline: its target is not the batch's target model")
        request = Request(pipeline, stop, stats)
        request.start(prompt_ids)
        self.cache.add(pipeline.target.cache)
        self.requests.append(request)
        return request

    def remove(self, request: Request) -> None:
        """Take a request out of the batch (e.g. its client went away); its stats complete."""
        row = self.requests.index(request)
        self.requests.pop(row)
        self.cache.remove(row)
        request.stats.finish(len(request.stop.tokens))

    def step(self) -> list[tuple[Request, list[int]]]:
        """One verify step for every request: ``(request, tokens it committed, cut at its stop)`` each."""
        requests = list(self.requests)
        trees = [request.draft() for request in requests]  # each request's own drafter and budget
        started = time.perf_counter()
        width = self.cache.width
        capture = sorted({layer for request in requests for layer in request.capture})
        tokens, positions, mask = self.cache.mask_and_positions(trees, self.target.dtype, self.target.device)
        with torch.inference_mode():
            output = self.target.model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                                       **{_cache_keyword(self.target.model): self.cache.cache}, use_cache=True,
                                       output_hidden_states=bool(capture))
        logits = output.logits.float()  # [R, T, V]
        rows = [logits[r, : tree.size] for r, tree in enumerate(trees)]
        acceptances = [request.accept(tree, row) for request, tree, row in zip(requests, trees, rows)]
        verify_seconds = time.perf_counter() - started
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
        for request, _ in committed:
            if request.stop.reason is not None:
                self.remove(request)
        return committed


def decode_batch(target: CausalLM, requests: Iterable[tuple[Pipeline, torch.Tensor, StopCondition, DecodeStats]]):
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
