"""Drafters: where the draft distributions come from.

A drafter answers one question for the tree builder, layer by layer:

    expand(tree, nodes) -> log_p_draft  # [F, V]: log P_draft(next token | root-to-node path), F = len(nodes)

and is told what was committed after each verification:

    start(prompt_ids)      new generation; the last prompt token is the first root
    accept(new_tokens)     the tokens committed by the last step (accepted drafts + bonus token)

The first ``expand`` of a step is always ``nodes = [0]`` on the root-only tree. Registered in
:data:`DRAFTERS`: ``model`` (an independent draft LM sharing the target's vocabulary) and ``ngram``
(prompt lookup, no model). An EAGLE-3 head would be one more class here; builders and the verifier
only see ``expand``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from .lm import CausalLM
from .tree import DraftTree


class Drafter(ABC):
    """Source of draft distributions for the tree builders."""

    name: ClassVar[str]

    @abstractmethod
    def start(self, prompt_ids: torch.Tensor) -> None:
        """Begin a generation for ``prompt_ids`` [L]; ``prompt_ids[-1]`` is the first root."""

    @abstractmethod
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[F, V]`` of the children of ``nodes`` [F] of ``tree`` (one draft forward)."""

    @abstractmethod
    def accept(self, new_tokens: list[int]) -> None:
        """The last step committed ``new_tokens`` (accepted drafts then the bonus token)."""


class ModelDrafter(Drafter):
    """An independent draft LM that shares the target's vocabulary.

    Cache layout while drafting one step::

        [ committed prefix, root included | forwarded tree nodes, in the order they were expanded ]

    Each ``expand`` is one batched forward over the new frontier with a tree mask (every node sees
    the prefix and its own ancestors). ``accept`` keeps the forwarded nodes on the accepted path
    (one gather) and queues the rest of the committed tokens, forwarded with the next root expansion:
    the prefix is never re-prefilled.
    """

    name = "model"

    def __init__(self, model) -> None:
        self.lm = model if isinstance(model, CausalLM) else CausalLM(model)
        self.pending: list[int] = []
        self.tree: DraftTree | None = None
        self.slot_nodes: list[int] = []  # tree node held in each cache row after the prefix
        self.prefix_length = 0

    def start(self, prompt_ids):
        self.lm.prefill(prompt_ids[:-1])
        self.pending = [int(prompt_ids[-1])]
        self.tree, self.slot_nodes = None, []

    def expand(self, tree, nodes):
        device = self.lm.device
        if tree.size == 1:  # the root: forward the committed tokens not yet in the cache
            logits = self.lm.forward(torch.tensor(self.pending, device=device), last_only=True)  # [1, V]
            self.pending, self.slot_nodes = [], []
            self.prefix_length = self.lm.cache.length
        else:
            slots = torch.tensor(self.slot_nodes + nodes.tolist(), device=tree.tokens.device)
            visible_tree = tree.ancestors[nodes][:, slots]  # [F, forwarded + F]
            prefix = torch.ones(len(nodes), self.prefix_length, dtype=torch.bool, device=visible_tree.device)
            visible = torch.cat([prefix, visible_tree], 1)  # [F, prefix + forwarded + F]
            positions = self.prefix_length - 1 + tree.depth[nodes]
            logits = self.lm.forward(tree.tokens[nodes], positions, visible)  # [F, V]
            self.slot_nodes.extend(nodes.tolist())
        self.tree = tree
        return torch.log_softmax(logits, dim=-1)

    def accept(self, new_tokens):
        kept_slots: list[int] = []
        if self.tree is not None and self.slot_nodes:
            slot_of = {node: slot for slot, node in enumerate(self.slot_nodes)}
            children = self.tree.children
            tokens = self.tree.tokens.tolist()
            node = 0
            for token in new_tokens[:-1]:  # the new root is always forwarded next step: its logits are needed
                node = next((c for c in children[node] if tokens[c] == token), -1)
                if node < 0 or node not in slot_of:
                    break
                kept_slots.append(slot_of[node])
        self.lm.cache.keep(self.prefix_length, torch.tensor(kept_slots, dtype=torch.long))
        self.pending = list(new_tokens[len(kept_slots):])
        self.tree, self.slot_nodes = None, []


class NgramDrafter(Drafter):
    """Prompt lookup: propose what followed the same n-gram earlier in the prompt or the output.

    For a node whose context (committed tokens then its path) ends in an n-gram seen before, the
    draft distribution is the count of each token that followed that n-gram, normalised; the longest
    n in ``[min_ngram, max_ngram]`` with a match wins. No match: every log-probability is ``-inf``
    and the builders add no child there. Costs no model forward.
    """

    name = "ngram"

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.vocab_size, self.max_ngram, self.min_ngram = vocab_size, max_ngram, min_ngram
        self.history = torch.zeros(0, dtype=torch.long)

    def start(self, prompt_ids):
        self.history = prompt_ids.detach().cpu().to(torch.long)

    def accept(self, new_tokens):
        self.history = torch.cat([self.history, torch.tensor(new_tokens, dtype=torch.long)])

    def expand(self, tree, nodes):
        log_p_draft = torch.full((len(nodes), self.vocab_size), float("-inf"))
        tokens = tree.tokens.tolist()
        for row, node in enumerate(nodes.tolist()):
            path_tokens = [tokens[i] for i in tree.path_to(node)[1:]]  # the root is history[-1]
            context = torch.cat([self.history, torch.tensor(path_tokens, dtype=torch.long)])
            counts = self._continuations(context)
            if counts is not None:
                found, number = counts
                log_p_draft[row, found] = torch.log(number / number.sum())
        return log_p_draft.to(tree.tokens.device)

    def _continuations(self, context: torch.Tensor):
        """(tokens, counts) that followed the longest matching suffix n-gram of ``context`` in history."""
        history = self.history
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if context.numel() < n or history.numel() <= n:
                continue
            windows = history.unfold(0, n, 1)[:-1]  # [L - n, n]: n-grams that have a next token
            starts = (windows == context[-n:]).all(dim=1).nonzero().flatten()
            if starts.numel():
                found, number = history[starts + n].unique(return_counts=True)
                return found, number.float()
        return None


DRAFTERS: dict[str, type[Drafter]] = {drafter.name: drafter for drafter in (ModelDrafter, NgramDrafter)}
