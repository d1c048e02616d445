"""An EAGLE-3 head as the drafter (head module and checkpoint format: :mod:`talon_sd.eagle3`)."""

from __future__ import annotations

import torch

from ..eagle3 import Eagle3Head, attention_bias
from ..lm import linear_weights
from .base import Drafter


class Eagle3Drafter(Drafter):
    """Drafts with an EAGLE-3 head over the target's own hidden states.

    Alignment: the committed token x_t's target feature f_t ``[3H_t]`` and the next token x_{t+1} make
    head row t (position t), which predicts x_{t+2}. With committed tokens x_0 .. x_{n-1} (root
    x_{n-1}), the head's cache holds rows 0 .. n-2; the last one, (f_{n-2}, root), is the root
    expansion and gives the root's children. A tree node at depth d >= 1 is a row at position
    n - 2 + d whose input is its parent's output hidden state (not a target feature) and its own token::

        head cache: [ rows (f_t, x_{t+1}) for t <= n-2 | tree rows, in expansion order ]

    ``accept`` drops the tree rows and queues (f_v, next committed token) for every node v of the
    accepted path (features from the verify forward that already ran); they are forwarded, causally,
    with the next root expansion. Steps that draft nothing only queue rows. Draft ids map to target ids
    through ``d2t``; the distribution is returned over the target vocabulary (-inf off the draft vocabulary).
    """

    name = "eagle3"

    def __init__(self, head: Eagle3Head) -> None:
        self.head = head
        self.feature_layers = tuple(head.config.aux_layers)  # instance value of the protocol's ClassVar
        self.vocab_size = head.config.vocab_size
        self.target_ids = head.target_ids()  # [Vd]
        self.reset()

    def reset(self) -> None:
        self.keys = self.values = None  # [kv_heads, rows, d]
        self.pending_features: list[torch.Tensor] = []  # [*, 3H_t] each
        self.pending_tokens: list[int] = []
        self.prefix_length = 0  # committed rows in the cache during a step
        self.slot_nodes: list[int] = []  # tree node of each tree row
        self.hidden_of: dict[int, torch.Tensor] = {}  # node -> its output hidden state [H]
        self.drafted = False
        self.undrafted = 0  # committed tokens since the last drafted step (the prompt's, then plain steps')

    @property
    def catch_up_tokens(self) -> int:
        return self.undrafted

    @property
    def linear_weights(self) -> int:
        return linear_weights(self.head)

    @property
    def cache_length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[1])

    def start(self, prompt_ids, features=None):
        if features is None or features.shape[0] != prompt_ids.numel() - 1:
            raise ValueError("Eagle3Drafter.start needs the target features of prompt_ids[:-1]")
        self.reset()
        self.pending_features = [features]
        self.pending_tokens = [int(t) for t in prompt_ids[1:].tolist()]
        self.undrafted = len(self.pending_tokens)

    def begin_step(self, root_token):
        if self.pending_tokens and self.pending_tokens[-1] != int(root_token):
            raise RuntimeError("Eagle3Drafter: the step's root is not the last committed token")
        self.slot_nodes, self.hidden_of, self.drafted = [], {}, False

    @torch.inference_mode()
    def expand(self, tree, nodes):
        head = self.head
        device = head.fc.weight.device
        if not self.drafted:  # the committed rows not in the cache yet; the last one is the root expansion
            if nodes.tolist() != [0]:
                raise RuntimeError("Eagle3Drafter: the first expand of a step must be the root")
            if not self.pending_tokens:  # a one-token prompt: no target feature precedes the root yet
                return torch.full((1, self.vocab_size), float("-inf"), device=tree.tokens.device)
            features = torch.cat(self.pending_features).to(device)  # [P, 3H_t]
            tokens = torch.tensor(self.pending_tokens, device=device)
            start = self.cache_length
            positions = torch.arange(start, start + tokens.numel(), device=device)
            visible = torch.ones(tokens.numel(), start + tokens.numel(), dtype=torch.bool, device=device).tril(start)
            hidden = self._step(head.project(features), tokens, positions, visible)  # [P, H]
            self.pending_features, self.pending_tokens, self.drafted = [], [], True
            self.prefix_length = self.cache_length
            self.hidden_of = {0: hidden[-1]}
            rows = hidden[-1:]
        else:
            node_list = nodes.tolist()
            parents = tree.parents[nodes].tolist()
            inputs = torch.stack([self.hidden_of[p] for p in parents])  # [F, H]
            slots = torch.tensor(self.slot_nodes + node_list, device=tree.tokens.device)
            visible_tree = tree.ancestors[nodes][:, slots].to(device)  # [F, forwarded + F]
            prefix = torch.ones(len(node_list), self.prefix_length, dtype=torch.bool, device=device)
            positions = (self.prefix_length - 1 + tree.depth[nodes]).to(device)
            rows = self._step(inputs, tree.tokens[nodes].to(device), positions, torch.cat([prefix, visible_tree], 1))
            self.slot_nodes.extend(node_list)
            self.hidden_of.update(zip(node_list, rows))
        log_p = torch.log_softmax(head.draft_logits(rows), dim=-1)  # [F, Vd]
        log_p_draft = torch.full((rows.shape[0], self.vocab_size), float("-inf"), device=log_p.device)
        log_p_draft[:, self.target_ids.to(log_p.device)] = log_p
        return log_p_draft  # [F, V_target]

    def _step(self, hidden, tokens, positions, visible):
        """One head step for rows ``hidden`` [T, H]: append their keys/values, attend with ``visible``
        [T, cache + T], return the output hidden states [T, H]."""
        q, k, v = self.head.qkv(hidden, tokens, positions)
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=1)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=1)
        attended = self.head.attend(q, self.keys, self.values, attention_bias(visible))
        return self.head.finish(hidden, attended)

    def accept(self, tree, acceptance, features=None):
        if features is None or features.shape[0] != len(acceptance.path):
            raise ValueError("Eagle3Drafter.accept needs the target features of the accepted path")
        if self.drafted:  # tree rows were built on draft hidden states: drop them
            self.keys = self.keys[:, : self.prefix_length]
            self.values = self.values[:, : self.prefix_length]
        self.undrafted = 0 if self.drafted else self.undrafted + len(acceptance.new_tokens)
        self.pending_features.append(features)
        self.pending_tokens.extend(acceptance.new_tokens)
        self.slot_nodes, self.hidden_of, self.drafted = [], {}, False
