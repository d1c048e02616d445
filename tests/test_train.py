"""``talon train-head``: the TTT attention pattern, training that learns, training/inference alignment,
resumable stages that refuse other runs' folders, and the data stage end to end on a model with a tokenizer.

Tiny random models only (a float32 6-layer Qwen2/Llama); every test runs on one torch thread, which is
faster for these sizes and immune to a busy machine's second core.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from conftest import plain_greedy, tiny_model
from helpers import run
from talon_sd import TalonError, TreeConfig
from talon_sd.cli import main
from talon_sd.drafters import Eagle3Drafter
from talon_sd.eagle3 import init_eagle3_head, load_eagle3_head
from talon_sd.tree import DraftTree
from talon_sd.train import data as data_module
from talon_sd.train.data import DataConfig, Sample, build_data
from talon_sd.train.features import FeatureConfig, FeatureStore, SampleFeatures, teacher_forward, write_features
from talon_sd.train.generation import generate_batch
from talon_sd.train.prompts import PromptPool, read_prompt_file, render_user_turn
from talon_sd.train.trainer import TrainConfig, Trainer, export_head, prepare_head_for_training
from talon_sd.train.ttt import make_batch, ttt_forward, ttt_visibility

PROMPT_TOKENS, ANSWER_TOKENS = 8, 40
CORPUS_SIZE = 128
TRAIN = TrainConfig(epochs=12, lr=3e-3, batch_tokens=512, val_fraction=0.15, precision="float32", checkpoint_every=20)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=5, layers=6)


def random_prompt(generator: torch.Generator) -> list[int]:
    return torch.randint(3, 96, (PROMPT_TOKENS,), generator=generator).tolist()


@pytest.fixture(scope="module")
def corpus(target) -> list[Sample]:
    """The target's own greedy continuations of random prompts (the answer is loss-masked)."""
    generator = torch.Generator().manual_seed(0)
    prompts = [random_prompt(generator) for _ in range(CORPUS_SIZE)]
    samples = []
    for start in range(0, CORPUS_SIZE, 32):
        completions = generate_batch(target, prompts[start: start + 32], ANSWER_TOKENS, 0.0, 1.0, (), 2, seed=0)
        for offset, completion in enumerate(completions):
            prompt = prompts[start + offset]
            samples.append(Sample(start + offset, tuple(prompt) + completion.tokens,
                                  (0,) * len(prompt) + (1,) * len(completion.tokens)))
    return samples


@pytest.fixture(scope="module")
def store(target, corpus, tmp_path_factory) -> FeatureStore:
    folder = tmp_path_factory.mktemp("features")
    write_features(target, corpus, FeatureConfig(shard_size=48), folder, {"corpus": "greedy"}, progress=False)
    return FeatureStore(folder)


def fresh_head(target, store: FeatureStore, seed: int = 0):
    return prepare_head_for_training(init_eagle3_head(target, store.draft_ids, store.aux_layers, seed=seed))


@pytest.fixture(scope="module")
def trained(target, store, tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    head = fresh_head(target, store)
    result = Trainer(head, store, TRAIN, work, {"features": "greedy corpus"}, progress=False).run()
    return head, result, work


# ---------------------------------------------------------------------------------------------- TTT


def test_ttt_visibility_for_three_steps_is_the_hand_checked_pattern():
    causal = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    diagonal = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    for step in range(3):  # k = 3: steps 0, 1, 2
        expected = [c + d * step for c, d in zip(causal, diagonal)]
        assert ttt_visibility(4, step).int().tolist() == expected
    assert ttt_visibility(4, 2).shape == (4, 12)


def test_ttt_rows_equal_the_drafter_on_a_chain(target):
    """Step j of row t in training is the drafter's depth-j node of a chain along the data tokens, drafted
    after committing x_0 .. x_{t+1}: same features, tokens, positions and visible keys."""
    head = init_eagle3_head(target, draft_vocab=torch.arange(0, 96, 2), seed=3).float().eval()
    ids = torch.tensor(random_prompt(torch.Generator().manual_seed(9)) + list(range(20, 32)))
    layers = (2, 3, 3)
    out = teacher_forward(target, ids, layers)
    sample = SampleFeatures(ids=ids, loss_mask=torch.ones(len(ids), dtype=torch.bool), aux=out.aux,
                            teacher=out.logits[:, head.target_ids()], argmax=out.logits.argmax(-1))
    with torch.no_grad():
        logits = ttt_forward(head, make_batch([sample], 3, head.t2d))  # 3 x [T - 1, Vd]
    for t in (0, 5, len(ids) - 5):
        drafter = Eagle3Drafter(head)
        drafter.start(ids[: t + 2], out.aux[: t + 1])
        drafter.begin_step(int(ids[t + 1]))
        tree = DraftTree.root(int(ids[t + 1]))
        drafted = [drafter.expand(tree, torch.tensor([0]))]
        for depth in (1, 2):  # a chain: node `depth` has token x_{t+1+depth}
            tree = tree.extend(torch.tensor([depth - 1]), ids[t + 1 + depth: t + 2 + depth], torch.zeros(1))
            drafted.append(drafter.expand(tree, torch.tensor([depth])))
        for step in range(3):
            expected = torch.log_softmax(logits[step][t], -1)
            torch.testing.assert_close(drafted[step][0, head.target_ids()], expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- training


def test_training_raises_validation_agreement_well_above_a_random_head(trained):
    head, result, work = trained
    before, after = result.curve[0], result.curve[-1]
    assert before["step"] == 0 and after["step"] == result.steps and after["epoch"] == TRAIN.epochs
    # calibrated: a random head agrees on ~1% of rows, the trained one on ~45% at every step (chain ~2.0)
    assert max(before["top1"]) < 0.05
    for step in range(TRAIN.ttt_steps):
        assert after["top1"][step] >= before["top1"][step] + 0.3
        assert after["top1"][step] >= 0.38
    assert after["chain_length"] >= 1.7
    assert after["loss"][0] < before["loss"][0]
    logged = [json.loads(line) for line in (work / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in logged if r["kind"] == "val"] == list(range(TRAIN.epochs + 1))
    assert any(r["kind"] == "train" for r in logged)


def test_head_init_from_target_starts_from_the_targets_output_layer(target, store):
    head = init_eagle3_head(target, store.draft_ids, store.aux_layers, seed=0, output_from_target=True)
    torch.testing.assert_close(head.norm.weight, target.get_decoder().norm.weight, rtol=0, atol=0)
    ids = torch.tensor([random_prompt(torch.Generator().manual_seed(4))], device=head.fc.weight.device)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        final = out.hidden_states[-1]  # [1, T, H] after the target's final norm
        # the copied rows turn the target's final hidden state into its logits over the draft vocabulary
        torch.testing.assert_close(head.lm_head(final), out.logits[..., store.draft_ids.to(ids.device)])
    random = init_eagle3_head(target, store.draft_ids, store.aux_layers, seed=0)
    assert not torch.equal(random.lm_head.weight, head.lm_head.weight)
    assert torch.equal(random.fc.weight, head.fc.weight)  # only the output layer differs


def test_exported_head_reproduces_greedy_and_accepts_drafts(target, store, trained, tmp_path):
    head, result, _ = trained
    folder = export_head(head, tmp_path / "head", {"validation": result.curve})
    assert json.loads((folder / "training.json").read_text())["validation"][-1]["epoch"] == TRAIN.epochs
    loaded = load_eagle3_head(folder, target)
    assert torch.equal(loaded.target_ids().cpu(), store.draft_ids)
    generator = torch.Generator().manual_seed(123)  # prompts like the training ones, never seen
    trained_mat, random_mat = [], []
    random_head = init_eagle3_head(target, store.draft_ids, store.aux_layers, seed=7).float()
    for _ in range(3):
        prompt = random_prompt(generator)
        tokens, stats = run(target, Eagle3Drafter(loaded), TreeConfig("talon", budget=10, topk=3), prompt, 30)
        assert tokens == plain_greedy(target, prompt, 30)
        trained_mat.append(stats.mat)
        random_mat.append(run(target, Eagle3Drafter(random_head), TreeConfig("talon", budget=10, topk=3), prompt, 30)[1].mat)
    assert sum(trained_mat) / 3 > 1.5 and sum(random_mat) / 3 < 1.2  # measured: ~2.2 and ~1.0


def test_resume_after_an_interrupt_gives_the_same_weights(target, store, tmp_path):
    config = TrainConfig(epochs=2, lr=3e-3, batch_tokens=384, val_fraction=0.1, precision="float32", checkpoint_every=3)
    settings = {"features": "greedy corpus"}
    straight = fresh_head(target, store)
    expected = Trainer(straight, store, config, tmp_path / "a", settings, progress=False).run()

    def interrupt(step: int) -> None:
        if step == expected.steps // 2 + 1:  # mid-epoch, between two periodic checkpoints
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Trainer(fresh_head(target, store), store, config, tmp_path / "b", settings, progress=False).run(on_step=interrupt)
    checkpoint = torch.load(tmp_path / "b" / "train" / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == expected.steps // 2 + 1
    resumed_head = fresh_head(target, store)
    resumed = Trainer(resumed_head, store, config, tmp_path / "b", settings, progress=False).run()
    assert resumed.steps == expected.steps and resumed.curve[-1]["top1"] == expected.curve[-1]["top1"]
    for (name, a), (_, b) in zip(straight.named_parameters(), resumed_head.named_parameters()):
        assert torch.equal(a, b), name
    strip = lambda path: [{k: v for k, v in json.loads(line).items() if k not in ("seconds", "tokens_per_s")}
                          for line in path.read_text().splitlines()]
    assert strip(tmp_path / "b" / "train_log.jsonl") == strip(tmp_path / "a" / "train_log.jsonl")

    other = TrainConfig(epochs=2, lr=1e-3, batch_tokens=384, val_fraction=0.1, precision="float32")
    with pytest.raises(TalonError, match=r"train.lr 0.003 -> 0.001") as caught:
        Trainer(fresh_head(target, store), store, other, tmp_path / "b", settings)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("work: ")


def test_precision_auto_is_stored_resolved_so_another_cpu_cannot_switch_it(target, store, tmp_path, monkeypatch):
    config = TrainConfig(epochs=1, lr=3e-3, batch_tokens=384, val_fraction=0.1, precision="auto")
    monkeypatch.setattr(TrainConfig, "autocast_bfloat16", lambda self, device: True)  # a CPU fast at bf16
    Trainer(fresh_head(target, store), store, config, tmp_path, {}, progress=False)
    stored = json.loads((tmp_path / "train" / "settings.json").read_text())
    assert stored["train"]["precision"] == "bfloat16"
    monkeypatch.setattr(TrainConfig, "autocast_bfloat16", lambda self, device: False)  # resumed on an AVX2-only CPU
    with pytest.raises(TalonError, match='train.precision "bfloat16" -> "float32"'):
        Trainer(fresh_head(target, store), store, config, tmp_path, {}, progress=False)
    monkeypatch.undo()
    explicit = TrainConfig(epochs=1, lr=3e-3, batch_tokens=384, val_fraction=0.1, precision="bfloat16")
    assert Trainer(fresh_head(target, store), store, explicit, tmp_path, {}, progress=False).bfloat16


def test_a_step_that_cannot_fit_in_memory_is_refused_before_training(target, store, tmp_path, monkeypatch):
    from talon_sd.train import trainer as trainer_module

    config = TrainConfig(epochs=1, batch_tokens=384, val_fraction=0.1, precision="float32")
    need = 384 * config.ttt_steps * int(store.draft_ids.numel()) * trainer_module.LOGIT_BYTES_PER_ENTRY
    monkeypatch.setattr(trainer_module, "device_memory_bytes", lambda device: need)  # 70% of it is too little
    with pytest.raises(TalonError, match=r"batch-tokens: .*lower --batch-tokens or --draft-vocab") as caught:
        Trainer(fresh_head(target, store), store, config, tmp_path, {}, progress=False)
    assert "\n" not in str(caught.value) and not (tmp_path / "train").exists()  # nothing written
    monkeypatch.setattr(trainer_module, "device_memory_bytes", lambda device: 2 * need)
    Trainer(fresh_head(target, store), store, config, tmp_path, {}, progress=False)  # fits: accepted


def test_ctrl_c_stops_after_the_running_step_with_a_checkpoint(target, store, tmp_path):
    import os
    import signal

    config = TrainConfig(epochs=1, lr=3e-3, batch_tokens=384, val_fraction=0.1, precision="float32", checkpoint_every=50)
    trainer = Trainer(fresh_head(target, store), store, config, tmp_path, {}, progress=False)
    # Python's own handler before the run, whatever the test runner inherited (a shell's background job
    # starts with SIGINT ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.run(on_step=lambda step: step == 2 and os.kill(os.getpid(), signal.SIGINT))
        assert torch.load(tmp_path / "train" / "checkpoint.pt", weights_only=True)["step"] == 2
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_features_resume_rewrites_only_missing_shards(target, corpus, tmp_path, monkeypatch):
    from talon_sd.train import features as features_module

    config = FeatureConfig(draft_vocab=48, shard_size=8)
    write_features(target, corpus[:20], config, tmp_path, {}, progress=False)
    first = FeatureStore(tmp_path).load(10)
    for name in ("shard-00001.safetensors", "index.json", "summary.json"):
        (tmp_path / name).unlink()
    calls = []
    real = features_module.teacher_forward
    monkeypatch.setattr(features_module, "teacher_forward", lambda *a: calls.append(1) or real(*a))
    summary = write_features(target, corpus[:20], config, tmp_path, {}, progress=False)
    assert len(calls) == 8 and summary.samples == 20 and summary.draft_vocab == 48 and summary.teacher == "logits"
    again = FeatureStore(tmp_path).load(10)
    assert torch.equal(again.aux, first.aux) and torch.equal(again.teacher, first.teacher)
    assert torch.equal(again.ids, torch.tensor(corpus[10].ids))
    with pytest.raises(TalonError, match=r"features.draft_vocab 48 -> 32"):
        write_features(target, corpus[:20], FeatureConfig(draft_vocab=32, shard_size=8), tmp_path, {}, progress=False)


def test_train_config_errors_are_one_line():
    with pytest.raises(TalonError, match=r"^ttt-steps: got 0, expected an integer >= 1$"):
        TrainConfig(ttt_steps=0)
    with pytest.raises(TalonError, match=r"^val-fraction: got 1.0"):
        TrainConfig(val_fraction=1.0)
    with pytest.raises(TalonError, match=r"^draft-vocab: got 1"):
        FeatureConfig(draft_vocab=1)


# ---------------------------------------------------------------------------------------------- data stage


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> pathlib.Path:
    """A 6-layer Llama with a word-level tokenizer and a chat template (eos w1 = id 1)."""
    from test_models import save_tiny_llama

    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(folder, vocab=64)
    tiny_model("llama", seed=3, vocab=64, layers=6).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("src")
    for index in range(3):
        body = "\n".join(f"    total += value * {n}" for n in range(6))
        (folder / f"module{index}.py").write_text(f"def function_{index}(value):\n    total = 0\n{body}\n    return total\n")
    return folder


@pytest.fixture(scope="module")
def tiny_llama(model_folder):
    from talon_sd.models import load_model

    return load_model(str(model_folder), dtype="float32", device="cpu")


def data_config(source_dir, **changes) -> DataConfig:
    fields = dict(self_prompts=4, source_prompts=3, source_roots=(str(source_dir),), max_new_tokens=8,
                  max_request_tokens=96, batch_size=4)
    return DataConfig(**(fields | changes))


def test_data_stage_writes_samples_and_resumes_without_regenerating(tiny_llama, source_dir, tmp_path, monkeypatch):
    config = data_config(source_dir)
    folder = tmp_path / "data"
    settings = {"target": "tiny"}
    summary = build_data(tiny_llama.model, tiny_llama.tokenizer, config, folder, settings, progress=False)
    assert summary.prompts_by_source == {"source": 3, "self": 4} and summary.samples + summary.skipped == 7
    prompts = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    assert [p["source"] for p in prompts] == ["source"] * 3 + ["self"] * 4
    assert all("```python\ndef function_" in p["text"] for p in prompts[:3])
    assert len({p["text"] for p in prompts}) == 7
    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    for sample, prompt in zip(sorted(samples, key=lambda s: s["index"]), prompts):
        rendered = render_user_turn(tiny_llama.tokenizer, prompt["text"], generation_prompt=True)
        answer = len(sample["ids"]) - len(rendered)
        assert sample["ids"][: len(rendered)] == rendered and 1 <= answer <= 8
        assert sample["loss_mask"] == [0] * len(rendered) + [1] * answer
        assert sample["finished"] == (sample["ids"][-1] == 1)

    # interrupted: the summary missing, three answers lost and a torn line -> only those are regenerated
    (folder / "summary.json").unlink()
    lines = (folder / "samples.jsonl").read_text().splitlines()
    (folder / "samples.jsonl").write_text("\n".join(lines[:4]) + '\n{"index": 4, "ids": [1, 2')
    calls = []
    real = data_module.generate_batch
    monkeypatch.setattr(data_module, "generate_batch", lambda model, prompts, *a, **k: calls.append(len(prompts)) or
                        real(model, prompts, *a, **k))
    build_data(tiny_llama.model, tiny_llama.tokenizer, config, folder, settings, progress=False)
    assert calls == [3]  # no self-prompt batch, one answer batch for the three missing prompts
    timeless = lambda lines: sorted(json.dumps({k: v for k, v in json.loads(line).items() if k != "seconds"})
                                    for line in lines)
    assert timeless((folder / "samples.jsonl").read_text().splitlines()) == timeless(lines)  # greedy: same answers

    changed = data_config(source_dir, max_new_tokens=6)
    with pytest.raises(TalonError, match=r"max_new_tokens 8 -> 6") as caught:
        build_data(tiny_llama.model, tiny_llama.tokenizer, changed, folder, settings)
    assert "\n" not in str(caught.value)


def test_bad_data_arguments_and_benchmark_prompts_are_refused(source_dir, tmp_path):
    with pytest.raises(TalonError, match=r"^self-prompts: got -1, expected an integer >= 0$"):
        data_config(source_dir, self_prompts=-1)
    with pytest.raises(TalonError, match=r"^prompts: no prompt source"):
        DataConfig()
    with pytest.raises(TalonError, match=r"^prompts: got '.*missing.jsonl'"):
        DataConfig(prompt_files=(str(tmp_path / "missing.jsonl"),))
    from talon_sd.bench.datasets import packaged_path

    question = json.loads(packaged_path("gsm8k").read_text().splitlines()[3])["turns"][0]
    leaked = tmp_path / "leaked.jsonl"
    leaked.write_text(json.dumps({"prompt": "Sort a list in Python."}) + "\n" + json.dumps({"turns": [question]}) + "\n")
    with pytest.raises(TalonError, match=r"leaked.jsonl:2 is a prompt of the benchmark sets"):
        read_prompt_file(leaked, PromptPool())
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"body": "no turns"}\n')
    with pytest.raises(TalonError, match=r"broken.jsonl:1 has no \"turns\""):
        read_prompt_file(broken, PromptPool())
    reused = tmp_path / "reused.jsonl"  # a data stage's own prompts.jsonl seeds another run
    reused.write_text(json.dumps({"index": 0, "source": "self", "text": "Sort a list in Python."}) + "\n")
    assert read_prompt_file(reused, PromptPool()) == ["Sort a list in Python."]


def test_cli_runs_every_stage_then_skips_them_and_refuses_other_settings(model_folder, source_dir, tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "head"
    command = ["train-head", "--target", str(model_folder), "--dtype", "float32", "--device", "cpu", "--threads", "1",
               "--self-prompts", "3", "--source-prompts", "2", "--source-dir", str(source_dir), "--max-new-tokens", "8",
               "--max-request-tokens", "96", "--draft-vocab", "40", "--epochs", "1", "--val-fraction", "0.2",
               "--work", str(work), "--out", str(out), "--no-progress"]
    assert main(command) == 0
    report = json.loads((out / "training.json").read_text())
    assert report["draft_vocab"] == 40 and report["ttt_steps"] == 3 and report["data"]["samples"] >= 4
    assert report["command"].startswith("talon train-head --target ") and len(report["validation"]) == 2
    train_settings = report["settings"]["train"]
    assert train_settings["head_init"] == "random" and train_settings["precision"] in ("bfloat16", "float32")
    assert f"--precision {train_settings['precision']} --head-init random" in report["command"]
    assert load_eagle3_head(out, tiny_model("llama", seed=3, vocab=64, layers=6)).config.draft_vocab_size == 40
    log = (work / "train_log.jsonl").read_text()

    capsys.readouterr()
    assert main(["train-head", "--work", str(work), "--resume", "--out", str(out), "--no-progress", "--threads", "1",
                 "--device", "cpu"]) == 0  # everything on disk: nothing is redone
    assert (work / "train_log.jsonl").read_text() == log
    assert "requests" not in capsys.readouterr().err

    assert main(command[:-3] + ["--epochs", "2", "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("talon: error: work: ") and "epochs 1 -> 2" in error and error.count("\n") == 1
    assert main(["train-head", "--target", str(model_folder), "--stage", "train", "--work", str(tmp_path / "w2")]) == 2
    assert capsys.readouterr().err.strip() == ("talon: error: out: required with --stage train or all "
                                               "(the folder the trained head is written to)")
    assert main(["train-head", "--work", str(tmp_path / "none"), "--resume", "--stage", "data"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err
