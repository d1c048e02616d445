"""Per-call decoding statistics (glossary in :mod:`talon_sd.verify`).

MAT = committed tokens per target forward (bonus token included), delta = draft forwards per target
forward, the split of wall time into draft forwards / tree construction / verification, the
histogram of accepted lengths, per-depth acceptance and the tree shapes.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from .tree import DraftTree
from .verify import Acceptance


@dataclass
class DecodeStats:
    """Filled by the decoding loop through :meth:`observe`; read through :meth:`to_dict`."""

    method: str = ""
    prompt_tokens: int = 0
    seed: int | None = None  # the sampling seed (given, or drawn when none was); None when greedy
    new_tokens: int = 0
    target_forwards: int = 0  # verify steps (the prefill is not counted)
    draft_forwards: int = 0
    committed: int = 0  # tokens committed by verify steps, before any stop truncation
    accepted_lengths: Counter = field(default_factory=Counter)  # accepted drafts per step -> count
    tree_sizes: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)  # the budget N each step was given (fixed, or the controller's)
    reasons: list[str] = field(default_factory=list)  # why the online controller chose each step's N ("" if fixed)
    tree_depths: list[int] = field(default_factory=list)
    layer_width_sums: list[int] = field(default_factory=list)  # summed width of each depth over steps
    reached: list[int] = field(default_factory=list)  # steps whose tree reaches depth d (d = 1..)
    accepted_at: list[int] = field(default_factory=list)  # steps that accepted a node at depth d
    seconds_prefill: float = 0.0
    seconds_draft: float = 0.0  # inside draft-model forwards
    seconds_build: float = 0.0  # the rest of each step: tree construction, cache commit, bookkeeping
    seconds_verify: float = 0.0  # target forward + acceptance
    seconds_total: float = 0.0
    started: float = field(default_factory=time.perf_counter, repr=False)

    def observe(self, tree: DraftTree, acceptance: Acceptance, draft_forwards: int, budget: int | None = None,
                reason: str = "") -> None:
        """Record one verify step (``budget``: the N it was given, default the tree's size; ``reason``: why the
        online controller chose it, a key of :data:`talon_sd.control.REASONS`, "" for a fixed budget)."""
        self.budgets.append(tree.size if budget is None else budget)
        self.reasons.append(reason)
        self.target_forwards += 1
        self.draft_forwards += draft_forwards
        self.committed += acceptance.num_accepted + 1
        self.accepted_lengths[acceptance.num_accepted] += 1
        self.tree_sizes.append(tree.size)
        self.tree_depths.append(tree.max_depth)
        widths = tree.layer_widths()
        for depth, width in enumerate(widths):
            if depth >= len(self.layer_width_sums):
                self.layer_width_sums.append(0)
            self.layer_width_sums[depth] += width
        for depth in range(1, len(widths)):
            if depth > len(self.reached):
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[depth - 1] += 1
            self.accepted_at[depth - 1] += int(acceptance.num_accepted >= depth)

    def add_seconds(self, draft: float, verify: float, other: float) -> None:
        """Wall time of one step: draft forwards, verification (target forward + rule), the rest."""
        self.seconds_draft += draft
        self.seconds_verify += verify
        self.seconds_build += other

    def finish(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.seconds_total = time.perf_counter() - self.started

    @property
    def mat(self) -> float:
        return self.committed / self.target_forwards if self.target_forwards else 0.0

    @property
    def delta(self) -> float:
        return self.draft_forwards / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds_total if self.seconds_total else 0.0

    def to_dict(self) -> dict:
        steps = max(self.target_forwards, 1)
        return {
            "method": self.method,
            "prompt_tokens": self.prompt_tokens,
            "seed": self.seed,
            "new_tokens": self.new_tokens,
            "target_forwards": self.target_forwards,
            "draft_forwards": self.draft_forwards,
            "mat": round(self.mat, 4),
            "delta": round(self.delta, 4),
            "tokens_per_s": round(self.tokens_per_second, 4),
            "accepted_length_hist": {str(k): v for k, v in sorted(self.accepted_lengths.items())},
            "mean_tree_size": round(sum(self.tree_sizes) / steps, 3),
            "mean_budget": round(sum(self.budgets) / steps, 3),
            "budget_hist": {str(k): v for k, v in sorted(Counter(self.budgets).items())},
            "budgets": list(self.budgets) if len(set(self.budgets)) > 1 else [],  # per step, when they varied
            "reason_hist": dict(sorted(Counter(r for r in self.reasons if r).items())),  # online budgets only
            "reasons": list(self.reasons) if any(self.reasons) else [],  # per step, online budgets only
            "mean_tree_depth": round(sum(self.tree_depths) / steps, 3),
            "mean_layer_width": [round(w / steps, 3) for w in self.layer_width_sums],
            "depth_acceptance": [round(a / r, 4) if r else 0.0 for a, r in zip(self.accepted_at, self.reached)],
            "seconds_prefill": round(self.seconds_prefill, 4),
            "seconds_draft": round(self.seconds_draft, 4),
            "seconds_build": round(self.seconds_build, 4),
            "seconds_verify": round(self.seconds_verify, 4),
            "seconds_total": round(self.seconds_total, 4),
        }

    def summary(self) -> str:
        """One line for terminals."""
        budget = ""
        if self.budgets and len(set(self.budgets)) > 1:  # the online controller varied N
            budget = f"N {sum(self.budgets) / len(self.budgets):.1f} (plain steps {self.budgets.count(1)}) | "
        return (
            f"[{self.method}] {self.new_tokens} tokens in {self.seconds_total:.2f}s "
            f"({self.tokens_per_second:.2f} tok/s) | MAT {self.mat:.2f} | delta {self.delta:.2f} | {budget}"
            f"draft {self.seconds_draft:.2f}s build {self.seconds_build:.2f}s verify {self.seconds_verify:.2f}s"
        )
