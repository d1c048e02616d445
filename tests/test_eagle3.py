"""EAGLE-3 heads: reading published checkpoints (both namings), our export, clear errors for heads that do
not fit, exact greedy output with every builder, lossless sampling, and the drafter's cache against a
from-scratch run of the head."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import VOCAB, plain_greedy, tiny_model
from helpers import run
from talon_sd import SpeculativeGenerator, TalonError, TreeConfig
from talon_sd.config import SamplingConfig
from talon_sd.drafters import Eagle3Drafter
from talon_sd.eagle3 import attention_bias, init_eagle3_head, load_eagle3_head, save_eagle3_head
from talon_sd.lm import CausalLM
from talon_sd.tree import DraftTree
from talon_sd.verify import Acceptance

LAYERS = 6  # default aux layers (2, 3, 3)


@pytest.fixture(scope="module")
def target():
    return tiny_model("qwen2", seed=5, layers=LAYERS)


@pytest.fixture(scope="module")
def head(target):
    return init_eagle3_head(target, draft_vocab=torch.arange(0, VOCAB, 2), seed=1).float().eval()


def test_export_round_trip_uses_the_official_names(head, target, tmp_path):
    folder = save_eagle3_head(head, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == VOCAB // 2
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]  # vLLM: the layers whose inputs are read
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 2]  # SGLang/SpecForge: outputs
    names = set(load_file(str(folder / "model.safetensors")))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight", "d2t", "t2d"} <= names
    assert not any(name.startswith("embed_tokens") for name in names)
    loaded = load_eagle3_head(folder, target)
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_vllm_naming_and_pytorch_bin_load_the_same_head(head, target, tmp_path):
    folder = save_eagle3_head(head, tmp_path / "ours", dtype=torch.float32)
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {}
    for name, tensor in tensors.items():
        if name == "t2d":
            continue  # vLLM ignores t2d
        name = "draft_id_to_target_id" if name == "d2t" else name.replace("midlayer.", "layers.0.")
        renamed[name] = tensor
    vllm = tmp_path / "vllm"
    vllm.mkdir()
    config = json.loads((folder / "config.json").read_text())
    del config["eagle_config"]  # vLLM reads the top-level ids only
    config["eagle_aux_hidden_state_layer_ids"] = [0, 1, 3]
    (vllm / "config.json").write_text(json.dumps(config))
    torch.save(renamed, vllm / "pytorch_model.bin")
    loaded = load_eagle3_head(vllm, target)
    assert loaded.config.aux_layers == (0, 1, 3)
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


@pytest.mark.parametrize("keys,expected", [
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}, (1, 2, 3)),  # SpecForge/SGLang: outputs
    ({"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [9, 9, 9]}},
     (1, 2, 3)),  # the top-level (vLLM, inputs) key wins
    ({}, (2, 3, 3)),  # neither: {2, L//2, L-3} of the 6-layer target
])
def test_aux_layer_ids_are_read_in_each_published_convention(head, target, tmp_path, keys, expected):
    folder = save_eagle3_head(head, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    config.pop("eagle_config")
    config.pop("eagle_aux_hidden_state_layer_ids")
    (folder / "config.json").write_text(json.dumps(config | keys))
    assert load_eagle3_head(folder, target).config.aux_layers == expected


def test_export_replaces_an_older_heads_pytorch_bin(head, target, tmp_path):
    folder = tmp_path / "head"
    folder.mkdir()
    torch.save({"fc.weight": torch.zeros(1)}, folder / "pytorch_model.bin")  # would be read before the safetensors
    save_eagle3_head(head, folder, dtype=torch.float32)
    assert not (folder / "pytorch_model.bin").exists()
    torch.testing.assert_close(load_eagle3_head(folder, target).fc.weight, head.fc.weight)


def test_an_interrupted_export_leaves_the_previous_head_whole(head, target, tmp_path, monkeypatch):
    folder = save_eagle3_head(head, tmp_path / "head", dtype=torch.float32)
    before = (folder / "model.safetensors").read_bytes(), (folder / "config.json").read_text()
    import safetensors.torch

    def crash(tensors, path, *args, **kwargs):
        pathlib.Path(path).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        save_eagle3_head(head, folder, dtype=torch.float32)
    assert ((folder / "model.safetensors").read_bytes(), (folder / "config.json").read_text()) == before
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", "model.safetensors"]  # no leftovers
    monkeypatch.undo()
    torch.testing.assert_close(load_eagle3_head(folder, target).fc.weight, head.fc.weight)


@pytest.mark.parametrize("change,message", [
    (lambda c, t: c.update(target_hidden_size=32), "reads target hidden size 32"),
    (lambda c, t: c.update(vocab_size=50), "vocab_size is 50"),
    (lambda c, t: t.pop("midlayer.mlp.up_proj.weight"), "lacks midlayer.mlp.up_proj.weight"),
    (lambda c, t: t.update({"fc.weight": torch.zeros(64, 100)}), "tensor fc.weight has shape"),
    (lambda c, t: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 40]), "aux layers"),
    (lambda c, t: (c.pop("eagle_aux_hidden_state_layer_ids"),
                   c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 3, 39])), "aux layers"),
    (lambda c, t: t.pop("d2t"), "needs a d2t tensor"),
    (lambda c, t: t["t2d"].copy_(torch.roll(t["t2d"], 1)), "t2d does not mark exactly"),
])
def test_heads_that_do_not_fit_give_one_line_errors(head, target, tmp_path, change, message):
    folder = save_eagle3_head(head, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    change(config, tensors)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(TalonError, match=message) as caught:
        load_eagle3_head(folder, target)
    assert str(caught.value).startswith("draft: ") and "\n" not in str(caught.value)


def test_missing_folder_and_weights_are_refused(target, tmp_path):
    with pytest.raises(TalonError, match="no such EAGLE-3 head folder"):
        load_eagle3_head(tmp_path / "nothing", target)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(TalonError, match="config.json lacks"):
        load_eagle3_head(tmp_path / "empty", target)


TREES = [TreeConfig("talon", budget=10, topk=3), TreeConfig("eagle", budget=8, topk=2, depth=3),
         TreeConfig("chain", depth=3), TreeConfig("static", budget=6), TreeConfig("talon", budget="auto", topk=3)]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_greedy_with_a_random_head_equals_plain_greedy(target, head, tree):
    for prompt in ([5, 17, 33, 8, 5, 17], [40]):
        tokens, stats = run(target, Eagle3Drafter(head), tree, prompt, 30)
        assert tokens == plain_greedy(target, prompt, 30)
        assert stats.draft_forwards > 0


@pytest.mark.parametrize("sampling", [SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9, seed=7),
                                      SamplingConfig(do_sample=True, temperature=1.0, top_k=20, seed=7)],
                         ids=["T=0.7,top_p=0.9", "T=1,top_k=20"])
@pytest.mark.parametrize("tree", TREES, ids=lambda t: t.label)
def test_a_seeded_sample_with_a_random_head_is_plain_decodings(target, head, tree, sampling):
    """Keyed seeded sampling: token for token ``ar``'s text for the same seed (an auto budget runs the cycling
    controller: plain steps and budget changes)."""
    prompt = [5, 17, 33, 8, 5, 17]
    plain, _ = run(target, None, TreeConfig("ar"), prompt, 30, sampling=sampling)
    tokens, stats = run(target, Eagle3Drafter(head), tree, prompt, 30, sampling=sampling)
    assert tokens == plain and stats.draft_forwards > 0


def test_generator_with_an_eagle3_head(target, head):
    generator = SpeculativeGenerator.from_models(target, head, drafter="eagle3", tree="talon", budget=8)
    result = generator.generate(input_ids=[5, 17, 33, 8], max_new_tokens=20, ignore_eos=True)
    assert result.token_ids == plain_greedy(target, [5, 17, 33, 8], 20)
    with pytest.raises(TalonError, match="draft_model: got 'Qwen2ForCausalLM'"):
        SpeculativeGenerator.from_models(target, target, drafter="eagle3")


@torch.no_grad()
def scratch_rows(head, features, tokens):
    """The head run from scratch over rows (f_t, x_{t+1}), causal: output hidden states [T, H]."""
    positions = torch.arange(len(tokens))
    hidden = head.project(features)
    q, k, v = head.qkv(hidden, torch.tensor(tokens), positions)
    visible = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
    return head.finish(hidden, head.attend(q, k, v, attention_bias(visible)))


@torch.no_grad()
def test_drafter_cache_equals_a_from_scratch_run(target, head):
    """Root and tree-node distributions after several accepted steps equal the head recomputed from the
    target features of every committed token (tree nodes: one more step on the parent's hidden state)."""
    layers = (2, 3, 3)
    lm = CausalLM(target)
    committed = [5, 17, 33, 8, 9]
    features = lm.prefill(torch.tensor(committed[:-1]), layers)
    drafter = Eagle3Drafter(head)
    drafter.start(torch.tensor(committed), features)
    all_features = [features]
    for step in range(4):
        drafter.begin_step(committed[-1])
        tree = DraftTree.root(committed[-1])
        root_log_p = drafter.expand(tree, torch.tensor([0]))
        rows = scratch_rows(head, torch.cat(all_features), committed[1:])
        expected = torch.log_softmax(head.draft_logits(rows[-1:]), -1)[0]
        torch.testing.assert_close(root_log_p[0, head.target_ids()], expected, atol=1e-4, rtol=1e-4)
        assert bool(torch.isinf(root_log_p[0, 1::2]).all())  # odd ids are outside the draft vocabulary
        top = root_log_p[0].topk(2).indices
        tree = tree.extend(torch.zeros(2, dtype=torch.long), top, root_log_p[0, top])
        second = drafter.expand(tree, torch.tensor([1, 2]))
        # node 2 from scratch: one more row on the root row's hidden state, token top[1], position len - 1
        q0, k0, v0 = head.qkv(head.project(torch.cat(all_features)), torch.tensor(committed[1:]),
                              torch.arange(len(committed) - 1))
        q, k, v = head.qkv(rows[-1:], top[1:2], torch.tensor([len(committed) - 1]))
        keys, values = torch.cat([k0, k], 1), torch.cat([v0, v], 1)
        out = head.finish(rows[-1:], head.attend(q, keys, values, torch.zeros(1, keys.shape[1])))
        torch.testing.assert_close(second[1, head.target_ids()], torch.log_softmax(head.draft_logits(out), -1)[0],
                                   atol=1e-4, rtol=1e-4)
        # the target accepts node 1 at even steps; the features come from its verify forward
        logits, tree_features = lm.forward_tree(tree, layers)
        path = [0, 1] if step % 2 == 0 else [0]
        bonus = int(logits[path[-1]].argmax())
        acceptance = Acceptance(path, [int(tree.tokens[i]) for i in path[1:]], bonus)
        lm.commit_tree(tree.size, path)
        drafter.accept(tree, acceptance, tree_features[path])
        all_features.append(tree_features[path])
        committed += acceptance.new_tokens


def test_sampling_with_an_eagle3_head_follows_the_target():
    """Chi-square on the first two sampled tokens, with a head as the drafter (small vocabulary)."""
    from talon_sd.verify import warp
    from test_sampling import chi_square_p

    small = 6
    model = tiny_model("qwen2", seed=11, vocab=small, layers=LAYERS)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)
    head = init_eagle3_head(model, seed=3).float().eval()
    with torch.no_grad():
        head.lm_head.weight.mul_(40.0)  # a confident, different draft distribution
    prompt, sampling = [1, 4, 2], SamplingConfig(do_sample=True, temperature=1.0)
    with torch.no_grad():
        first = warp(model(torch.tensor([prompt], device=model.device)).logits[0, -1].cpu(), sampling)
        joint = torch.stack([first[a] * warp(model(torch.tensor([prompt + [a]], device=model.device)).logits[0, -1].cpu(), sampling)
                             for a in range(small)])
    counts = torch.zeros(small, small)
    for seed in range(1200):
        tokens, _ = run(model, Eagle3Drafter(head), TreeConfig("talon", budget=6, topk=3), prompt, 2,
                        sampling=SamplingConfig(do_sample=True, seed=seed))
        counts[tokens[0], tokens[1]] += 1
    assert chi_square_p(counts, joint) > 1e-3
    assert counts.sum() == 1200


def test_rope_scaling_of_a_published_head_is_kept(head, target, tmp_path):
    """A Llama-3.1-style head states RoPE scaling (legacy "type" spelling too): the loaded head rotates with
    it, and our export writes it back."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    folder = save_eagle3_head(head, tmp_path / "head", dtype=torch.float32)
    config = json.loads((folder / "config.json").read_text())
    assert "rope_scaling" not in config  # plain RoPE writes none
    legacy = {("type" if key == "rope_type" else key): value for key, value in scaling.items()}
    (folder / "config.json").write_text(json.dumps(config | {"rope_scaling": legacy}))
    loaded = load_eagle3_head(folder, target)
    assert loaded.config.rope_scaling == scaling
    reference = LlamaRotaryEmbedding(LlamaConfig(
        hidden_size=loaded.config.hidden_size, num_attention_heads=loaded.config.num_attention_heads,
        head_dim=loaded.config.head_dim, max_position_embeddings=loaded.config.max_position_embeddings,
        rope_parameters=dict(scaling, rope_theta=loaded.config.rope_theta)))
    torch.testing.assert_close(loaded.rotary.inv_freq.cpu(), reference.inv_freq.float())
    assert not torch.allclose(loaded.rotary.inv_freq.cpu(), head.rotary.inv_freq.cpu())  # scaling changed RoPE
    again = save_eagle3_head(loaded, tmp_path / "again", dtype=torch.float32)
    assert json.loads((again / "config.json").read_text())["rope_scaling"] == scaling


def test_the_head_reports_its_catch_up_to_the_controller(target, head):
    """The prompt's features wait in the head until the first drafted step, then each plain step's."""
    from helpers import CyclingController
    from test_oracle import expected_catch_up

    controller = CyclingController()
    prompt = [5, 17, 33, 8, 5, 17]
    tokens, _ = run(target, Eagle3Drafter(head), TreeConfig("talon", budget="auto", topk=3), prompt, 40,
                    controller=controller)
    assert tokens == plain_greedy(target, prompt, 40)
    assert controller.asked == expected_catch_up(controller.budgets, controller.committed, len(prompt))


def test_batched_requests_with_a_random_head_equal_plain_greedy(target, head):
    """The head reads each request's own rows of the batched forward's hidden states."""
    from talon_sd.batch import decode_batch
    from talon_sd.builders import make_builder
    from talon_sd.decoding import Pipeline, StopCondition
    from talon_sd.stats import DecodeStats

    prompts, lengths = ([5, 17, 33, 8, 5, 17], [40], [9, 3, 9, 3, 9, 3, 9, 3, 9, 3]), (30, 12, 21)
    parts = [(Pipeline(CausalLM(target), Eagle3Drafter(head), make_builder(TreeConfig("talon", budget=12, topk=3)),
                       SamplingConfig()), torch.tensor(p), StopCondition(max_new_tokens=n), DecodeStats())
             for p, n in zip(prompts, lengths)]
    outputs = [[] for _ in prompts]
    for index, token in decode_batch(CausalLM(target), parts):
        outputs[index].append(token)
    assert outputs == [plain_greedy(target, p, n) for p, n in zip(prompts, lengths)]
    assert all(stats.draft_forwards > 0 for *_, stats in parts)
