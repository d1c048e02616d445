"""Batched verification: every request's output in a batch equals its output alone (greedy and seeded sampling),
with requests of different lengths joining and leaving mid-generation."""

from __future__ import annotations

import pytest
import torch

from conftest import VOCAB, plain_greedy, tiny_model
from helpers import CyclingController, make_drafter, run
from talon_sd.batch import PLAIN, BatchDecoder, decode_batch
from talon_sd.builders import make_builder
from talon_sd.config import SamplingConfig, TreeConfig
from talon_sd.decoding import Pipeline, StopCondition
from talon_sd.errors import TalonError
from talon_sd.lm import CausalLM
from talon_sd.stats import DecodeStats

PROMPTS = [[5, 17, 33, 8, 5, 17], [3, 9, 27, 81, 50, 60, 3, 9, 11, 4, 70, 12], [40], [7, 7, 7]]
LENGTHS = [40, 13, 27, 1]  # max_new_tokens: requests leave the batch at different steps
TREES = [
    TreeConfig("ar"),
    TreeConfig("chain", depth=4),
    TreeConfig("static", budget=12),
    TreeConfig("eagle", budget=16, topk=3, depth=4),
    TreeConfig("talon", budget=24, topk=4, mu=0.03),
    TreeConfig("talon", budget="auto", topk=4),
]


def request_parts(target, drafter_kind, draft, tree, prompt, max_new_tokens, sampling=None, eos=()):
    controller = CyclingController() if tree.auto else None
    drafter = None if tree.method == "ar" else make_drafter(drafter_kind, draft, VOCAB)
    pipeline = Pipeline(CausalLM(target), drafter, make_builder(tree), sampling or SamplingConfig(), controller)
    stop = StopCondition(max_new_tokens=max_new_tokens, eos_token_ids=frozenset(eos))
    return pipeline, torch.tensor(prompt), stop, DecodeStats(method=tree.label)


def batched(target, parts):
    outputs = [[] for _ in parts]
    for index, token in decode_batch(CausalLM(target), parts):
        outputs[index].append(token)
    return outputs


@pytest.mark.parametrize("pair_name", ["llama_pair", "qwen_pair"])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_batched_greedy_equals_each_request_alone(request, pair_name, drafter_kind, tree):
    target, draft = request.getfixturevalue(pair_name)
    parts = [request_parts(target, drafter_kind, draft, tree, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    outputs = batched(target, parts)
    for prompt, length, output, (_, _, stop, stats) in zip(PROMPTS, LENGTHS, outputs, parts):
        assert output == plain_greedy(target, prompt, length), (tree.label, prompt)
        assert stats.new_tokens == length and stop.reason == "max_new_tokens"
        assert stats.target_forwards >= 1 and stats.committed >= length


def test_mixed_methods_in_one_batch_and_eos(llama_pair):
    target, draft = llama_pair
    expected = plain_greedy(target, PROMPTS[0], 60)
    eos = expected[9]  # the first request stops at its first occurrence, the others run on
    trees = [TreeConfig("ar"), TreeConfig("talon", budget=16, topk=4), TreeConfig("chain", depth=3),
             TreeConfig("talon", budget="auto", topk=4)]
    parts = [request_parts(target, "model", draft, tree, PROMPTS[i % len(PROMPTS)], 30, eos=(eos,) if i == 0 else ())
             for i, tree in enumerate(trees)]
    outputs = batched(target, parts)
    assert outputs[0] == plain_greedy(target, PROMPTS[0], 30, eos=eos) and outputs[0][-1] == eos
    assert parts[0][2].reason == "eos"
    for i in range(1, 4):
        assert outputs[i] == plain_greedy(target, PROMPTS[i % len(PROMPTS)], 30)


def test_requests_join_mid_generation(qwen_pair):
    target, draft = qwen_pair
    tree = TreeConfig("talon", budget=12, topk=3)
    decoder = BatchDecoder(CausalLM(target))
    outputs: dict[int, list[int]] = {}
    parts = [request_parts(target, "model", draft, tree, p, n) for p, n in zip(PROMPTS, (30, 20, 25, 9))]
    ids = {id(decoder.add(*parts[0])): 0}
    steps = 0
    while decoder.requests or len(ids) < len(parts):
        if steps in (2, 3, 7) and len(ids) < len(parts):  # a newcomer joins between steps
            ids[id(decoder.add(*parts[len(ids)]))] = len(ids)
        for req, tokens in decoder.step():
            outputs.setdefault(ids[id(req)], []).extend(tokens)
        steps += 1
    for i, (prompt, length) in enumerate(zip(PROMPTS, (30, 20, 25, 9))):
        assert outputs[i] == plain_greedy(target, prompt, length), i


@pytest.mark.parametrize("tree", [TreeConfig("ar"), TreeConfig("talon", budget=16, topk=4)], ids=lambda t: t.label)
def test_batched_sampling_equals_each_request_alone(llama_pair, tree):
    """Seeded sampling keys each position's draw by (seed, position): a batch gives each request its own text."""
    target, draft = llama_pair
    samplings = [SamplingConfig(do_sample=True, temperature=1.0, seed=seed) for seed in (3, 4, 3, 9)]
    parts = [request_parts(target, "model", draft, tree, p, 20, sampling=s) for p, s in zip(PROMPTS, samplings)]
    outputs = batched(target, parts)
    for prompt, sampling, output in zip(PROMPTS, samplings, outputs):
        alone, _ = run(target, make_drafter("model", draft, VOCAB), TreeConfig("ar"), prompt, 20, sampling=sampling)
        assert output == alone


def test_remove_leaves_the_others_intact(llama_pair):
    target, draft = llama_pair
    tree = TreeConfig("talon", budget=8, topk=2)
    decoder = BatchDecoder(CausalLM(target))
    parts = [request_parts(target, "model", draft, tree, p, 24) for p in PROMPTS[:3]]
    requests = [decoder.add(*part) for part in parts]
    outputs = {id(r): [] for r in requests}
    for req, tokens in decoder.step():
        outputs[id(req)].extend(tokens)
    decoder.remove(requests[1])  # the client went away
    assert parts[1][3].seconds_total > 0
    while decoder.requests:
        for req, tokens in decoder.step():
            outputs[id(req)].extend(tokens)
    for i in (0, 2):
        assert outputs[id(requests[i])] == plain_greedy(target, PROMPTS[i], 24)


def test_a_request_that_fails_to_start_leaves_the_batch_as_it_was(llama_pair):
    target, draft = llama_pair
    tree = TreeConfig("talon", budget=8, topk=2)
    decoder = BatchDecoder(CausalLM(target))
    running = decoder.add(*request_parts(target, "model", draft, tree, PROMPTS[0], 24))
    outputs = [token for _, tokens in decoder.step() for token in tokens]
    pipeline, _, stop, stats = request_parts(target, "model", draft, tree, PROMPTS[1], 24)
    with pytest.raises(Exception):
        decoder.add(pipeline, torch.tensor([], dtype=torch.long), stop, stats)  # no prompt: its prefill fails
    assert decoder.requests == [running] and len(decoder.cache.lengths) == 1
    assert [len(group.rows) for group in decoder.groups.values()] == [1]  # no orphan draft row
    assert isinstance(pipeline.drafter.lm, CausalLM)
    while decoder.requests:
        outputs += [token for _, tokens in decoder.step() for token in tokens]
    assert outputs == plain_greedy(target, PROMPTS[0], 24)


def test_batch_refuses_another_target(llama_pair, qwen_pair):
    decoder = BatchDecoder(CausalLM(llama_pair[0]))
    with pytest.raises(TalonError, match="pipeline"):
        decoder.add(*request_parts(qwen_pair[0], "model", qwen_pair[1], TreeConfig("ar"), [5, 6], 4))
    assert decoder.requests == [] and decoder.cache.lengths == []


def test_batch_refuses_sliding_window_layers():
    model = tiny_model("qwen2", seed=2)
    model.config.layer_types = ["sliding_attention", "full_attention"]
    model.config.sliding_window = 8
    model.config.use_sliding_window = True
    with pytest.raises(TalonError, match="sliding"):
        BatchDecoder(CausalLM(model))


def test_generate_batch_equals_generate(llama_pair):
    from talon_sd import SpeculativeGenerator

    target, draft = llama_pair
    generator = SpeculativeGenerator.from_models(target, draft, tree="talon", budget="auto")
    options = dict(max_new_tokens=[24, 9, 16], do_sample=[False, True, True], seed=[0, 5, 6], temperature=0.8)
    results = generator.generate_batch(PROMPTS[:3], **options)
    for i, (prompt, result) in enumerate(zip(PROMPTS[:3], results)):
        alone = generator.generate(input_ids=prompt, **{k: v[i] if isinstance(v, list) else v for k, v in options.items()})
        assert result.token_ids == alone.token_ids and result.finish_reason == alone.finish_reason == "length"
        assert result.stats.new_tokens == len(result.token_ids) == options["max_new_tokens"][i]
    learned = generator.controller_memory()
    generator.generate_batch(PROMPTS[:2], max_new_tokens=8)
    assert generator.controller_memory() == learned  # a batch does not change what later calls start from


def test_generate_batch_checks_every_request_first(llama_pair):
    from talon_sd import SpeculativeGenerator

    generator = SpeculativeGenerator.from_models(*llama_pair, tree="talon", budget=8)
    with pytest.raises(TalonError, match="max_new_tokens"):
        generator.generate_batch([[5, 6], [7, 8]], max_new_tokens=[4, 5, 6])
    with pytest.raises(TalonError, match="temperature"):
        generator.generate_batch([[5, 6], [7, 8]], do_sample=True, temperature=[1.0, -1.0])
    with pytest.raises(TalonError, match="prompts"):
        generator.generate_batch([])


def test_draft_lm_forwards_are_shared_by_the_batch(llama_pair):
    """The draft LM forwards every request's frontier of a tree layer at once: fewer model calls than forwards."""
    target, draft = llama_pair
    calls = []
    hook = draft.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        tree = TreeConfig("talon", budget=16, topk=4)
        parts = [request_parts(target, "model", draft, tree, p, n) for p, n in zip(PROMPTS, LENGTHS)]
        outputs = batched(target, parts)
    finally:
        hook.remove()
    assert outputs == [plain_greedy(target, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    forwards = sum(stats.draft_forwards for *_, stats in parts)
    assert 0 < len(calls) < forwards
    assert all(isinstance(pipeline.drafter.lm, CausalLM) for pipeline, *_ in parts)  # given back on leaving


def learned_controller(target, draft, prompt):
    """A real online controller after one request alone on the tiny pair (its values and costs learned)."""
    from talon_sd.control import BudgetController, ControllerSettings

    from talon_sd.control import CostCurve

    controller = BudgetController(ControllerSettings(max_budget=24, initial_budget=8, exploration=0.0))
    run(target, make_drafter("model", draft, VOCAB), TreeConfig("talon", budget="auto", topk=4), prompt, 48,
        controller=controller)
    controller.verify, controller.draft, controller.other = CostCurve(), CostCurve(), CostCurve()
    for size in (1, 2, 4, 8, 16, 24):  # machine-free costs (flat): its own choice drafts, and never explores
        controller.verify.add(size, 0.01)
        controller.draft.add(size, 0.001)
        controller.other.add(size, 0.0)
    return controller


@pytest.mark.parametrize("rows_dear,catch_up_dear,drafting_measured_slower",
                         [(True, False, False), (False, False, False), (False, True, False), (False, False, True)],
                         ids=["dear rows", "flat rows", "flat rows, dear catch-up", "flat rows, drafting measured slower"])
def test_the_batch_shares_one_verify_budget(llama_pair, rows_dear, catch_up_dear, drafting_measured_slower):
    """Where every verified row costs what a plain step does, the shared budget runs every request plain; where
    rows are free, it drafts, unless a request's draft LM must first catch up a prompt that costs more than
    drafting gains, or the batch's own drafted steps measured fewer tokens per second than its plain steps.
    Outputs stay each request's own either way."""
    from talon_sd.control import CostCurve

    target, draft = llama_pair
    controllers = [learned_controller(target, draft, prompt) for prompt in PROMPTS[:3]]
    assert all(len(c.expected_tokens()) > 1 for c in controllers)
    if catch_up_dear:  # the draft LM's rows, as each request's controller measured them: one second each
        for controller in controllers:
            controller.draft = CostCurve()
            for rows in (1, 2, 4, 8, 16, 32):
                controller.draft.add(rows, 1.0 * rows)
    decoder = BatchDecoder(CausalLM(target))
    parts = []
    for controller, prompt in zip(controllers, PROMPTS[:3]):
        pipeline, ids, stop, stats = request_parts(target, "model", draft, TreeConfig("ar"), prompt, 20)
        pipeline = Pipeline(pipeline.target, make_drafter("model", draft, VOCAB),
                            make_builder(TreeConfig("talon", budget="auto", topk=4)), SamplingConfig(),
                            controller.for_next_sequence())
        parts.append((pipeline, ids, stop, stats))
        decoder.add(pipeline, ids, stop, stats)
    decoder.verify_cost, decoder.draft_cost = CostCurve(), CostCurve()
    for rows in range(1, 80):  # seconds by rows: a plain step's price per row, or one price for any count
        decoder.verify_cost.add(rows, 1.0 * rows if rows_dear else 1.0)
        decoder.draft_cost.add(rows, 0.01)
    for _ in range(4):  # whole steps as measured: plain ones at 3 tokens a second; drafted ones at 2 if measured
        decoder.measured.add(3, PLAIN, 3, 1.0)
        if drafting_measured_slower:
            decoder.measured.add(3, "model", 4, 2.0)
    outputs = {i: [] for i in range(3)}
    pipelines = [part[0] for part in parts]
    first = True
    while decoder.requests:
        for req, tokens in decoder.step():
            outputs[pipelines.index(req.pipeline)].extend(tokens)
        if first:  # the first step's shared budgets: from the costs above alone
            budgets = [stats.budgets[0] for *_, stats in parts]
            if rows_dear or drafting_measured_slower:
                assert budgets == [1, 1, 1]
            elif catch_up_dear:  # the first two have prompts to catch up (the third's is one token: nothing)
                assert budgets[:2] == [1, 1]
            else:
                assert max(budgets) > 1
            first = False
    for i, prompt in enumerate(PROMPTS[:3]):
        assert outputs[i] == plain_greedy(target, prompt, 20)


def test_requests_switch_between_draft_lm_n_gram_and_plain_steps_exactly(llama_pair):
    """A request with an n-gram ``alternate`` drafts with whichever kind the batch's check chooses each step (here
    forced in turn: n-gram, draft LM, plain, ...): both drafters see every commit (the draft LM catches up what the
    n-gram and plain steps committed), and each output stays the request's own."""
    from talon_sd.batch import StepRates

    class Turns(StepRates):
        def __init__(self):
            super().__init__()
            self.chosen = []

        def choose(self, size, catch_ups, predicted=frozenset(), tokens_left=0):
            assert list(catch_ups) == ["ngram", "model"] or catch_ups["ngram"] == catch_ups["model"] == 0.0
            assert list(catch_ups.values()) == sorted(catch_ups.values())
            self.chosen.append(("ngram", "model", PLAIN)[len(self.chosen) % 3])
            return self.chosen[-1]

    target, draft = llama_pair
    decoder = BatchDecoder(CausalLM(target))
    decoder.measured = Turns()
    tree = TreeConfig("talon", budget="auto", topk=4)
    parts, drafted = [], {"ngram": 0, "model": 0}
    for prompt, length in zip(PROMPTS, LENGTHS):
        pipeline, ids, stop, stats = request_parts(target, "model", draft, tree, prompt, length)
        alternate = Pipeline(pipeline.target, make_drafter("ngram", draft, VOCAB), make_builder(tree),
                             SamplingConfig(), CyclingController())
        parts.append((pipeline, ids, stop, stats))
        decoder.add(pipeline, ids, stop, stats, alternate)
    outputs = {i: [] for i in range(len(parts))}
    pipelines = [part[0] for part in parts]
    while decoder.requests:
        for req, tokens in decoder.step():
            outputs[pipelines.index(req.pipelines[0])].extend(tokens)
            if req.stats.tree_sizes and req.stats.tree_sizes[-1] > 1:
                drafted[req.pipeline.drafter.name] += 1
    assert drafted["ngram"] > 0 and drafted["model"] > 0
    for i, (prompt, length) in enumerate(zip(PROMPTS, LENGTHS)):
        assert outputs[i] == plain_greedy(target, prompt, length)


def test_a_kind_is_measured_by_its_steps_whatever_trees_they_built(llama_pair):
    """Steps the check ran with the n-gram drafter count as n-gram steps even where no n-gram matched (root-only
    trees): counted as plain, they would make plain look slower and the n-gram kind luckier than they are."""
    from talon_sd.batch import StepRates

    class NgramOnly(StepRates):
        def choose(self, size, catch_ups, predicted=frozenset(), tokens_left=0):
            return "ngram"

    target, draft = llama_pair
    decoder = BatchDecoder(CausalLM(target))
    decoder.measured = NgramOnly()
    tree = TreeConfig("talon", budget="auto", topk=4)
    parts = []
    for prompt in ([40], [41]):  # nothing repeats yet: no n-gram matches at first
        pipeline, ids, stop, stats = request_parts(target, "model", draft, tree, prompt, 64)
        alternate = Pipeline(pipeline.target, make_drafter("ngram", draft, VOCAB), make_builder(tree),
                             SamplingConfig(), CyclingController())
        parts.append(stats)
        decoder.add(pipeline, ids, stop, stats, alternate)
    for _ in range(4):
        decoder.step()
    assert 1 in parts[0].tree_sizes  # a step whose n-gram tree was the root alone
    assert decoder.measured.rate(2, "ngram") is not None and decoder.measured.rate(2, PLAIN) is None


def test_step_rates_choose_the_fastest_kind_and_try_the_cheapest_first():
    from talon_sd.batch import StepRates

    rates = StepRates(exploration=1.0)
    for _ in range(4):
        rates.add(2, PLAIN, 2, 0.2)  # 10 tokens a second; credit 0.8 s
    catch_ups = {"ngram": 0.0, "model": 0.5}
    assert rates.choose(2, catch_ups) == "ngram"  # unmeasured, and no catch-up to pay
    for _ in range(4):
        rates.add(2, "ngram", 3, 0.2)  # 15
    assert rates.choose(2, catch_ups) == "model"  # unmeasured, the credit covers its catch-up
    assert rates.choose(2, {"ngram": 0.0, "model": 100.0}) == "ngram"  # it does not: the fastest measured
    for _ in range(4):
        rates.add(2, "model", 4, 0.2)  # 20
    assert rates.choose(2, catch_ups) == "model"
    for _ in range(4):
        rates.add(2, "model", 1, 0.2)  # the last four steps: 12.5 a second, below n-gram's 15
    assert rates.choose(2, catch_ups) == "ngram"


def test_a_fresh_batch_measures_plain_steps_before_it_drafts(llama_pair):
    """Nothing measured yet: the first steps of a batch whose rows are free are plain all the same (a plain
    step costs what batched plain decoding does), then the shared budget's model gets its say."""
    from talon_sd.control import CostCurve

    target, draft = llama_pair
    decoder = BatchDecoder(CausalLM(target))
    parts = []
    for prompt in PROMPTS[:3]:
        pipeline, ids, stop, stats = request_parts(target, "model", draft, TreeConfig("ar"), prompt, 12)
        pipeline = Pipeline(pipeline.target, make_drafter("model", draft, VOCAB),
                            make_builder(TreeConfig("talon", budget="auto", topk=4)), SamplingConfig(),
                            learned_controller(target, draft, prompt).for_next_sequence())
        parts.append((pipeline, ids, stop, stats))
        decoder.add(pipeline, ids, stop, stats)
    for _ in range(4):
        decoder.step()
    assert all(stats.budgets == [1, 1, 1, 1] for *_, stats in parts)
    decoder.verify_cost, decoder.draft_cost = CostCurve(), CostCurve()
    for rows in range(1, 80):  # any number of rows for the price of one
        decoder.verify_cost.add(rows, 1.0)
        decoder.draft_cost.add(rows, 0.01)
    decoder.step()
    assert max(stats.budgets[4] for *_, stats in parts) > 1


def pays(rates, size: int, catch_up: float = 0.0) -> bool:
    """Whether a batch of ``size`` whose requests draft with draft LMs only drafts next."""
    return rates.choose(size, {"model": catch_up}) == "model"


def test_step_rates_check_drafting_against_plain_and_measure_again():
    from talon_sd.batch import StepRates

    rates = StepRates(refresh=8, exploration=0.1)
    assert not pays(rates, 2)  # plain first
    for _ in range(4):
        rates.add(2, PLAIN, 2, 0.2)  # 10 tokens a second
    assert pays(rates, 2) and not pays(rates, 3)  # by batch size; the credit: 0.08 s
    assert not pays(rates, 2, catch_up=0.1)  # not while the credit cannot pay the draft LMs' catch-up
    rates.add(2, "model", 3, 0.2, catch_up=1.5)  # 15 tokens a second, but the catch-up lost 1.4 s
    assert not pays(rates, 2)  # drafting unmeasured (1 step of 4) and the credit spent
    for _ in range(3):
        rates.add(2, "model", 3, 0.4)  # 7.5
    assert not pays(rates, 2)  # measured slower
    for _ in range(8):
        rates.add(2, PLAIN, 2, 1.0)
    assert rates.rate(2, "model") is None and not pays(rates, 2)  # its figure dropped; no credit yet
    for _ in range(8):
        rates.add(2, PLAIN, 2, 1.0)
    assert pays(rates, 2)  # credit earned back: drafting measured again
    for _ in range(4):
        rates.add(2, "model", 3, 0.5)  # 6 tokens a second against plain's 2
    assert pays(rates, 2)
    for _ in range(8):
        rates.add(2, "model", 3, 0.5)
    assert not pays(rates, 2)  # plain's figure is old: measured again first


@pytest.mark.parametrize("drafted_seconds,tried_at_3", [(0.4, False), (0.2, True)])
def test_drafting_slower_with_fewer_requests_is_not_tried_with_more(drafted_seconds, tried_at_3):
    from talon_sd.batch import StepRates

    rates = StepRates(exploration=1.0)  # credit to spare: only the measurements decide
    for size in (2, 3):
        for _ in range(4):
            rates.add(size, PLAIN, size, 0.2)
    for _ in range(4):
        rates.add(2, "model", 3, drafted_seconds)  # 7.5 or 15 tokens a second against plain's 10
    assert pays(rates, 2) is tried_at_3
    assert pays(rates, 3) is tried_at_3


def test_step_seconds_prices_rows_and_lockstep_forwards():
    from talon_sd.batch import step_seconds
    from talon_sd.control import BudgetController, CostCurve

    verify, draft = CostCurve(), CostCurve()
    for rows in (1, 2, 4, 8, 16, 32):
        verify.add(rows, 0.1 * rows)
        draft.add(rows, 0.01 * rows)
    fresh = [BudgetController(), BudgetController()]
    assert step_seconds([1, 1], fresh, [], verify, draft) == pytest.approx(0.2)
    assert step_seconds([1, 1], fresh, [1, 1], verify, draft) == pytest.approx(0.4)
    assert step_seconds([1, 1], fresh, [3], verify, draft) == pytest.approx(0.9)  # padded: 3 rows x 3 requests
    # two trees of 16: 32 rows verified; log2(16) = 4 lockstep forwards of 2 x 15 / 4 rows each
    assert step_seconds([16, 16], fresh, [], verify, draft) == pytest.approx(3.2 + 4 * 0.01 * 7.5)


def test_step_rates_try_a_kind_the_shared_model_predicts_within_the_batchs_exploration_share():
    """Where the shared model predicts a drafting kind a gain, its first measurement at a batch size may also
    spend the exploration share of the batch's plain time to come; measured once, only the credit pays again."""
    from talon_sd.batch import StepRates

    rates = StepRates(exploration=0.1)
    for _ in range(4):
        rates.add(2, PLAIN, 2, 0.2)  # 10 tokens a second; credit 0.08 s
    assert rates.choose(2, {"model": 0.5}) == PLAIN  # the credit alone does not cover the catch-up
    assert rates.choose(2, {"model": 0.5}, {"model"}, tokens_left=100) == "model"  # 0.08 + 0.1 x 100 / 10 s do
    assert rates.choose(2, {"model": 2.0}, {"model"}, tokens_left=100) == PLAIN  # a catch-up dearer than that
    for step in range(3):
        rates.add(2, "model", 1, 0.2, catch_up=0.5 if step == 0 else 0.0)  # a trial that loses: 5 tokens a second
        assert rates.choose(2, {"model": 0.0}, {"model"}, tokens_left=100) == "model"  # on until measured
    rates.add(2, "model", 1, 0.2)
    assert rates.choose(2, {"model": 0.0}, {"model"}, tokens_left=100) == PLAIN  # measured slower
