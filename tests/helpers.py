"""Small shared helpers for tests: run the decoding loop directly on in-memory models."""

from __future__ import annotations

import torch

from talon_sd.builders import make_builder
from talon_sd.config import SamplingConfig, TreeConfig
from talon_sd.control import BudgetController, ControllerSettings
from talon_sd.decoding import Pipeline, StopCondition, decode
from talon_sd.drafters import ModelDrafter, NgramDrafter
from talon_sd.lm import CausalLM
from talon_sd.stats import DecodeStats


def make_drafter(kind: str, draft_model, vocab: int):
    return ModelDrafter(draft_model) if kind == "model" else NgramDrafter(vocab)


class CyclingController(BudgetController):
    """A controller that walks a fixed budget sequence (plain steps included): exercises every budget change the
    real controller could make, deterministically, and records what the loop told it."""

    BUDGETS = (6, 1, 2, 12, 1, 1, 4, 20, 3, 1, 9)

    def __init__(self, max_budget: int = 24) -> None:
        super().__init__(ControllerSettings(max_budget=max_budget, initial_budget=6))
        self.budgets: list[int] = []
        self.asked: list[tuple[int, int | None]] = []  # (catch_up_tokens, tokens_left) the loop gave each step
        self.committed: list[int] = []  # tokens each step committed (bonus included)
        self.caught_up_apart: list[bool] = []  # whether each step's record timed a catch-up forward apart

    def next_budget(self, catch_up_tokens: int = 0, tokens_left: int | None = None) -> int:
        budget = min(self.BUDGETS[len(self.budgets) % len(self.BUDGETS)], max_budget_of(self))
        self.budgets.append(budget)
        self.asked.append((catch_up_tokens, tokens_left))
        return budget

    def observe(self, record) -> None:
        self.committed.append(len(record.accepted) + 1)
        self.caught_up_apart.append(record.catch_up_seconds is not None)
        super().observe(record)


def max_budget_of(controller) -> int:
    return controller.settings.max_budget


def run(target_model, drafter, tree: TreeConfig, prompt, max_new_tokens, eos=(), sampling=None, controller=None):
    """Decode with the real loop (an ``auto`` tree gets a fresh online controller); returns (tokens, stats)."""
    stats = DecodeStats(method=tree.label)
    if tree.auto and controller is None:
        controller = CyclingController()
    pipeline = Pipeline(CausalLM(target_model), None if tree.method == "ar" else drafter, make_builder(tree),
                        sampling or SamplingConfig(), controller)
    stop = StopCondition(max_new_tokens=max_new_tokens, eos_token_ids=frozenset(eos))
    tokens = list(decode(pipeline, torch.tensor(prompt), stop, stats))
    return tokens, stats
