"""Drafters: where the draft distributions come from (one proposer per file).

The protocol, called by the decoding loop (:func:`talon_sd.decoding.decode`) in this order::

    start(prompt_ids, features)      once per generation; prompt_ids[-1] is the first root
    repeat every verify step:
        begin_step(root_token)       a new step; the root is the last committed token
        expand(tree, nodes)          0 or more times, called by the tree builder (one draft forward each)
        accept(tree, acceptance, features)
                                     the target verified ``tree``; ``acceptance.path`` (root first) was kept

``expand(tree, nodes) -> log_p_draft [F, V]``: log P_draft(next token | root-to-node path) for the F
``nodes`` of the partial ``tree``, over the TARGET's vocabulary (V = target vocabulary size): a
drafter never proposes an id the target cannot score (ids it does not know get ``-inf``). A step
may run no ``expand`` at all (the ``ar`` builder, or a budget of 1 chosen by the online controller):
``accept`` is still called and the drafter must keep its context in step with the committed tokens.

``features``: a drafter that reads the target's hidden states (EAGLE-3 heads) names the layers in
:attr:`Drafter.feature_layers`; the target's forwards that already run (prefill, tree verification)
return those states, and the loop hands over the rows of the committed tokens only: for ``start``
the prompt except its last token ``[L - 1, H * len(layers)]``, for ``accept`` the accepted path,
root first ``[len(path), H * len(layers)]``. Drafters with no ``feature_layers`` get ``None``.

Registered in :data:`DRAFTERS`: ``model`` (an independent draft LM), ``ngram`` (prompt lookup) and
``eagle3`` (an EAGLE-3 head over the target's hidden states).
"""

from __future__ import annotations

from .base import Drafter
from .eagle3 import Eagle3Drafter
from .model import ModelDrafter
from .ngram import NgramDrafter

DRAFTERS: dict[str, type[Drafter]] = {drafter.name: drafter for drafter in (ModelDrafter, NgramDrafter, Eagle3Drafter)}

__all__ = ["DRAFTERS", "Drafter", "Eagle3Drafter", "ModelDrafter", "NgramDrafter"]
