"""The drafter protocol (stated in :mod:`talon_sd.drafters`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..tree import DraftTree
from ..verify import Acceptance


class Drafter(ABC):
    """Source of draft distributions for the tree builders; one instance serves one generation at a time."""

    name: ClassVar[str]
    feature_layers: ClassVar[tuple[int, ...]] = ()  # target hidden-state layers this drafter reads
    follows_confidence: ClassVar[bool] = True  # agrees more where the target is sure (the controller's kind_floor)

    @property
    def catch_up_tokens(self) -> int:
        """Committed tokens the next step's first draft forward must also forward because steps ran
        without drafting: the prompt until the first drafted step, then every plain step's tokens (the
        online controller weighs their cost, :mod:`talon_sd.control`). 0 for a drafter whose
        first forward does not depend on them."""
        return 0

    @property
    def linear_weights(self) -> int:
        """The weights of the linears a catch-up row goes through (:func:`talon_sd.lm.linear_weights`): against the
        target's, what an unmeasured catch-up is priced at. 0 for a drafter without a catch-up."""
        return 0

    @abstractmethod
    def start(self, prompt_ids: torch.Tensor, features: torch.Tensor | None = None) -> None:
        """Begin a generation for ``prompt_ids`` [L]; ``prompt_ids[-1]`` is the first root.
        ``features`` [L - 1, H'] are the target's states of ``prompt_ids[:-1]`` (None without feature_layers)."""

    @abstractmethod
    def begin_step(self, root_token: int) -> None:
        """A verify step starts from ``root_token``, the last committed token."""

    def catch_up(self) -> bool:
        """Before a step's first :meth:`expand`: forward, as a forward of its own, every committed token that
        expand would otherwise also forward (all but the root), where that costs no extra forward (a draft
        LM's prompt prefill, which runs apart from the root's forward anyway). True when it did: the first
        expand then forwards the root alone, so the loop can time the catch-up and the root's forward apart
        (a clean catch-up cost for :mod:`talon_sd.control`). The default does nothing and returns False."""
        return False

    @abstractmethod
    def expand(self, tree: DraftTree, nodes: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[F, V_target]`` of the children of ``nodes`` [F] of ``tree`` (one draft forward)."""

    @abstractmethod
    def accept(self, tree: DraftTree, acceptance: Acceptance, features: torch.Tensor | None = None) -> None:
        """The target verified ``tree`` and committed ``acceptance.new_tokens``; ``features``
        [len(acceptance.path), H'] are its states at the accepted path's nodes (None without feature_layers)."""
