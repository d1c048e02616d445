"""``talon sweep``: speedup against the tree budget, the paper's N = 32...96 ablation redone here.

The sweep is a benchmark (:func:`talon_sd.bench.runner.run_bench`, same interleaving, warm-up and
results schema, ``"kind": "sweep"``) whose variants are a grid: TALON over budgets x mu x K, EAGLE
over budgets (total tokens) x top-k x depth, static over budgets, chain over depth = N - 1; plus
``ar`` as the baseline. Variant labels are the TreeConfig labels, e.g. ``talon(N=32,K=4,mu=0.03)``.
A budget ``auto`` adds the online controller's variant of each method that has one (talon, eagle,
chain), side by side with the fixed budgets: ``talon(N=auto,K=4,mu=0.03)``.
"""

from __future__ import annotations

from typing import Sequence

from ..config import TreeConfig
from .methods import Variant

SWEEP_METHODS = ("chain", "static", "eagle", "talon")


def sweep_variants(methods: Sequence[str], budgets: Sequence[int | str], mus: Sequence[float] = (0.03,),
                   talon_topks: Sequence[int] = (4,), eagle_topks: Sequence[int] = (4,),
                   eagle_depths: Sequence[int] = (5,)) -> list[Variant]:
    """``ar`` then the grid of every method in ``methods`` (TreeConfig validates every value)."""
    configs = [TreeConfig("ar")]
    for method in methods:
        for budget in budgets:
            if budget == "auto" and method == "static":
                continue
            if method == "chain" and budget == "auto":
                configs.append(TreeConfig("chain", budget="auto"))
            elif method == "talon":
                configs += [TreeConfig("talon", budget=budget, mu=mu, topk=k) for mu in mus for k in talon_topks]
            elif method == "eagle":
                configs += [TreeConfig("eagle", budget=budget, topk=k, depth=d) for k in eagle_topks for d in eagle_depths]
            elif method == "static":
                configs.append(TreeConfig("static", budget=budget))
            elif method == "chain":
                configs.append(TreeConfig("chain", depth=max(budget - 1, 1)))
    unique = {config.label: config for config in configs}
    return [Variant(label=label, method=config.method, tree=config) for label, config in unique.items()]
