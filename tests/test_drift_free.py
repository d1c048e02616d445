"""talon_sd.bench.drift_free (scripts/drift_free.py) reprices a run at one fitted cost model: on a synthetic run whose requests cost exactly
a known linear model times a per-request drift factor, it recovers the model and the drift-free speedups, which
the measured ones miss; terms that would fit negative are dropped, and --same-length prices only turns whose
variants committed as many tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest

from talon_sd.bench.drift_free import fit_nonnegative, reprice, request_terms

VERIFY = np.array([0.13, 0.003, 2e-6, 4e-5])  # s per step, per node, per node x context token, per node^2
DRAFT = np.array([0.05, 0.001, 0.002, 0.01])  # s per forward, per drafted node, per prompt token, per drafted step


def sample(dataset: str, turn: int, label: str, budget: int, steps: int, forwards: int, tokens: int,
           drift: float, prompt: int = 40) -> dict:
    """One request that costs exactly VERIFY / DRAFT on a steady machine, ``drift`` x that as measured. A fixed
    budget records only its histogram (as the bench does); 'auto' records every step's budget, a plain step (N = 1)
    and a 12-node step among its 16-node ones."""
    if "auto" in label:
        per_step = [1, 12] + [budget] * (steps - 2)
        stats = {"budgets": per_step, "budget_hist": {}, "draft_forwards": forwards}
    else:
        stats = {"budgets": [], "budget_hist": {str(budget): steps}, "draft_forwards": forwards}
    stats.update(seconds_prefill=0.2, seconds_build=0.01)
    draft_prompt = {"prompt_tokens": prompt, "new_tokens": tokens, "stats": stats}
    verify_terms, draft_terms = request_terms(draft_prompt)
    verify = float(np.dot(VERIFY, verify_terms))
    draft = float(np.dot(DRAFT, draft_terms)) if forwards else 0.0
    stats.update(seconds_verify=verify * drift, seconds_draft=draft * drift)
    return {"dataset": dataset, "question_id": str(turn), "turn": 1, "label": label, "prompt_tokens": prompt,
            "new_tokens": tokens, "seconds": 0.21 + (verify + draft) * drift, "stats": stats}


SLOW = {"talon(N=auto)": {0, 1, 2, 6, 7}, "talon(N=8)": {3, 8}, "ar": {4, 5, 9}}  # turns run in a slow spell


def synthetic_run(seed: int = 0) -> dict:
    """ar, a fixed N = 8 and an 'auto' that runs N = 16 in a quarter of the steps (drift-free the fastest), over
    12 prompt turns; a slow spell (1.3x) hits the variants on the turns of SLOW, auto's most often, so that measured
    auto looks slower than N = 8. The spells fall on variants, not on tree sizes, as a rotated sweep's do."""
    rng = random.Random(seed)
    samples = []
    for turn in range(12):
        tokens = 60 + 10 * turn
        for label, budget, steps, forwards in (("ar", 1, tokens, 0), ("talon(N=8)", 8, tokens // 3, 2 * (tokens // 3)),
                                               ("talon(N=auto)", 16, tokens // 4, 3 * (tokens // 4))):
            drift = rng.uniform(0.97, 1.03) * (1.3 if turn in SLOW[label] else 1.0)
            samples.append(sample("chat", turn, label, budget, steps, forwards, tokens, drift))
    return {"samples": samples}


def true_speedup(run: dict, label: str) -> float:
    """The speedup over ar at the exact costs (the drift divided out of every request)."""
    totals = {}
    for s in run["samples"]:
        drift = s["stats"]["seconds_verify"] / float(np.dot(VERIFY, request_terms(s)[0]))
        steady = 0.21 + (s["seconds"] - 0.21) / drift
        tokens, seconds = totals.get(s["label"], (0, 0.0))
        totals[s["label"]] = (tokens + s["new_tokens"], seconds + steady)
    return (totals[label][0] / totals[label][1]) / (totals["ar"][0] / totals["ar"][1])


def test_the_fit_recovers_the_speedups_without_the_drift():
    run = synthetic_run()
    found = reprice(run)
    speed = found.speedups("chat")
    # drift-free, auto (16 nodes, a quarter of the steps) beats N = 8; measured in its slow spell it does not
    assert true_speedup(run, "talon(N=auto)") > true_speedup(run, "talon(N=8)")
    assert speed["talon(N=auto)"][0] < speed["talon(N=8)"][0]
    assert speed["talon(N=auto)"][1] > speed["talon(N=8)"][1]
    for label in ("talon(N=8)", "talon(N=auto)"):
        assert speed[label][1] == pytest.approx(true_speedup(run, label), rel=0.05)


def test_without_drift_the_fit_is_the_cost_model():
    run = synthetic_run()
    for s in run["samples"]:  # every request at the steady machine's costs
        verify, draft = request_terms(s)
        s["stats"]["seconds_verify"] = float(np.dot(VERIFY, verify))
        s["stats"]["seconds_draft"] = float(np.dot(DRAFT, draft)) if s["stats"]["draft_forwards"] else 0.0
        s["seconds"] = 0.21 + s["stats"]["seconds_verify"] + s["stats"]["seconds_draft"]
    found = reprice(run)
    assert found.verify == pytest.approx(VERIFY, rel=1e-6, abs=1e-12)
    for tokens, measured, modelled in found.totals.values():
        assert modelled == pytest.approx(measured, rel=1e-6)


def test_a_term_that_would_fit_negative_is_dropped_and_the_rest_refitted():
    rng = np.random.default_rng(0)
    x = rng.uniform(1, 10, size=(40, 2))
    collinear = np.column_stack([x, x[:, 0] * 1.0001 + rng.normal(0, 0.5, 40)])  # a noisy copy of column 0
    y = x @ np.array([2.0, 3.0]) - 0.5 * collinear[:, 2]  # its true coefficient is negative
    coefficients = fit_nonnegative(collinear.tolist(), y.tolist())
    assert (coefficients >= 0).all()
    assert coefficients[2] == 0.0
    assert coefficients[1] == pytest.approx(3.0, rel=0.05)


def test_same_length_prices_only_turns_where_every_variant_committed_as_many_tokens():
    run = synthetic_run()
    other = next(s for s in run["samples"] if s["question_id"] == "2" and s["label"] == "talon(N=8)")
    other["new_tokens"] += 5  # a near-tie gave this variant another answer
    assert reprice(run).priced == 36
    found = reprice(run, same_length=True)
    assert found.priced == 33
    assert found.fitted == 36  # the fit still reads every request
    assert found.totals[("chat", "ar")][0] == sum(60 + 10 * turn for turn in range(12) if turn != 2)
