"""The benchmark, the sweep and the tuner on tiny random models (no download, seconds on 2 cores).

Timings are never asserted: only that every method runs, outputs are lossless where the library
guarantees it, and the files (results.json, outputs.jsonl, report.md, plots) are complete and valid.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter

import pytest
import torch

from conftest import noisy_copy, tiny_model
from talon_sd.bench import cli as bench_cli
from talon_sd.bench.datasets import DATASETS, load_jsonl, load_prompts, parse_dataset_names, prompts_from_ids
from talon_sd.bench.llamacpp import LLAMACPP_METHODS
from talon_sd.bench.methods import METHODS, Decoding, Outcome, bench_variants, parse_methods
from talon_sd.bench.results import SCHEMA, build_results, summarize
from talon_sd.bench.runner import SampleRecord, run_bench
from talon_sd.bench.tune import (AcceptancePoint, ForwardCosts, choose_budget, coordinate_search,
                                 predicted_tokens_per_s, tuned_tree_options)
from talon_sd.cli import main
from talon_sd.config import TreeConfig
from talon_sd.control import REASONS
from talon_sd.errors import TalonError
from talon_sd.generator import SpeculativeGenerator
from talon_sd.stats import DecodeStats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class WordTokenizer:
    """A stand-in tokenizer: one id per whitespace-separated word (hashed into the tiny vocabulary),
    a chat template that marks each message with id 0, and a decode that names the ids."""

    chat_template = "word-hash"
    eos_token_id = 1

    def __init__(self, vocab: int = 96, max_tokens: int = 160) -> None:
        self.vocab, self.max_tokens = vocab, max_tokens

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        ids = []
        for message in messages:
            ids += [0] + [3 + sum(map(ord, word)) % (self.vocab - 3) for word in message["content"].split()]
        return ids[-self.max_tokens:]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids if not (skip_special_tokens and i < 3))


@pytest.fixture(scope="module")
def generator():
    target = tiny_model("qwen2", seed=3)
    return SpeculativeGenerator.from_models(target, noisy_copy(target, 0.3, seed=4), WordTokenizer(), tree="talon")


@pytest.fixture(autouse=True)
def one_thread_and_own_cache(monkeypatch, tmp_path):
    """One torch thread (tiny models gain nothing from two, and lose a lot when the other core is
    busy), profiles in a temporary cache; both undone after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def use_generator(monkeypatch, generator):
    """Make the CLI use the tiny generator instead of loading the packaged models."""
    monkeypatch.setattr(bench_cli, "_load_generator", lambda args: generator)
    return generator


@pytest.fixture
def no_models(monkeypatch):
    """Fail the test if the CLI tries to load models (bad arguments must be caught before)."""
    def refuse(args):
        raise AssertionError("models loaded before the arguments were checked")

    monkeypatch.setattr(bench_cli, "_load_generator", refuse)


OURS = tuple(m for m in METHODS if m not in LLAMACPP_METHODS)  # the methods that run without llama-cpp-python

# ------------------------------------------------------------------------------------------ bench


def test_bench_cli_runs_every_method_end_to_end(use_generator, tmp_path, capsys):
    """Every method but the llama.cpp ones (their own test: they need llama-cpp-python and a GGUF target)."""
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"question_id": 7, "turns": ["Write a haiku about tiny models."]}) + "\n")
    out = tmp_path / "run"
    status = main(["bench", "--datasets", "mt_bench", "--data", str(data), "--limit", "1", "--max-new-tokens", "16",
                   "--methods", ",".join(OURS), "--threads", "1", "--warmup-tokens", "4", "--no-progress",
                   "--out", str(out)])
    assert status == 0
    table = capsys.readouterr().out
    assert "talon" in table and "hf-assisted" in table

    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == SCHEMA and results["kind"] == "bench"
    assert results["command"].startswith("talon bench") and "--max-new-tokens 16" in results["command"]
    for key in ("cpu", "available_cores", "torch_threads"):
        assert key in results["machine"]
    assert results["versions"]["torch"] == torch.__version__
    settings = results["settings"]
    assert settings["mode"] == "greedy" and settings["threads"] == 1 and settings["dtype"] == "float32"
    assert settings["hf_assistant"]["num_assistant_tokens"] is not None
    assert [v["label"] for v in results["variants"]] == list(OURS)
    assert results["variants"][-1]["tree"]["budget"] == TreeConfig("talon").budget

    # 2 prompts: MT-Bench #81 (two turns, the second after ar's own answer) and the data file's one.
    samples = results["samples"]
    assert len(samples) == 3 * len(OURS)
    assert {(s["dataset"], s["turn"]) for s in samples} == {("mt_bench", 1), ("mt_bench", 2), ("mine", 1)}
    first, second = (next(s for s in samples if s["label"] == "ar" and s["turn"] == t and s["dataset"] == "mt_bench")
                     for t in (1, 2))
    assert second["prompt_tokens"] > first["prompt_tokens"]
    assert all(s["new_tokens"] >= 1 and s["seconds"] > 0 for s in samples)

    rows = {(r["dataset"], r["label"]): r for r in results["summary"]}
    assert set(rows) == {(d, m) for d in ("mt_bench", "mine", "all") for m in OURS}
    for dataset in ("mt_bench", "mine", "all"):
        assert rows[(dataset, "ar")]["speedup"] == pytest.approx(1.0)
        for method in ("ar", "chain", "static", "eagle", "talon"):  # lossless: greedy = ar, token for token
            row = rows[(dataset, method)]
            assert row["identical_to_ar"] == 1.0
            assert row["mat"] >= 1.0 and set(row["time_share"]) == {"prefill", "draft", "build", "verify", "other"}
            assert row["mean_layer_width"][0] == 1.0 and row["speedup_median"] > 0
            assert row["speedup_same_length"] == pytest.approx(row["speedup"], abs=2e-4)  # the same lengths
        for method in ("hf", "hf-assisted"):
            row = rows[(dataset, method)]
            assert row["mat"] is None and row["tokens_per_s"] > 0 and 0.0 <= row["identical_to_ar"] <= 1.0
            assert row["speedup_same_length"] is None  # no prefill seconds to keep apart
    assert rows[("all", "talon")]["depth_acceptance"] and rows[("all", "talon")]["tree_depth_hist"]

    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert len(outputs) == len(samples) and all("text" in o and o["token_ids"] for o in outputs)
    for name in ("speedup", "tree_shape", "mat_delta"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert results["command"] in report and "](plots/speedup.png)" in report and "## Goals" in report


def test_bench_in_sampling_mode_from_python(generator):
    prompts = prompts_from_ids("ids", [[5, 17, 42, 8, 9], [33, 12, 7]])
    variants = bench_variants(["hf", "talon", "eagle"])
    decoding = Decoding(max_new_tokens=10, temperature=1.0, seed=3)
    records = run_bench(generator, prompts, variants, decoding, warmup_tokens=0, progress=False)
    assert [r.label for r in records[:3]] == ["ar", "hf", "talon", "eagle"][:3]
    assert len(records) == 2 * 4 and all(r.identical_to_ar is None for r in records)
    assert {r.seed for r in records if r.index == 1} == {4}  # one seed per prompt, shared by every method
    results = build_results(records, variants, decoding, {}, generator=generator)
    assert results["settings"]["mode"] == "sample"
    assert all(row["identical_to_ar"] is None and row["speedup"] > 0 for row in results["summary"])
    json.dumps(results)


def test_speedup_at_ars_lengths_keeps_the_prefill_whole_and_scales_the_decoding():
    # Sampling. Prompt 0: ar wrote 100 tokens in 60 s (20 s of prefill), talon 50 in 35 s (20 s of prefill, 15 s
    # decoding): tokens/s reads 0.857x; at ar's length talon would take 20 + 15 * 100 / 50 = 50 s. Prompt 1: ar 20
    # tokens in 12 s (2 s of prefill), talon 40 in 18 s (3 s of prefill): at ar's length 3 + 15 * 20 / 40 = 10.5 s.
    # Prompt 2: talon wrote no token (left out); prompt 3: ar has no sample (left out).
    def record(index: int, label: str, tokens: int, seconds: float, prefill: float | None) -> SampleRecord:
        stats = None if prefill is None else DecodeStats(method=label, seconds_prefill=prefill)
        return SampleRecord(index=index, dataset="sum", question_id=str(index), turn=1, label=label, method=label,
                            prompt_tokens=700, seed=0, outcome=Outcome(list(range(tokens)), seconds, stats), text="",
                            identical_to_ar=None)

    variants = bench_variants(["talon", "hf"])
    records = [record(0, "ar", 100, 60.0, 20.0), record(0, "talon", 50, 35.0, 20.0), record(0, "hf", 100, 55.0, None),
               record(1, "ar", 20, 12.0, 2.0), record(1, "talon", 40, 18.0, 3.0),
               record(2, "ar", 30, 15.0, 2.0), record(2, "talon", 0, 2.5, 2.5), record(3, "talon", 10, 5.0, 1.0)]
    rows = {row["label"]: row for row in summarize(records, variants, greedy=False)}
    assert rows["talon"]["speedup_same_length"] == pytest.approx((60 + 12) / (50 + 10.5), abs=1e-4)
    assert rows["ar"]["speedup_same_length"] == pytest.approx(1.0) and rows["hf"]["speedup_same_length"] is None
    only = [r for r in records if r.index == 0 and r.label != "hf"]
    row = {row["label"]: row for row in summarize(only, variants, greedy=False)}["talon"]
    assert row["speedup"] == pytest.approx((50 / 35) / (100 / 60), abs=1e-4)  # 0.857x by tokens/s
    assert row["speedup_same_length"] == pytest.approx(1.2)


def test_the_warm_up_teaches_the_online_controllers_nothing(generator, monkeypatch):
    from talon_sd.bench import runner

    prompts = prompts_from_ids("ids", [[5, 17, 42, 8, 9], [33, 12, 7]])
    variants = bench_variants(["talon"], {"talon": {"budget": "auto"}})
    runs = []  # (label, max_new_tokens, controller memory at the start, at the end) of every run
    ran = runner.run_variant

    def watched(generator_, variant, ids, decoding, seed):
        start = generator_.controller_memory()
        outcome = ran(generator_, variant, ids, decoding, seed)
        runs.append((variant.label, decoding.max_new_tokens, start, generator_.controller_memory()))
        return outcome

    monkeypatch.setattr(runner, "run_variant", watched)
    kept = generator.controller_memory()
    generator.restore_controller_memory({})  # the bench is given fresh controllers
    try:
        run_bench(generator, prompts, variants, Decoding(max_new_tokens=10), warmup_tokens=6, progress=False)
    finally:
        generator.restore_controller_memory(kept)
    warm = [run for run in runs if run[1] == 6]
    timed_talon = [run for run in runs if run[1] == 10 and run[0] == "talon"]
    assert [run[0] for run in warm] == ["ar", "talon"] and len(timed_talon) == 2
    key = ("talon", "model", False)
    assert key in warm[1][3]  # the warm-up's auto-budget run learned a controller ...
    assert timed_talon[0][2] == {}  # ... which the first timed run does not start from
    assert key in timed_talon[1][2]  # the timed runs carry what they learn, as before


def test_sweep_cli_plots_speedup_against_budget(use_generator, tmp_path):
    out = tmp_path / "sweep"
    status = main(["sweep", "--datasets", "gsm8k", "--limit", "1", "--max-new-tokens", "8", "--budgets", "4,8",
                   "--mus", "0.03,0.1", "--eagle-depths", "2", "--threads", "1", "--no-progress", "--out", str(out)])
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    labels = [v["label"] for v in results["variants"]]
    assert results["kind"] == "sweep" and labels[0] == "ar" and len(labels) == 1 + 2 * 2 + 2
    assert "talon(N=8,K=4,mu=0.1)" in labels and "eagle(N=4,K=4,D=2)" in labels
    assert (out / "plots" / "sweep.png").read_bytes()[:8] == PNG_MAGIC
    assert "](plots/sweep.png)" in (out / "report.md").read_text()


def test_sweep_with_auto_runs_the_controller_beside_fixed_budgets(use_generator, tmp_path):
    out = tmp_path / "sweep-auto"
    status = main(["sweep", "--datasets", "gsm8k,qa", "--limit", "1", "--max-new-tokens", "24", "--budgets", "auto,4",
                   "--methods", "talon,chain", "--threads", "1", "--no-progress", "--out", str(out)])
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    labels = [v["label"] for v in results["variants"]]
    assert labels == ["ar", "talon(N=auto,K=4,mu=0.03)", "talon(N=4,K=4,mu=0.03)", "chain(k=auto)", "chain(k=3)"]
    auto = [s for s in results["samples"] if s["label"] == "talon(N=auto,K=4,mu=0.03)"]
    assert all(s["identical_to_ar"] for s in results["samples"] if s["label"] != "ar")
    assert all(sum(s["stats"]["budget_hist"].values()) == s["stats"]["target_forwards"] for s in auto)
    # every online step says why it got its budget; fixed budgets say nothing
    assert all(sum(s["stats"]["reason_hist"].values()) == s["stats"]["target_forwards"] for s in auto)
    assert all(set(s["stats"]["reason_hist"]) <= set(REASONS) for s in auto)
    fixed = [s for s in results["samples"] if s["label"] == "talon(N=4,K=4,mu=0.03)"]
    assert all(s["stats"]["reason_hist"] == {} and s["stats"]["reasons"] == [] for s in fixed)
    rows = {(r["dataset"], r["label"]): r for r in results["summary"]}
    assert rows[("all", "talon(N=auto,K=4,mu=0.03)")]["reason_hist"] == dict(sorted(sum(
        (Counter(s["stats"]["reason_hist"]) for s in auto), Counter()).items()))
    assert rows[("all", "talon(N=4,K=4,mu=0.03)")]["reason_hist"] is None
    report = (out / "report.md").read_text()
    assert "## Online budget decisions" in report
    assert report.count("| talon(N=auto,K=4,mu=0.03) |") == len(auto) + 3  # per dataset (2) and all, then per request
    assert (out / "plots" / "sweep.png").read_bytes()[:8] == PNG_MAGIC


def test_bench_budget_auto_gives_tree_methods_the_controller(use_generator, tmp_path):
    out = tmp_path / "bench-auto"
    assert main(["bench", "--datasets", "qa", "--limit", "1", "--max-new-tokens", "12", "--budget", "auto",
                 "--methods", "talon,eagle,chain,static", "--threads", "1", "--no-progress", "--no-plots",
                 "--out", str(out), "--static-budget", "6"]) == 0
    trees = {v["label"]: v["tree"] for v in json.loads((out / "results.json").read_text())["variants"]}
    assert trees["talon"]["budget"] == trees["eagle"]["budget"] == trees["chain"]["budget"] == "auto"
    assert trees["static"]["budget"] == 6


def test_bench_without_a_chat_template(monkeypatch, tmp_path, capsys):
    """A base model's tokenizer has no chat template: a clear error, and --no-chat-template sends plain text."""
    target = tiny_model("qwen2", seed=3)

    class PlainTokenizer(WordTokenizer):
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [3 + sum(map(ord, w)) % (self.vocab - 3) for w in text.split()][-self.max_tokens:]}

    plain = SpeculativeGenerator.from_models(target, noisy_copy(target, 0.3, seed=4), PlainTokenizer(), tree="talon")
    raw = SpeculativeGenerator.from_models(target, noisy_copy(target, 0.3, seed=4), PlainTokenizer(), tree="talon",
                                           chat_template=False)
    common = ["bench", "--datasets", "qa", "--limit", "1", "--max-new-tokens", "6", "--methods", "talon", "--threads",
              "1", "--no-progress", "--no-plots"]
    monkeypatch.setattr(bench_cli, "_load_generator", lambda args: plain)
    assert main([*common, "--out", str(tmp_path / "a")]) == 2
    assert "the tokenizer has no chat template (a base model?); run with --no-chat-template" in capsys.readouterr().err
    monkeypatch.setattr(bench_cli, "_load_generator", lambda args: raw)
    assert main([*common, "--no-chat-template", "--out", str(tmp_path / "b")]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["samples"][0]["prompt_tokens"] > 3


# ------------------------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize("argv, message", [
    (["--datasets", "mt_bench,foo"], "datasets: got 'foo', expected some of mt_bench, alpaca"),
    (["--methods", "talon,medusa"], "methods: got 'medusa', expected some of ar, hf, hf-assisted"),
    (["--data", "/nonexistent/prompts.jsonl"], "data: cannot read '/nonexistent/prompts.jsonl'"),
    (["--limit", "0"], "limit: got 0, expected an integer >= 1"),
    (["--limit", "-3"], "limit: got -3, expected an integer >= 1"),
    (["--max-new-tokens", "0"], "max-new-tokens: got 0"),
    (["--talon-budget", "1"], "budget: got 1, expected an integer >= 2"),
    (["--budget", "tuned"], "budget: 'tuned' needs a profile tuned for greedy decoding; run `talon tune"),
    (["--temperature", "nan"], "temperature: got nan, expected a number >= 0"),
    (["--budget", "tuned", "--temperature", "0.8"],
     "budget: 'tuned' needs a profile tuned for sampling (temperature 0.8); run `talon tune"),
])
def test_bench_bad_arguments_fail_before_loading_models(no_models, capsys, argv, message):
    assert main(["bench", "--threads", "1", *argv]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("talon: error: ") and message in error and "\n" not in error


def test_llamacpp_baselines_say_what_they_need_before_running(monkeypatch, no_models_until_checked,
                                                              capsys, tmp_path):
    """Without llama-cpp-python the llama.cpp methods fail before any model loads, naming the install; with it, a
    target that was not loaded from a GGUF file is refused before anything runs."""
    from talon_sd.bench import llamacpp

    common = ["bench", "--threads", "1", "--datasets", "mt_bench", "--limit", "1", "--max-new-tokens", "4",
              "--no-plots", "--no-progress"]
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    assert main([*common, "--methods", "talon,llamacpp", "--out", str(tmp_path / "a")]) == 2
    assert "methods: llamacpp needs llama-cpp-python: pip install llama-cpp-python" in capsys.readouterr().err
    assert no_models_until_checked == []
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    assert main([*common, "--methods", "llamacpp-lookup", "--out", str(tmp_path / "b")]) == 2
    assert "methods: got 'llamacpp-lookup', expected a target loaded from a GGUF file" in capsys.readouterr().err
    assert no_models_until_checked == ["loaded"]
    with pytest.raises(TalonError, match="methods: got 'llamacpp@ngram'"):
        parse_methods("llamacpp@ngram")


@pytest.fixture
def no_models_until_checked(monkeypatch, generator):
    """The tiny generator, recording when the CLI loads it."""
    loads = []
    monkeypatch.setattr(bench_cli, "_load_generator", lambda args: loads.append("loaded") or generator)
    return loads


def test_bad_data_files_and_names_raise_talon_errors(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"turns": ["fine"]}\nnot json\n')
    with pytest.raises(TalonError, match=r"data: line 2 of .* is not valid JSON"):
        load_jsonl(broken)
    no_turns = tmp_path / "no_turns.jsonl"
    no_turns.write_text('{"question": "where are the turns?"}\n')
    with pytest.raises(TalonError, match="not a JSON object with a non-empty 'turns' list"):
        load_jsonl(no_turns)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TalonError, match="holds no prompt"):
        load_jsonl(empty)
    with pytest.raises(TalonError, match="limit: got 0"):
        load_prompts(["gsm8k"], limit=0)
    with pytest.raises(TalonError, match="datasets: none chosen"):
        load_prompts([], limit=1)
    with pytest.raises(TalonError, match="methods: got 'eagle3'"):
        parse_methods("talon,eagle3")
    assert parse_dataset_names("all") == list(DATASETS)


def test_packaged_datasets_load_with_their_attribution():
    prompts = load_prompts(DATASETS, limit=2)
    assert [p.dataset for p in prompts] == [d for d in DATASETS for _ in range(2)]
    assert all(p.turns and all(t.strip() for t in p.turns) for p in prompts)
    assert all(p.num_turns == 2 for p in prompts if p.dataset == "mt_bench")
    import talon_sd

    sources = pathlib.Path(talon_sd.__file__).parent / "data" / "SOURCES.md"
    assert "SafeAILab/EAGLE" in sources.read_text() and "Apache" in sources.read_text()


def test_tune_bad_arguments_fail_before_loading_models(no_models, capsys):
    assert main(["tune", "--threads", "1", "--talon-budgets", "8,x"]) == 2
    assert "talon-budgets: got '8,x', expected comma-separated integers" in capsys.readouterr().err
    assert main(["tune", "--threads", "1", "--talon-mus", "0.03,2"]) == 2
    assert "talon-mus: mu: got 2.0, expected a number in (0, 1]" in capsys.readouterr().err
    assert main(["tune", "--threads", "1", "--methods", "ar"]) == 2
    assert "methods: got 'ar'" in capsys.readouterr().err
    assert main(["tune", "--threads", "1", "--temperature", "-1"]) == 2
    assert "temperature: got -1.0, expected a number >= 0" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ tuner


def cpu_like_costs() -> ForwardCosts:
    """Verification about flat up to 16 tokens, then linear (this CPU, bf16); a cheap draft."""
    verify = {1: 0.160, 4: 0.160, 8: 0.162, 16: 0.170, 32: 0.270, 64: 0.430, 128: 0.730}
    return ForwardCosts(verify=verify, draft={1: 0.020, 8: 0.022, 16: 0.025, 64: 0.060}, draft_root={1: 0.020, 4: 0.021})


def gpu_like_costs() -> ForwardCosts:
    """Verification flat up to 128 tokens (a big GPU), a negligible draft."""
    return ForwardCosts(verify={1: 0.020, 128: 0.021}, draft={1: 0.001, 64: 0.001})


def talon_point(budget: int, mat: float, mu: float = 0.03, layers: int = 3) -> AcceptancePoint:
    """A synthetic calibration: a tree of exactly ``budget`` nodes, ``layers`` draft forwards per step."""
    widths = {min(4, budget - 1): layers - 1} if layers > 1 else {}
    return AcceptancePoint("talon", {"budget": budget, "mu": mu, "topk": 4, "depth": 0}, mat=mat,
                           tree_sizes={budget: 1.0}, draft_widths=widths, root_widths={2: 1.0})


# MAT grows with N and saturates (a longer tree pays off less and less).
ACCEPTANCE_CURVE = [talon_point(n, m) for n, m in ((4, 1.9), (8, 2.4), (16, 2.8), (32, 3.1), (64, 3.3), (96, 3.35))]


def test_choose_budget_picks_the_n_where_verification_stops_being_free():
    choice = choose_budget(cpu_like_costs(), ACCEPTANCE_CURVE)
    assert choice.options["budget"] == 16  # beyond 16 tokens the verify cost grows faster than MAT
    rates = {p.options["budget"]: rate for p, rate in choice.ranking}
    draft_4 = 0.020 + (0.022 - 0.020) * (4 - 1) / (8 - 1)  # two frontier forwards of width 4
    root_2 = 0.020 + (0.021 - 0.020) * (2 - 1) / (4 - 1)  # one root forward of 2 committed tokens
    expected_16 = 2.8 / (0.170 + 2 * draft_4 + root_2)  # MAT / (verify + drafts)
    assert rates[16] == pytest.approx(expected_16)
    assert rates[16] > rates[8] > rates[4] and rates[16] > rates[32] > rates[64]
    assert choice.tokens_per_s == pytest.approx(max(rates.values()))
    # The same acceptance on a machine with flat verification: the biggest tree wins.
    assert choose_budget(gpu_like_costs(), ACCEPTANCE_CURVE).options["budget"] == 96
    # With a tolerance, the smallest tree within that fraction of the best is preferred.
    smallest = min(n for n, rate in rates.items() if rate >= 0.85 * rates[16])
    assert smallest < 16
    assert choose_budget(cpu_like_costs(), ACCEPTANCE_CURVE, tolerance=0.15).options["budget"] == smallest


def test_choose_budget_weighs_draft_forwards_and_mu():
    cost = cpu_like_costs()
    # Same MAT and tree size: the configuration with fewer draft forwards (smaller delta) wins.
    shallow = talon_point(16, 2.8, mu=0.1, layers=2)
    deep = talon_point(16, 2.9, mu=0.01, layers=8)
    assert deep.delta == 8 and shallow.delta == 2
    assert choose_budget(cost, [deep, shallow]).options["mu"] == 0.1
    assert predicted_tokens_per_s(cost, shallow) > predicted_tokens_per_s(cost, deep)
    # Overhead counts too.
    slow_build = AcceptancePoint("talon", {"budget": 16, "mu": 0.1}, 2.8, {16: 1.0}, overhead_seconds=1.0)
    assert choose_budget(cost, [slow_build, shallow]).options["mu"] == 0.1


def test_a_profile_reads_its_costs_as_the_online_controller_does():
    """One cost-curve implementation: the tuner's forward costs are read through talon_sd.control.CostCurve."""
    from talon_sd.control import CostCurve

    costs = ForwardCosts(verify={1: 1.0, 4: 1.0, 8: 3.0}, draft={1: 2.0, 8: 1.0})
    assert costs.verify_seconds(6) == pytest.approx(2.0) and costs.verify_seconds(12) == pytest.approx(5.0)
    for size in (0.5, 3, 6, 12, 40):
        assert costs.verify_seconds(size) == CostCurve(prior=costs.verify)(size)
    assert costs.draft_seconds(16) == pytest.approx(1.5)  # a falling pair of points is read as non-decreasing


def test_coordinate_search_varies_one_option_at_a_time():
    mats = {4: 1.9, 8: 2.4, 16: 2.8, 32: 3.1}
    calls = []

    def calibrate(config: TreeConfig) -> AcceptancePoint:
        calls.append((config.budget, config.mu))
        bonus = 0.2 if config.mu == 0.1 else 0.0  # at the best N, mu = 0.1 accepts a bit more
        return talon_point(config.budget, mats[config.budget] + bonus, mu=config.mu)

    stages = (("budget", (4, 8, 16, 32)), ("mu", (0.01, 0.03, 0.1)))
    choice = coordinate_search("talon", stages, cpu_like_costs(), calibrate)
    assert calls == [(4, 0.03), (8, 0.03), (16, 0.03), (32, 0.03), (16, 0.01), (16, 0.1)]  # (16, 0.03) not redone
    assert choice.options["budget"] == 16 and choice.options["mu"] == 0.1


def test_tuned_profile_round_trip_for_budget_auto(use_generator, generator, tmp_path):
    from talon_sd.bench.profiles import find_profile, profile_key
    from talon_sd.bench.tuner import TuneSettings, profile_table, run_tune

    with pytest.raises(TalonError, match=r"budget: 'tuned' needs a profile tuned for greedy decoding; run `talon tune .*--dtype float32"):
        tuned_tree_options("talon", None, None, "float32")
    assert tuned_tree_options("ar", None, None, "float32") == {}

    settings = TuneSettings(
        verify_sizes=(1, 4, 16), draft_widths=(1, 4), root_widths=(1, 2), repeats=1, calibration_tokens=6,
        stages={"talon": (("budget", (4, 8)), ("mu", (0.1,))), "eagle": (("depth", (2,)), ("budget", (6,)))},
    )
    key = profile_key(None, None, "float32")
    prompt_ids = [torch.tensor([5, 17, 42, 8]), torch.tensor([33, 12, 7])]
    profile = run_tune(generator, ["talon", "eagle"], settings, key, prompt_ids=prompt_ids, progress=False)
    assert set(profile["cost_curve"]["verify"]) == {"1", "4", "16"} and profile["ar"]["mat"] == 1.0
    talon = profile["methods"]["talon"]
    assert len(talon["candidates"]) == 3 and talon["best"]["budget"] in (4, 8)
    assert all(c["predicted_tokens_per_s"] > 0 and c["measured_tokens_per_s"] > 0 for c in talon["candidates"])
    assert "talon" in profile_table(profile)

    from talon_sd.bench.profiles import save_profile

    path = save_profile(profile)
    assert path.parent == tmp_path / "cache" / "profiles" and find_profile(key)[1] == path
    options = tuned_tree_options("talon", None, None, "float32")
    assert options == {k: talon["best"][k] for k in ("budget", "mu", "topk")}
    assert tuned_tree_options("eagle", None, None, "float32")["depth"] == 2
    assert tuned_tree_options("static", None, None, "float32") == {"budget": talon["best"]["budget"]}
    with pytest.raises(TalonError, match="has no chain entry"):
        tuned_tree_options("chain", None, None, "float32")

    # `--budget tuned` in the bench CLI takes those options (threads match the profile's key).
    variants = bench_variants(["talon", "eagle"], {"talon": {"budget": "tuned"}, "eagle": {"budget": "tuned", "topk": 2}},
                              tuned=lambda m: tuned_tree_options(m, None, None, "float32"))
    talon_variant, eagle_variant = variants[1], variants[2]
    assert talon_variant.tuned and talon_variant.tree.budget == talon["best"]["budget"]
    eagle_best = profile["methods"]["eagle"]["best"]
    assert eagle_variant.tree.budget == eagle_best["budget"] and eagle_variant.tree.depth == 2
    assert eagle_variant.tree.topk == 2  # an explicit flag still wins over the profile

    # ... and so does the CLI, recording where they came from.
    out = tmp_path / "auto"
    assert main(["bench", "--dtype", "float32", "--budget", "tuned", "--methods", "talon,static", "--datasets", "qa",
                 "--limit", "1", "--max-new-tokens", "4", "--threads", "1", "--no-progress", "--no-plots",
                 "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["profile"] == str(path)
    trees = {v["label"]: v["tree"] for v in results["variants"]}
    assert trees["talon"]["budget"] == talon["best"]["budget"] and trees["static"]["budget"] == talon["best"]["budget"]


def test_sampling_profile_serves_sampled_runs_only(use_generator, generator, tmp_path):
    """A profile calibrated at temperature 1 answers `--budget auto` for sampled runs (any temperature),
    never for greedy ones; a profile without a temperature in its key (older format) counts as greedy."""
    from talon_sd.bench.measure import calibrate
    from talon_sd.bench.profiles import find_profile, profile_key, profile_path, save_profile
    from talon_sd.bench.tuner import TuneSettings, run_tune
    from talon_sd.config import TreeConfig

    prompt_ids = [torch.tensor([5, 17, 42, 8]), torch.tensor([33, 12, 7])]
    sampled = [calibrate(generator, TreeConfig("talon", budget=8), prompt_ids, 8, temperature=1.0, seed=s)
               for s in (0, 0, 1)]
    greedy = calibrate(generator, TreeConfig("talon", budget=8), prompt_ids, 8)
    assert sampled[0].mat == sampled[1].mat and sampled[0].tree_sizes == sampled[1].tree_sizes  # seeded
    assert sampled[0].mat != sampled[2].mat and sampled[0].mat != greedy.mat  # the seed and the mode matter

    settings = TuneSettings(verify_sizes=(1, 8), draft_widths=(1, 4), root_widths=(1,), repeats=1,
                            calibration_tokens=6, temperature=1.0, stages={"talon": (("budget", (4, 8)),)})
    with pytest.raises(ValueError, match="temperature"):
        run_tune(generator, ["talon"], settings, profile_key(None, None, "float32"), prompt_ids=prompt_ids,
                 progress=False)
    key = profile_key(None, None, "float32", temperature=1.0)
    profile = run_tune(generator, ["talon"], settings, key, prompt_ids=prompt_ids, progress=False)
    assert profile["key"]["temperature"] == 1.0 and profile["settings"]["temperature"] == 1.0
    path = save_profile(profile)
    assert "--t1--" in path.name
    best = {k: profile["methods"]["talon"]["best"][k] for k in ("budget", "mu", "topk")}
    assert tuned_tree_options("talon", None, None, "float32", temperature=1.0) == best
    with pytest.raises(TalonError, match=r"needs a profile tuned for greedy decoding; run `talon tune "
                                         r".*--dtype float32 --threads 1` first$"):
        tuned_tree_options("talon", None, None, "float32")  # greedy run: the sampling profile does not serve it

    def variant(base: dict, key: dict, budget: int, methods=("talon",)) -> dict:
        """``base`` under another key, its methods' best budget set to ``budget``."""
        entries = {m: {**base["methods"]["talon"], "best": {**base["methods"]["talon"]["best"], "budget": budget}}
                   for m in methods}
        return {**base, "key": key, "settings": {**base["settings"], "temperature": key.get("temperature", 0.0)},
                "methods": entries}

    # A sampled run takes the profile of the nearest temperature.
    save_profile(variant(profile, profile_key(None, None, "float32", temperature=0.5), 7))
    assert tuned_tree_options("talon", None, None, "float32", temperature=0.7)["budget"] == 7
    assert tuned_tree_options("talon", None, None, "float32", temperature=0.9) == best

    # A greedy profile of the older format (no temperature in the key, older file name) serves greedy
    # runs only; a current-format greedy profile is preferred to it, and re-tuning keeps its methods.
    greedy_key = profile_key(None, None, "float32", threads=2)
    legacy_key = {k: v for k, v in greedy_key.items() if k != "temperature"}
    legacy_path = save_profile(variant(profile, legacy_key, 5, methods=("talon", "eagle")))
    assert "--t" not in legacy_path.name
    assert find_profile(profile_key(None, None, "float32"))[1] == legacy_path  # nearest threads (1 vs 2)
    assert tuned_tree_options("talon", None, None, "float32")["budget"] == 5
    assert tuned_tree_options("talon", None, None, "float32", temperature=1.0) == best
    with pytest.raises(TalonError, match=r"for sampling \(temperature 1\); run `talon tune .* --temperature 1` first"):
        tuned_tree_options("talon", "other-target", None, "float32", temperature=1.0)
    new_path = save_profile(variant(profile, greedy_key, 6))  # re-tuned talon only, current format
    assert "--t0--" in new_path.name and set(json.loads(new_path.read_text())["methods"]) == {"talon", "eagle"}
    assert find_profile(profile_key(None, None, "float32"))[1] == new_path  # threads tie: current format wins
    assert tuned_tree_options("talon", None, None, "float32")["budget"] == 6

    # The bench CLI picks the profile of its own decoding mode.
    out = tmp_path / "auto-t1"
    assert main(["bench", "--dtype", "float32", "--budget", "tuned", "--methods", "talon", "--datasets", "qa",
                 "--limit", "1", "--max-new-tokens", "4", "--temperature", "1", "--threads", "1", "--no-progress",
                 "--no-plots", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["profile"] == str(path)
    assert {v["label"]: v["tree"] for v in results["variants"]}["talon"]["budget"] == best["budget"]


def test_tune_cli_at_a_temperature_writes_a_sampling_profile(use_generator, tmp_path, capsys):
    """`talon tune --temperature 1` calibrates longer by default and writes a profile keyed by T = 1."""
    from talon_sd.bench.cli import CALIBRATION_TOKENS_SAMPLED

    common = ["tune", "--dtype", "float32", "--threads", "1", "--methods", "talon", "--talon-budgets", "4,6",
              "--talon-mus", "0.1", "--verify-sizes", "1,6", "--draft-widths", "1,4", "--repeats", "1",
              "--calibration-prompts", "1", "--no-progress"]
    assert main([*common, "--temperature", "1"]) == 0
    assert main([*common, "--calibration-tokens", "5"]) == 0
    paths = sorted((tmp_path / "cache" / "profiles").glob("*.json"))
    profiles = {json.loads(p.read_text())["key"]["temperature"]: (p, json.loads(p.read_text())) for p in paths}
    assert set(profiles) == {0.0, 1.0} and "--t1--" in profiles[1.0][0].name
    assert profiles[1.0][1]["settings"]["calibration_tokens"] == CALIBRATION_TOKENS_SAMPLED
    assert profiles[1.0][1]["settings"]["temperature"] == 1.0
    assert profiles[0.0][1]["settings"]["calibration_tokens"] == 5 and profiles[0.0][1]["settings"]["temperature"] == 0
    assert "talon: budget=" in capsys.readouterr().out


def test_bench_resume_reuses_finished_prompt_turns_and_refuses_other_settings(use_generator, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["bench", "--datasets", "mt_bench,gsm8k", "--limit", "1", "--max-new-tokens", "12", "--methods",
            "ar,hf,talon", "--threads", "1", "--warmup-tokens", "0", "--no-progress", "--no-plots", "--out", str(out)]
    assert main(argv) == 0
    full = json.loads((out / "results.json").read_text())
    assert full["settings"]["resumed_samples"] == 0 and len(full["samples"]) == 3 * 3

    # Keep the header and the first prompt turn, then a line torn by a kill in the middle of the second.
    lines = (out / "checkpoint.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3 * 3
    (out / "checkpoint.jsonl").write_text("\n".join(lines[:1 + 3] + [lines[4][:40]]) + "\n")
    capsys.readouterr()
    assert main(argv) == 2  # an unfinished run is not replaced without --resume
    assert "add --resume" in capsys.readouterr().err
    assert len((out / "checkpoint.jsonl").read_text().splitlines()) == 1 + 3 + 1
    assert main(argv + ["--resume"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["settings"]["resumed_samples"] == 1 and resumed["settings"]["complete"] is True
    before = {(s["index"], s["label"]): s for s in full["samples"]}
    after = {(s["index"], s["label"]): s for s in resumed["samples"]}
    assert set(after) == set(before)
    for key, sample in after.items():
        assert sample["new_tokens"] == before[key]["new_tokens"]
        if key[0] == 0:  # the reloaded turn keeps its measured time and stats
            assert sample["seconds"] == before[key]["seconds"] and sample["stats"] == before[key]["stats"]
        assert sample["prompt_tokens"] == before[key]["prompt_tokens"]  # turn 2 follows the reloaded turn-1 answer
        assert sample["identical_to_ar"] is True or sample["method"] == "hf"
    relines = (out / "checkpoint.jsonl").read_text().splitlines()
    assert len(relines) == 1 + 3 * 3 and relines[:4] == lines[:4]
    raw_seconds = [[json.loads(line)["seconds"] for line in part[4:]] for part in (lines, relines)]
    assert all(a != b for a, b in zip(*raw_seconds))  # the other turns ran again (unrounded wall times)

    capsys.readouterr()
    assert main([a if a != "12" else "10" for a in argv] + ["--resume"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("talon: error: resume:") and "load average" not in error  # refused before the models load
    assert "decoding" in error and len(error.splitlines()) == 1
    assert len((out / "checkpoint.jsonl").read_text().splitlines()) == 1 + 3 * 3  # the refused resume changed nothing


def test_methods_on_different_drafters_in_one_run(monkeypatch, tmp_path):
    """talon and eagle on an EAGLE-3 head beside talon on the draft LM and on n-grams, interleaved, all exact."""
    from talon_sd.eagle3 import init_eagle3_head

    target = tiny_model("qwen2", seed=3, layers=6)
    generator = SpeculativeGenerator.from_models(target, noisy_copy(target, 0.3, seed=4), WordTokenizer(), tree="talon")
    generator.head = init_eagle3_head(target, seed=2).float().eval()
    monkeypatch.setattr(bench_cli, "_load_generator", lambda args: generator)
    out = tmp_path / "drafters"
    assert main(["bench", "--datasets", "qa", "--limit", "1", "--max-new-tokens", "10", "--methods",
                 "talon@eagle3,eagle@eagle3,talon,talon@ngram", "--head", str(tmp_path), "--talon-budget", "6",
                 "--eagle-budget", "6", "--threads", "1", "--no-progress", "--no-plots", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    drafters = {v["label"]: v["drafter"] for v in results["variants"]}
    assert drafters == {"ar": None, "talon@eagle3": "eagle3", "eagle@eagle3": "eagle3", "talon": None, "talon@ngram": "ngram"}
    assert all(s["identical_to_ar"] for s in results["samples"] if s["label"] != "ar")
    assert parse_methods("talon@eagle3,chain@ngram") == ["talon@eagle3", "chain@ngram"]
    for bad in ("hf@eagle3", "ar@ngram", "talon@medusa"):
        with pytest.raises(TalonError, match=f"methods: got '{bad}'"):
            parse_methods(bad)


def test_repeats_keep_each_variants_median_run_and_start_every_round_from_the_same_controller(
        use_generator, generator, monkeypatch, tmp_path):
    from talon_sd.bench import runner

    starts: dict[tuple[int, str], list] = {}  # (prompt turn, label) -> the controller memory each run started from
    ends: dict[tuple[int, str], list] = {}  # ... and (seconds, the controller it left) after each run
    ran = runner.run_variant

    def watched(generator_, variant, ids, decoding, seed):
        starts.setdefault((len(ids), variant.label), []).append(generator_.controller_memory())
        outcome = ran(generator_, variant, ids, decoding, seed)
        ends.setdefault((len(ids), variant.label), []).append((outcome.seconds, generator_.controller_memory()))
        return outcome

    monkeypatch.setattr(runner, "run_variant", watched)
    out = tmp_path / "sweep-repeats"
    argv = ["sweep", "--datasets", "gsm8k,qa", "--limit", "1", "--max-new-tokens", "16", "--budgets", "auto,4",
            "--methods", "talon", "--threads", "1", "--warmup-tokens", "0", "--no-progress", "--no-plots",
            "--out", str(out)]
    assert main(argv + ["--repeats", "3"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["repeats"] == 3 and "ran 3 times per prompt turn" in (out / "report.md").read_text()
    for sample in results["samples"]:  # every variant, the reference ar too, keeps its median of 3 runs
        rounds = sample["round_seconds"]
        assert len(rounds) == 3 and sample["seconds"] == sorted(rounds)[1]
        assert sample["identical_to_ar"] is True  # fp32 tiny models: every kept run is lossless
    auto = "talon(N=auto,K=4,mu=0.03)"
    auto_starts = [runs for (_, label), runs in starts.items() if label == auto]
    assert len(auto_starts) == 2 and all(len(runs) == 3 for runs in auto_starts)
    for runs in auto_starts:  # no round learns from an earlier round of the same prompt
        assert all(run.keys() == runs[0].keys() and all(run[k] is runs[0][k] for k in run) for run in runs)
    first, second = auto_starts
    key = ("talon", "model", False)  # the second prompt starts from what the first one's kept run learned
    first_ends = next(runs for (_, label), runs in ends.items() if label == auto)
    assert second[0][key] is sorted(first_ends, key=lambda run: run[0])[1][1][key] is not first[0].get(key)

    # the checkpoint keeps the rounds; a resume with another repeat count is refused before the models load
    lines = [json.loads(line) for line in (out / "checkpoint.jsonl").read_text().splitlines()]
    assert lines[0]["fingerprint"]["repeats"] == 3 and all(len(r["round_seconds"]) == 3 for r in lines[1:])
    assert lines[0]["fingerprint"]["repeated"] == "every variant"  # a checkpoint that ran ar once is not resumed
    assert main(argv + ["--repeats", "2", "--resume"]) == 2
    assert main(argv + ["--repeats", "3", "--resume"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert [s["round_seconds"] for s in resumed["samples"]] == [s["round_seconds"] for s in results["samples"]]
    assert main(argv + ["--repeats", "0", "--out", str(tmp_path / "zero")]) == 2
    for bad in (0, True, 2.0):  # the API refuses them too, with the standard message
        with pytest.raises(TalonError, match=rf"^repeats: got {bad!r}, expected an integer >= 1$"):
            runner.run_bench(generator, [], [], None, repeats=bad)
