"""EAGLE-3's training-time test (Li et al., "EAGLE-3", 2025, section 3.2): the head unrolled k draft steps
over teacher-forced target features, with the attention pattern it will meet when drafting.

Alignment (the same as :class:`talon_sd.drafters.Eagle3Drafter`). For a sample x_0 .. x_{T-1} with
target features f_t, row t (t = 0 .. T-2) of step j:

    step 0:   input h = fc(f_t),               token x_{t+1},     position t
    step j:   input h = step j-1's output, row t, token x_{t+1+j}, position t + j
    target:   the target's next-token distribution at position p = t + 1 + j (after x_{t+1+j}),
              restricted to the draft vocabulary and renormalised

Keys of step j are ``[step 0 rows | step 1 rows | ... | step j rows]``; row t sees the step-0 keys of
positions <= t (the committed prefix at drafting time) and its own row t of steps 1 .. j (its chain of
ancestors in the draft tree)::

    ttt_visibility(rows=3, step=2):   step 0 keys | step 1 | step 2
                               row 0:   1 0 0     | 1 0 0  | 1 0 0
                               row 1:   1 1 0     | 0 1 0  | 0 1 0
                               row 2:   1 1 1     | 0 0 1  | 0 0 1

Loss: sum_j 0.8^j * (soft cross-entropy averaged over the batch's loss rows of step j). A row of step j
counts when the predicted token x_{p+1} exists and is an answer token (loss mask 1) and the target's
full-vocabulary argmax at p is in the draft vocabulary. Agreement (validation) counts every row whose
x_{p+1} is an answer token: the head's argmax equals the target's argmax over the full vocabulary
(an argmax outside the draft vocabulary is a miss), which is what greedy verification accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..eagle3 import Eagle3Head, attention_bias
from .features import SampleFeatures


def ttt_visibility(rows: int, step: int) -> torch.Tensor:
    """[rows, (step + 1) * rows] bool: which keys row t of TTT step ``step`` attends to (see module docstring)."""
    causal = torch.ones(rows, rows, dtype=torch.bool).tril()
    diagonal = torch.eye(rows, dtype=torch.bool)
    return torch.cat([causal] + [diagonal] * step, dim=1)


@dataclass(frozen=True)
class TTTBatch:
    """Several samples' rows concatenated (sample after sample); attention stays within a sample."""

    aux: torch.Tensor  # [N, 3H] features f_t of every row
    tokens: torch.Tensor  # [k, N] step j's input token x_{t+1+j} (clamped at the sample's end)
    positions: torch.Tensor  # [N] t, the row's position in its sample
    rows: tuple[int, ...]  # rows per sample (T_i - 1), in order
    teacher: torch.Tensor  # [sum T_i, Vd] float32 teacher logits of every position
    teacher_rows: torch.Tensor  # [k, N] index into ``teacher`` of position p = t + 1 + j (clamped)
    target_argmax: torch.Tensor  # [k, N] the target's full-vocabulary argmax at p
    answer: torch.Tensor  # [k, N] bool: x_{p+1} exists and is an answer token
    in_vocab: torch.Tensor  # [k, N] bool: target_argmax is in the draft vocabulary

    @property
    def loss_rows(self) -> torch.Tensor:
        return self.answer & self.in_vocab  # [k, N]

    @property
    def tokens_count(self) -> int:
        return int(self.aux.shape[0])


def make_batch(samples: Sequence[SampleFeatures], steps: int, in_draft_vocab: torch.Tensor) -> TTTBatch:
    """The TTT rows of ``samples`` for ``steps`` unrolled steps; ``in_draft_vocab`` [V] bool (the head's t2d)."""
    aux, tokens, positions, rows, teacher, teacher_rows, argmax, answer = [], [], [], [], [], [], [], []
    offset = 0
    for sample in samples:
        length = int(sample.ids.numel())
        count = length - 1
        t = torch.arange(count)
        p = t[None] + 1 + torch.arange(steps)[:, None]  # [k, R] teacher position of every step and row
        inside = p + 1 <= length - 1
        p_clamped = p.clamp(max=length - 1)
        aux.append(sample.aux[:count])
        tokens.append(sample.ids[p_clamped])  # x_{t+1+j}
        positions.append(t)
        rows.append(count)
        teacher.append(sample.teacher)
        teacher_rows.append(p_clamped + offset)
        argmax.append(sample.argmax[p_clamped])
        answer.append(inside & sample.loss_mask[(p + 1).clamp(max=length - 1)])
        offset += length
    target_argmax = torch.cat(argmax, dim=1)
    return TTTBatch(
        aux=torch.cat(aux), tokens=torch.cat(tokens, dim=1), positions=torch.cat(positions), rows=tuple(rows),
        teacher=torch.cat(teacher), teacher_rows=torch.cat(teacher_rows, dim=1), target_argmax=target_argmax,
        answer=torch.cat(answer, dim=1), in_vocab=in_draft_vocab[target_argmax],
    )


def ttt_forward(head: Eagle3Head, batch: TTTBatch) -> list[torch.Tensor]:
    """The head unrolled over ``batch``: draft-vocabulary logits [N, Vd] (float32) of every step."""
    steps = int(batch.tokens.shape[0])
    hidden = head.project(batch.aux)  # [N, H]
    keys: list[torch.Tensor] = []  # per step [kv_heads, N, d]
    values: list[torch.Tensor] = []
    logits = []
    for step in range(steps):
        q, k, v = head.qkv(hidden, batch.tokens[step], batch.positions + step)
        keys.append(k)
        values.append(v)
        attended = []
        start = 0
        for count in batch.rows:  # attention within each sample
            rows = slice(start, start + count)
            sample_keys = torch.cat([key[:, rows] for key in keys], dim=1)  # [kv_heads, (step + 1) * R, d]
            sample_values = torch.cat([value[:, rows] for value in values], dim=1)
            bias = attention_bias(ttt_visibility(count, step).to(q.device))
            attended.append(head.attend(q[:, rows], sample_keys, sample_values, bias))
            start += count
        hidden = head.finish(hidden, torch.cat(attended, dim=1))  # [N, H], fed to the next step
        logits.append(head.draft_logits(hidden))
    return logits


def ttt_loss(logits: Sequence[torch.Tensor], batch: TTTBatch, step_weight: float = 0.8) -> torch.Tensor:
    """sum_j step_weight^j * mean soft cross-entropy over the loss rows of step j (0 when a step has none)."""
    total = torch.zeros((), device=logits[0].device)
    for step, step_logits in enumerate(logits):
        loss_rows = batch.loss_rows[step]  # [N] bool, on the batch's device (CPU)
        if not bool(loss_rows.any()):
            continue
        teacher = batch.teacher[batch.teacher_rows[step][loss_rows]].to(step_logits.device)  # [M, Vd]
        target = torch.softmax(teacher, dim=-1)
        log_p = torch.log_softmax(step_logits[loss_rows.to(step_logits.device)].float(), dim=-1)
        total = total + step_weight ** step * -(target * log_p).sum(-1).mean()
    return total


@dataclass
class Agreement:
    """Accumulated per-step top-1 agreement, soft cross-entropy and the chain length it implies."""

    steps: int
    agree: list[int] = field(default_factory=list)
    answer_rows: list[int] = field(default_factory=list)
    loss_sum: list[float] = field(default_factory=list)
    loss_rows: list[int] = field(default_factory=list)
    chain_sum: int = 0  # sum over step-0 answer rows of the number of leading agreeing steps
    chain_rows: int = 0

    def __post_init__(self) -> None:
        for name in ("agree", "answer_rows", "loss_sum", "loss_rows"):
            setattr(self, name, [0] * self.steps)

    @torch.no_grad()
    def observe(self, logits: Sequence[torch.Tensor], batch: TTTBatch, target_ids: torch.Tensor) -> None:
        """Add one batch; ``target_ids`` [Vd] maps draft ids to target ids."""
        agree_steps = []
        for step, step_logits in enumerate(logits):
            answer = batch.answer[step]
            drafted = target_ids[step_logits.argmax(-1).cpu()]  # [N]
            agree = (drafted == batch.target_argmax[step]) & answer
            agree_steps.append(agree)
            self.agree[step] += int(agree.sum())
            self.answer_rows[step] += int(answer.sum())
            rows = batch.loss_rows[step]
            if bool(rows.any()):
                target = torch.softmax(batch.teacher[batch.teacher_rows[step][rows]], dim=-1)
                log_p = torch.log_softmax(step_logits.float().cpu()[rows], dim=-1)
                self.loss_sum[step] += float(-(target * log_p).sum())
                self.loss_rows[step] += int(rows.sum())
        leading = torch.stack(agree_steps).long().cumprod(dim=0).sum(dim=0)  # [N] leading agreeing steps
        self.chain_sum += int(leading[batch.answer[0]].sum())
        self.chain_rows += int(batch.answer[0].sum())

    def summary(self) -> dict:
        """``top1`` per step, ``loss`` per step, ``chain_length`` = 1 + mean leading agreements over k steps
        (the mean accepted length of a k-token chain drafted greedily, bonus token included)."""
        return {
            "top1": [round(a / r, 4) if r else None for a, r in zip(self.agree, self.answer_rows)],
            "loss": [round(s / r, 4) if r else None for s, r in zip(self.loss_sum, self.loss_rows)],
            "chain_length": round(1 + self.chain_sum / self.chain_rows, 4) if self.chain_rows else None,
            "rows": self.answer_rows[0] if self.answer_rows else 0,
        }
