"""Prompt lookup: the n-gram drafter (no model)."""

from __future__ import annotations

import torch

from .base import Drafter


class NgramDrafter(Drafter):
    """Propose what followed the same n-gram earlier in the prompt or the output.

    For a node whose context (committed tokens then its path) ends in an n-gram seen before, the
    draft distribution is the count of each token that followed that n-gram, normalised; the longest
    n in ``[min_ngram, max_ngram]`` with a match wins. No match: every log-probability is ``-inf``
    and the builders add no child there. Costs no model forward.
    """

    name = "ngram"
    follows_confidence = False  # a match does not depend on how sure the target is

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.vocab_size, self.max_ngram, self.min_ngram = vocab_size, max_ngram, min_ngram
        self.history = torch.zeros(0, dtype=torch.long)  # [committed tokens]

    def start(self, prompt_ids, features=None):
        self.history = prompt_ids.detach().cpu().to(torch.long)

    def begin_step(self, root_token):
        pass  # the root is already the last entry of the history

    def accept(self, tree, acceptance, features=None):
        self.history = torch.cat([self.history, torch.tensor(acceptance.new_tokens, dtype=torch.long)])

    def expand(self, tree, nodes):
        log_p_draft = torch.full((len(nodes), self.vocab_size), float("-inf"))  # [F, V]
        tokens = tree.tokens.tolist()
        for row, node in enumerate(nodes.tolist()):
            path_tokens = [tokens[i] for i in tree.path_to(node)[1:]]  # the root is history[-1]
            context = torch.cat([self.history, torch.tensor(path_tokens, dtype=torch.long)])
            counts = self._continuations(context)
            if counts is not None:
                found, number = counts
                keep = found < self.vocab_size
                log_p_draft[row, found[keep]] = torch.log(number[keep] / number.sum())
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
