"""The draft vocabulary: the target ids an EAGLE-3 head can propose.

EAGLE-3 (section 3.3; SpecForge ``generate_vocab_mapping``) keeps the ``Vd`` most frequent target
tokens of the training answers: a smaller output layer at little cost in coverage. Here: tokens at
loss-masked positions (answers) counted over every sample, ties broken by the count over all
positions, then by the lower id; when fewer than ``Vd`` distinct ids occur, the rest are filled the
same way (so the head has exactly ``min(Vd, V)`` outputs). The result is sorted by id, as
``init_eagle3_head`` and the checkpoint format (``d2t[i] = used[i] - i``) expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .data import Sample


@dataclass(frozen=True)
class DraftVocabulary:
    ids: torch.Tensor  # [Vd] int64, sorted target ids
    coverage: float  # share of answer tokens whose id is in ``ids``


def select_draft_vocab(samples: Sequence[Sample], size: int, vocab_size: int) -> DraftVocabulary:
    """The ``min(size, vocab_size)`` most frequent answer tokens of ``samples`` (see the module docstring)."""
    size = min(int(size), int(vocab_size))
    answer_counts = torch.zeros(vocab_size, dtype=torch.long)  # [V]
    all_counts = torch.zeros(vocab_size, dtype=torch.long)  # [V]
    for sample in samples:
        ids = torch.tensor(sample.ids, dtype=torch.long)
        mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
        answer_counts += torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
        all_counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    # one sort key: answer count, then overall count, then the lower id (a stable sort keeps id order)
    key = answer_counts * (int(all_counts.max()) + 1) + all_counts  # [V]
    order = torch.sort(key, descending=True, stable=True).indices
    ids = order[:size].sort().values
    total = int(answer_counts.sum())
    coverage = float(answer_counts[ids].sum()) / total if total else 0.0
    return DraftVocabulary(ids=ids, coverage=coverage)
