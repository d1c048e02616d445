"""An independent draft LM as the drafter."""

from __future__ import annotations

import torch

from ..lm import CausalLM
from .base import Drafter


class ModelDrafter(Drafter):
    """An independent draft LM that shares the target's tokenizer.

    Cache layout while drafting one step::

        [ committed prefix, root included | forwarded tree nodes, in the order they were expanded ]

    ``start`` only resets the cache: the prompt is prefilled by the generation's first ``catch_up`` or ``expand`` (an
    online budget that runs plain steps only, on hardware where drafting does not pay, never pays the
    draft's prefill either). The first ``expand`` of a step forwards the committed tokens not yet in the cache (the root,
    plus any accepted tokens that were never forwarded, plus every token of steps that drafted
    nothing) and returns the root's distribution; each later ``expand`` is one batched forward over
    the new frontier with a tree mask (every node sees the prefix and its own ancestors). ``accept``
    keeps the forwarded nodes on the accepted path (one gather) and queues the rest of the committed
    tokens for the next step: the prefix is never re-prefilled.

    ``target_vocab_size``: the draft's logits are cut or padded to the target's vocabulary before the
    softmax, so a draft with a larger embedding never proposes an id the target cannot score.
    """

    name = "model"

    def __init__(self, model, target_vocab_size: int | None = None) -> None:
        self.lm = model if isinstance(model, CausalLM) else CausalLM(model, role="draft")
        self.vocab_size = target_vocab_size or self.lm.vocab_size
        self.pending: list[int] = []  # committed tokens not yet in the draft cache (the root last)
        self.slot_nodes: list[int] = []  # tree node held in each cache row after the prefix
        self.prefix_length = 0  # cache rows of committed tokens during this step
        self.drafted = False  # whether this step ran an expand
        self.prefilled = False  # whether the prompt is in the cache (done lazily by the first catch_up or expand)
        self.undrafted = 0  # committed tokens since the last drafted step (the prompt's, then plain steps')

    def start(self, prompt_ids, features=None):
        self.lm.reset()  # the prompt is forwarded at the first expand: a generation of plain steps never pays for it
        self.pending = [int(token) for token in prompt_ids.tolist()]
        self.prefilled = False
        self.slot_nodes, self.drafted = [], False
        self.undrafted = len(self.pending) - 1

    @property
    def catch_up_tokens(self) -> int:
        return self.undrafted

    @property
    def linear_weights(self) -> int:
        return self.lm.linear_weights

    def begin_step(self, root_token):
        if not self.pending or self.pending[-1] != int(root_token):
            raise RuntimeError("ModelDrafter: the step's root is not the last committed token")
        self.slot_nodes, self.drafted = [], False

    def catch_up(self):
        if self.prefilled or self.drafted:
            return False
        prefix = self.pending[:-1]  # the prompt (and plain steps' tokens) before the root; empty for a 1-token prompt
        self.lm.prefill(torch.tensor(prefix, dtype=torch.long))  # decoder stack only
        self.pending, self.prefilled, self.undrafted = self.pending[-1:], True, 0
        return bool(prefix)

    def expand(self, tree, nodes):
        tokens, positions, visible = self.forward_input(tree, nodes)
        logits = self.lm.forward(tokens, positions, visible, last_only=not self.drafted)  # [F or 1, V_draft]
        return self.forward_output(nodes, logits)

    def forward_input(self, tree, nodes) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What :meth:`expand`'s draft forward takes: (tokens [F], positions [F] or None to continue the cache,
        visible [F, cache + F] or None for causal), the cache then holding :attr:`lm`'s rows; the step's first
        forward (the committed tokens not in the cache yet, root last; only its last row's logits count) runs the
        prompt's catch-up first if not done. A batch runs these forwards for several drafters at once."""
        if not self.drafted:  # first forward of the step: the committed tokens not in the cache yet, root last
            if nodes.tolist() != [0]:
                raise RuntimeError("ModelDrafter: the first expand of a step must be the root")
            self.catch_up()  # the generation's first draft forward: the prompt, decoder stack only (if not done yet)
            return torch.tensor(self.pending, device=self.lm.device), None, None
        slots = torch.tensor(self.slot_nodes + nodes.tolist(), device=tree.tokens.device)
        visible_tree = tree.ancestors[nodes][:, slots]  # [F, forwarded + F]
        prefix = torch.ones(len(nodes), self.prefix_length, dtype=torch.bool, device=visible_tree.device)
        visible = torch.cat([prefix, visible_tree], 1)  # [F, prefix + forwarded + F]
        return tree.tokens[nodes], self.prefix_length - 1 + tree.depth[nodes], visible

    def forward_output(self, nodes, logits: torch.Tensor) -> torch.Tensor:
        """:meth:`expand`'s result from the forward's logits ``[F, V_draft]`` (the step's first: ``[1, V_draft]``,
        the last row's), the forward's rows now in :attr:`lm`'s cache."""
        if not self.drafted:
            self.pending, self.drafted = [], True
            self.prefix_length = self.lm.cache.length
        else:
            self.slot_nodes.extend(nodes.tolist())
        return torch.log_softmax(self._to_target_vocab(logits), dim=-1)  # [F, V_target]

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[F, V_draft] -> [F, V_target]: ids past the draft's rows get -inf, rows past the target's are cut."""
        extra = self.vocab_size - logits.shape[-1]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits[:, : self.vocab_size]

    def accept(self, tree, acceptance, features=None):
        if not self.drafted:  # nothing was forwarded this step: every committed token waits for the next one
            self.pending.extend(acceptance.new_tokens)
            self.undrafted += len(acceptance.new_tokens)
            return
        self.undrafted = 0
        slot_of = {node: slot for slot, node in enumerate(self.slot_nodes)}
        kept_slots: list[int] = []
        for node in acceptance.path[1:]:  # forwarded accepted nodes keep their rows, until the first that was not
            if node not in slot_of:
                break
            kept_slots.append(slot_of[node])
        self.lm.cache.keep(self.prefix_length, torch.tensor(kept_slots, dtype=torch.long))
        self.pending = list(acceptance.new_tokens[len(kept_slots):])
        self.slot_nodes, self.drafted = [], False
