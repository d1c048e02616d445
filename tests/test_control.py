"""The online budget controller (talon_sd.control), through its public protocol, in synthetic worlds
(talon_sd.bench.simulate: no model, no clock; fixed budgets and the controller on the same text)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from talon_sd.bench.simulate import CPU_FACTS_MS, World, fixed_rates, measured_curve, simulate, world_on
from talon_sd.control import (BudgetController, ControllerSettings, CostCurve, CostPrior, StepRecord, informs,
                              prefix_outcome, share_budget)
from talon_sd.errors import TalonError

# Machines. "hostile": verifying T tokens costs T one-token steps (a float32 CPU without AVX512). "flat":
# verification about free up to 64 tokens (bf16 with AVX512, a GPU). "sloped": in between.
HOSTILE = World(verify=lambda t: 1.0 * t, draft=lambda w: 0.25 + 0.05 * w, agree=0.9, confidence=(0.6, 0.99))
FLAT = World(verify=lambda t: 1.0 + 0.002 * t, draft=lambda w: 0.08 + 0.001 * w, agree=0.97, confidence=(0.75, 0.99))
SLOPED = World(verify=lambda t: 1.0 + 0.03 * t, draft=lambda w: 0.15 + 0.002 * w, agree=0.9, confidence=(0.5, 0.95))
WARM_UP = 50


def fresh(**settings) -> BudgetController:
    return BudgetController(ControllerSettings(**settings))


# ---------------------------------------------------------------------------------------------- choices
def test_hostile_costs_settle_on_plain_decoding():
    """Where a 2-token verify costs twice one token no tree can pay: plain steps, and exploring stays in its share."""
    controller = fresh()
    run = simulate(HOSTILE, 600, controller)
    plain = simulate(HOSTILE, 600, 1)
    assert run.budgets[WARM_UP:].count(1) / len(run.budgets[WARM_UP:]) >= 0.9
    assert run.rate(WARM_UP) >= 0.96 * plain.rate(WARM_UP)


def test_flat_verification_picks_large_trees_near_the_best_fixed_budget():
    run = simulate(FLAT, 500, fresh())
    assert run.mean_budget(WARM_UP) >= 12
    assert run.rate() >= 0.95 * max(fixed_rates(FLAT, 500).values())


def test_settles_near_the_brute_force_optimum():
    run = simulate(SLOPED, 500, fresh())
    rates = fixed_rates(SLOPED, 500)
    assert run.rate() >= 0.95 * max(rates.values())
    late = run.budgets[250:]
    settled = max(set(late), key=late.count)  # the budget it chose most in the second half
    assert rates[settled] >= 0.95 * max(rates.values()), (settled, rates)


def test_budget_goes_down_when_acceptance_drops():
    low = World(verify=SLOPED.verify, draft=SLOPED.draft, agree=0.35, confidence=(0.3, 0.7))
    high = World(verify=SLOPED.verify, draft=SLOPED.draft, agree=0.97, confidence=(0.8, 0.99))
    run = simulate(lambda step: high if step < 200 else low, 320, fresh())
    before = run.mean_budget(150, 200)
    assert before >= 10
    halved = next(step for step in range(200, 310) if run.mean_budget(step, step + 10) <= before / 2)
    assert halved - 200 <= 40
    rates_low = fixed_rates(low, 100)
    assert run.mean_budget(260, 320) <= 2 * max(rates_low, key=rates_low.get)


def test_leaves_plain_decoding_when_speculation_starts_to_pay():
    """Hard text then easy text on costs where drafting pays only on the easy one (the drafter catches up on
    every token committed while it was idle)."""
    costs = dict(verify=lambda t: 1.0 + 0.01 * t, draft=lambda w: 0.3, catch_up=0.02)
    hard = World(agree=0.15, confidence=(0.2, 0.5), **costs)
    easy = World(agree=0.97, confidence=(0.92, 0.99), **costs)
    runs = [simulate(lambda step: hard if step < 300 else easy, 450, fresh(), seed=seed) for seed in range(3)]
    assert sorted(run.budgets[200:300].count(1) for run in runs)[1] >= 90  # plain wins while the draft is bad
    for run in runs:
        assert run.mean_budget(400, 450) >= 8
        assert run.rate(400, 450) >= 0.85 * max(fixed_rates(easy, 150).values())


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("text", ["code", "chat"])
def test_on_this_cpus_measured_costs_never_slower_than_plain_and_near_the_best(dtype, text):
    """Per seed at least 0.95 of plain decoding; over seeds, the median within 7% of the best fixed budget (on
    float32 code the best tree is only ~7% faster than plain, and a few noisy steps may keep a run plain)."""
    acceptance = dict(agree=0.95, confidence=(0.7, 0.99)) if text == "code" else dict(agree=0.8, confidence=(0.3, 0.9))
    world = world_on(CPU_FACTS_MS[dtype], **acceptance)
    to_best = []
    for seed in range(5):
        run, rates = simulate(world, 300, fresh(), seed=seed), fixed_rates(world, 300, seed=seed)
        assert run.rate() >= 0.95 * rates[1], seed
        to_best.append(run.rate() / max(rates.values()))
    assert sorted(to_best)[2] >= 0.93, to_best


def test_exploration_loses_at_most_its_share_of_the_time():
    """Bounded regret: on costs where plain decoding is best, the steps that were not plain cost, beyond what plain
    steps would have, at most the exploration share of the time run (after the fresh start's own steps)."""
    for share in (0.01, 0.03, 0.1):
        controller = fresh(exploration=share)
        run = simulate(HOSTILE, 800, controller, seed=1, tell_catch_up=False)
        plain_step = sum(s for s, b in zip(run.seconds, run.budgets) if b == 1) / run.budgets.count(1)
        start = 8  # the fresh start: the initial budget until four steps inform it, and its plain measurement
        extra = sum(s - t * plain_step for s, t, b in zip(run.seconds[start:], run.tokens[start:], run.budgets[start:])
                    if b > 1)
        assert extra <= share * sum(run.seconds[start:]) + max(run.seconds), share
        assert share < 0.1 or any(b > 1 for b in run.budgets[start:])  # it does explore when it can afford to


def test_a_long_prompts_catch_up_is_paid_only_where_drafting_repays_it_soon():
    """The draft LM forwards a 700-token prompt before its first tree: where drafting gains little that request
    stays plain (the carried choice notwithstanding); where it gains a lot, it drafts at once."""
    costs = dict(verify=lambda t: 1.0 + 0.01 * t, draft=lambda w: 0.2, catch_up=0.01)
    for agree, confidence, drafts in ((0.55, (0.4, 0.7), False), (0.99, (0.95, 0.999), True)):
        world = World(agree=agree, confidence=confidence, **costs)
        controller = fresh()
        simulate(world, 200, controller, prompt=100)  # a first request with a shorter prompt
        follower = controller.for_next_sequence()
        run = simulate(world, None, follower, prompt=700, tokens=64)
        assert any(b > 1 for b in run.budgets[:3]) == drafts == any(b > 1 for b in run.budgets[:10]), run.budgets[:10]


def test_predictable_text_drafts_where_open_text_stays_plain():
    """The target's confidence tells the kinds of text apart: on costs where trees pay on code only, the
    controller drafts on code stretches and stays plain on chat ones, both within one request."""
    costs = dict(verify=lambda t: 1.0 + 0.25 * t, draft=lambda w: 0.12)
    code = World(agree=0.995, confidence=(0.93, 0.999), **costs)
    chat = World(agree=0.5, confidence=(0.3, 0.7), **costs)
    assert fixed_rates(chat, 200)[1] > max(r for k, r in fixed_rates(chat, 200).items() if k > 1)
    assert fixed_rates(code, 200)[1] < max(fixed_rates(code, 200).values())
    world = lambda step: code if (step // 60) % 2 else chat  # noqa: E731
    run = simulate(world, 600, fresh())
    on_code = [b for step, b in enumerate(run.budgets) if step > 120 and (step // 60) % 2 and step % 60 > 10]
    on_chat = [b for step, b in enumerate(run.budgets) if step > 120 and not (step // 60) % 2 and step % 60 > 10]
    assert sum(b > 1 for b in on_code) / len(on_code) >= 0.8
    assert sum(b == 1 for b in on_chat) / len(on_chat) >= 0.8


def chain_step(accepted: int, confidence: float) -> StepRecord:
    """A 4-node chain (root and 3 drafted tokens) of which the target kept the first ``accepted``."""
    return StepRecord(node_parent=(-1, 0, 1, 2), accepted=tuple(range(1, accepted + 1)), forward_widths=(1, 1, 1),
                      prefix_after_forward=(2, 3, 4), draft_seconds=(0.1, 0.1, 0.1), verify_seconds=1.0,
                      other_seconds=0.0, budget=4, complete=False, confidence=(confidence,) * (accepted + 1))


def test_confident_text_expects_at_least_what_all_text_accepts_unless_told_otherwise():
    """A draft model agrees more where the target is sure (code after chat): with ``kind_floor`` 1 predictable text
    expects at least what all text accepted, even where its own drafted steps (math) accepted less; with 0 (the
    n-gram drafter's) it expects what its own steps accepted."""
    expected = {}
    for floor in (0.0, 1.0):
        controller = fresh(kind_floor=floor)
        for _ in range(30):
            controller.observe(chain_step(3, 0.5))  # open text: every drafted token kept
        for i in range(30):
            controller.observe(chain_step(i % 2, 0.99))  # predictable text: half the first tokens kept
        assert controller.predictable
        expected[floor] = controller.expected_tokens()
    assert all(expected[1.0][k] > expected[0.0][k] > 1 for k in (2, 3, 4))
    assert expected[1.0][2] >= 1.6  # all text's N = 2 acceptance (1.5 of the predictable steps, 2 of the open ones)


def test_same_records_give_the_same_budgets():
    assert simulate(SLOPED, 200, fresh()).budgets == simulate(SLOPED, 200, fresh()).budgets


def test_every_step_says_why_it_got_its_budget():
    from talon_sd.control import REASONS

    run = simulate(SLOPED, 300, fresh())
    assert set(run.reasons) <= set(REASONS) and {"initial", "choice", "probe", "plain-measure"} <= set(run.reasons)
    assert all(b == c for b, c, r in zip(run.budgets, run.choices, run.reasons) if r in ("choice", "initial"))


# ---------------------------------------------------------------------------------------------- the prefix property
def talon_record() -> StepRecord:
    """root -> 1, 2 (forward 1); 1 -> 3, 4 and 2 -> 5 (forward 2); 3 -> 6 (forward 3); accepted path 1, 3, 6."""
    return StepRecord(node_parent=(-1, 0, 0, 1, 1, 2, 3), accepted=(1, 3, 6), forward_widths=(1, 2, 3),
                      prefix_after_forward=(3, 6, 7), draft_seconds=(0.1, 0.1, 0.1), verify_seconds=1.0,
                      other_seconds=0.0, budget=7, complete=False)


@pytest.mark.parametrize("budget,expected", [(1, (0, 0, (), 1)), (2, (1, 1, (1,), 2)), (3, (1, 1, (1,), 3)),
                                             (4, (2, 2, (1, 2), 4)), (6, (2, 2, (1, 2), 6)), (7, (3, 3, (1, 2, 3), 7))])
def test_prefix_outcome_of_a_talon_step(budget, expected):
    assert tuple(prefix_outcome(talon_record(), budget)) == expected


def test_a_cut_step_does_not_inform_larger_budgets_and_a_complete_one_does():
    record = talon_record()
    assert informs(record, 7) and not informs(record, 8)
    with pytest.raises(ValueError):
        prefix_outcome(record, 8)
    complete = StepRecord(**{**record.__dict__, "budget": 12, "complete": True})
    assert informs(complete, 12) and prefix_outcome(complete, 12) == prefix_outcome(record, 7)


def test_eagle_records_need_every_forward_for_any_tree():
    eagle = StepRecord(node_parent=(-1, 0, 0, 1, 2), accepted=(2,), forward_widths=(1, 2), prefix_after_forward=(1, 5),
                       draft_seconds=(0.1, 0.1), verify_seconds=1.0, other_seconds=0.0, budget=5, complete=False)
    assert prefix_outcome(eagle, 3) == (1, 2, (1, 2), 3)


@pytest.mark.parametrize("change", [dict(node_parent=(-1, 0, 5)), dict(accepted=(2,)), dict(prefix_after_forward=(3,)),
                                    dict(verify_seconds=float("nan")), dict(budget=2), dict(confidence=(0.5,)),
                                    dict(catch_up_seconds=-1.0)])
def test_inconsistent_records_raise_value_error(change):
    record = StepRecord(node_parent=(-1, 0, 1), accepted=(1,), forward_widths=(1, 1), prefix_after_forward=(2, 3),
                        draft_seconds=(0.1, 0.1), verify_seconds=1.0, other_seconds=0.0, budget=3, complete=False)
    with pytest.raises(ValueError):
        StepRecord(**{**record.__dict__, **change})


def chain_record(budget: int, accepted: int) -> StepRecord:
    return StepRecord(node_parent=tuple(range(-1, budget - 1)), accepted=tuple(range(1, accepted + 1)),
                      forward_widths=(1,) * (budget - 1), prefix_after_forward=tuple(range(2, budget + 1)),
                      draft_seconds=(0.1,) * (budget - 1), verify_seconds=1.0, other_seconds=0.0, budget=budget,
                      complete=False)


def test_expected_tokens_are_ratios_of_sums_over_the_informing_steps():
    """Where every step informs every budget the chained ratios are the plain means of committed tokens."""
    controller = BudgetController(ControllerSettings(max_budget=8, initial_budget=8, half_life=1e9))
    accepted = [7, 2, 4, 0, 5, 3]
    for a in accepted:
        controller.observe(chain_record(8, a))
    expected = controller.expected_tokens()
    for k in (2, 4, 8):
        assert expected[k] == pytest.approx(sum(min(a, k - 1) + 1 for a in accepted) / len(accepted))


def test_a_sampled_fresh_start_pays_an_unmeasured_catch_up_only_within_exploration():
    """With ``catch_up_row`` set (the loop sets it for sampled requests) a 700-token prompt's catch-up, priced above
    what exploring may lose over a 128-token answer, keeps a fresh controller plain until the credit carried from
    request to request covers it (within 4 more); a 20-token prompt's does not, nor greedy's (unset): they draft in
    the first request."""
    sampled = world_on(CPU_FACTS_MS["fp32"], catch_up=0.005, agree=0.9, sampled=True)  # 6.7 ms a row priced
    first_drafted = []
    for world, prompt in ((sampled, 700), (sampled, 20), (dataclasses.replace(sampled, sampled=False), 700)):
        controller, drafted = fresh(), []
        for request in range(6):
            run = simulate(world, None, controller, seed=request, prompt=prompt, tokens=128)
            drafted.append(max(run.budgets) > 1)
            controller = controller.for_next_sequence()
        first_drafted.append(drafted.index(True) if True in drafted else None)
    assert first_drafted[0] is not None and 1 <= first_drafted[0] <= 4 and first_drafted[1:] == [0, 0], first_drafted


def test_a_budget_informed_by_few_steps_cannot_be_chosen():
    controller = BudgetController(ControllerSettings(max_budget=8, initial_budget=8))
    for _ in range(3):
        controller.observe(chain_record(8, 7))
    assert set(controller.expected_tokens()) == {1}
    assert controller.next_budget() == 8 and controller.reason == "initial"
    controller.observe(chain_record(8, 7))
    assert set(controller.expected_tokens()) == {1, 2, 3, 4, 6, 8}


# ---------------------------------------------------------------------------------------------- costs
def test_a_steps_draft_seconds_are_its_forwards_priced_by_width():
    """Forwards of 1, 2 and 6 rows costing 0.1, 0.3 and 0.35 s make a step's draft 0.75 s, not 3 x draft(3 rows)."""
    controller = fresh()
    record = StepRecord(node_parent=(-1, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8), accepted=(),
                        forward_widths=(1, 2, 6), prefix_after_forward=(3, 9, 15), draft_seconds=(0.1, 0.3, 0.35),
                        verify_seconds=1.0, other_seconds=0.0, budget=15, complete=False)
    for _ in range(4):
        controller.observe(record)
    assert controller.seconds(12) == pytest.approx(1.0 + 0.1 + 0.3 + 0.35)
    assert controller.seconds(3) == pytest.approx(1.0 + 0.1)  # 3 nodes need the first forward only


def test_cost_curve_is_a_non_decreasing_fit_of_recent_medians():
    curve = CostCurve(window=3)
    for size, seconds in ((1, 1.0), (2, 3.0), (4, 2.0), (8, 4.0), (2, 3.0), (2, 3.0)):
        curve.add(size, seconds)
    fitted = [curve(s) for s in (1, 2, 4, 8)]
    assert fitted == sorted(fitted) and curve(3) == pytest.approx(curve(2) + (curve(4) - curve(2)) / 2)
    assert curve(16) > curve(8) and curve(0.5) <= curve(1)
    for _ in range(3):
        curve.add(2, 1.5)  # the window keeps the newest three
    assert curve.medians()[2] == 1.5


def test_a_prior_stands_in_for_unmeasured_sizes_scaled_by_the_measured_ones():
    curve = CostCurve(prior={1: 1.0, 16: 2.0, 64: 4.0})
    curve.add(1, 2.0)  # this machine runs twice as slow as the prior said
    assert curve(16) == pytest.approx(4.0) and curve(64) == pytest.approx(8.0)


def test_plain_decoding_where_a_two_token_verify_costs_twice_one_token():
    """N = 1 where a 2-token verify costs twice one token and trees cost in proportion, from measured costs alone
    (a tune profile) and whatever the acceptance."""
    prior = CostPrior(verify_seconds={k: float(k) for k in (1, 2, 4, 8, 16, 32, 64)}, draft_seconds={1: 0.3, 64: 0.4})
    controller = BudgetController(ControllerSettings(), prior)
    run = simulate(World(verify=lambda t: 1.0 * t, draft=lambda w: 0.3, agree=0.98, confidence=(0.9, 0.99)), 200,
                   controller)
    assert run.budgets[20:].count(1) / len(run.budgets[20:]) >= 0.9


def test_a_large_tree_where_verifying_is_flat():
    run = simulate(World(verify=lambda t: 1.0, draft=lambda w: 0.05, agree=0.98, confidence=(0.9, 0.99)), 200, fresh())
    assert run.mean_budget(50) >= 24


# ---------------------------------------------------------------------------------------------- state and sharing
def test_state_round_trips_through_json_and_continues_alike():
    controller = fresh()
    simulate(SLOPED, 120, controller)
    restored = BudgetController.from_dict(json.loads(json.dumps(controller.to_dict())))
    assert restored.to_dict() == controller.to_dict()
    a, b = controller.for_next_sequence(), restored
    assert simulate(SLOPED, 60, a, seed=3).budgets == simulate(SLOPED, 60, b, seed=3).budgets


@pytest.mark.parametrize("damage", [lambda d: d.update(version=0), lambda d: d.pop("costs"),
                                    lambda d: d["values"][0]["sums"]["tokens"].pop(), lambda d: d.update(settings=5)])
def test_state_of_another_version_or_shape_is_refused(damage):
    data = fresh().to_dict()
    damage(data)
    with pytest.raises(ValueError):
        BudgetController.from_dict(data)


def test_for_next_sequence_leaves_the_original_alone():
    controller = fresh()
    simulate(SLOPED, 100, controller)
    before = json.dumps(controller.to_dict())
    simulate(HOSTILE, 100, controller.for_next_sequence())
    assert json.dumps(controller.to_dict()) == before


def test_a_shared_budget_goes_where_it_adds_most_tokens():
    confident = {1: 1.0, 2: 1.9, 4: 3.6, 8: 6.5, 16: 9.0}
    uncertain = {1: 1.0, 2: 1.2, 4: 1.3, 8: 1.35, 16: 1.4}
    flat = lambda budgets: 1.0 + 0.001 * sum(budgets)  # noqa: E731
    budgets = share_budget([confident, uncertain], flat)
    assert budgets[0] == 16 and budgets[0] > budgets[1]
    dear = lambda budgets: float(sum(budgets))  # every row costs a one-token step: all plain  # noqa: E731
    assert share_budget([confident, uncertain, confident], dear) == [1, 1, 1]
    rows_cost = lambda budgets: 1.0 + 0.05 * max(sum(budgets) - 8, 0)  # 8 rows come free  # noqa: E731
    shared = share_budget([confident, confident, uncertain, uncertain], rows_cost)
    assert shared[0] == shared[1] > shared[2] == shared[3] >= 1


@pytest.mark.parametrize("field_name,value", [("max_budget", 1), ("initial_budget", 0), ("initial_budget", 100),
                                              ("exploration", 1.0), ("exploration", float("nan")), ("half_life", 0),
                                              ("horizon", 0), ("cost_window", True), ("plain_refresh", 2.5),
                                              ("kind_floor", 1.5), ("kind_floor", float("nan"))])
def test_bad_settings_name_the_field(field_name, value):
    with pytest.raises(TalonError, match=field_name):
        ControllerSettings(**{field_name: value})


@pytest.mark.parametrize("arguments,name", [((-1, None), "catch_up_tokens"), ((0, -3), "tokens_left"),
                                            ((1.5, None), "catch_up_tokens"), ((None, 4), "catch_up_tokens")])
def test_bad_next_budget_arguments_name_the_argument(arguments, name):
    with pytest.raises(TalonError, match=name):
        fresh().next_budget(*arguments)


def test_measured_curve_interpolates_a_table_of_milliseconds():
    curve = measured_curve({1: 100, 3: 300})
    assert curve(2) == pytest.approx(0.2) and curve(1) == pytest.approx(0.1) and curve(9) == pytest.approx(0.9)
