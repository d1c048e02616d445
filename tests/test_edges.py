"""Every model and every option either works exactly or is refused with a clear error.

Sliding-window attention (exact against HF's own greedy), refused attention backends and layer types,
tree-option overrides and contradictions, why a generation stopped (and the streamed text), a draft
whose vocabulary is larger than the target's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from conftest import VOCAB, noisy_copy, plain_greedy, tiny_model
from helpers import make_drafter, run
from talon_sd import SpeculativeGenerator, TalonError, TreeConfig
from talon_sd.errors import TalonWarning
from talon_sd.lm import CausalLM, attention_layout
from test_models import save_tiny_llama

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=2)
WINDOW = 5


def sharpened(model, attention: str = "sdpa"):
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(6.0)
    model.config._attn_implementation = attention
    return model.eval().requires_grad_(False)


def sliding_models():
    torch.manual_seed(3)
    qwen = Qwen2ForCausalLM(Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                                        tie_word_embeddings=False))
    torch.manual_seed(4)
    mistral = MistralForCausalLM(MistralConfig(**COMMON, sliding_window=WINDOW, tie_word_embeddings=False))
    torch.manual_seed(5)
    gemma = Gemma2ForCausalLM(Gemma2Config(**COMMON, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16))
    return {"qwen2-mixed": sharpened(qwen), "mistral-all-sliding": sharpened(mistral), "gemma2-mixed": sharpened(gemma, "eager")}  # Gemma 2's softcap: eager only


@pytest.fixture(scope="module")
def sliding():
    return sliding_models()


def test_layouts_of_sliding_window_models(sliding):
    assert attention_layout(sliding["qwen2-mixed"]).layer_types == ("full_attention", "sliding_attention")
    assert attention_layout(sliding["mistral-all-sliding"]).layer_types == ("sliding_attention",) * 2
    assert attention_layout(sliding["gemma2-mixed"]).sliding_window == WINDOW


@torch.no_grad()
def hf_greedy(model, prompt, count):
    """Hugging Face's own greedy decoding (its sliding-window cache and masks)."""
    output = model.generate(torch.tensor([prompt]), max_new_tokens=count, min_new_tokens=count, do_sample=False,
                            pad_token_id=2, eos_token_id=None)
    return output[0, len(prompt):].tolist()


@pytest.mark.parametrize("attention", ["built", "grouped"])
@pytest.mark.parametrize("name", ["qwen2-mixed", "mistral-all-sliding", "gemma2-mixed"])
@pytest.mark.parametrize("tree", [TreeConfig("talon", budget=12, topk=3), TreeConfig("eagle", budget=10, topk=3, depth=4),
                                  TreeConfig("chain", depth=4), TreeConfig("ar")], ids=lambda t: t.method)
def test_sliding_window_models_match_hf_greedy(sliding, name, tree, attention):
    """The prompt and output are several windows long, so a mask or cache that ignored the window differs. Each model
    runs with the attention it was built with (sdpa; eager for Gemma 2's softcap) and with talon_sd's grouped one."""
    import copy

    target = sliding[name]
    if attention == "grouped":
        target = copy.deepcopy(target)
        target.config._attn_implementation = "grouped"
    prompt = [5, 17, 33, 8, 5, 17, 40, 41, 9, 3, 5, 17, 33]
    expected = hf_greedy(target, prompt, 30)
    assert expected == plain_greedy(target, prompt, 30)
    draft = noisy_copy(target, 0.1, seed=9)
    tokens, stats = run(target, make_drafter("model", draft, VOCAB), tree, prompt, 30)
    assert tokens == expected
    if tree.method != "ar":
        assert stats.mat > 1.2  # trees were really accepted across the window boundary


def test_windowless_mask_would_differ(sliding):
    """Control: the same model with the window switched off gives other tokens, so the test above can fail."""
    import copy

    model = copy.deepcopy(sliding["mistral-all-sliding"])
    model.config.sliding_window = None
    prompt = [5, 17, 33, 8, 5, 17, 40, 41, 9, 3, 5, 17, 33]
    assert plain_greedy(model, prompt, 30) != plain_greedy(sliding["mistral-all-sliding"], prompt, 30)


def test_unsupported_attention_and_layers_are_refused():
    model = tiny_model("llama", seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(TalonError, match=r"^target: attention implementation 'flash_attention_2' .*sdpa"):
        CausalLM(model, role="target")
    with pytest.raises(TalonError, match="draft: attention implementation 'flex_attention'"):
        model.config._attn_implementation = "flex_attention"
        SpeculativeGenerator.from_models(tiny_model("llama", seed=1), model, tree="talon", budget=4)
    chunked = tiny_model("llama", seed=2)
    chunked.config.layer_types = ["full_attention", "chunked_attention"]
    chunked.config.attention_chunk_size = 8
    with pytest.raises(TalonError, match="'chunked_attention' layers"):
        SpeculativeGenerator.from_models(chunked, tree="ar")


def test_load_model_refuses_flash_attention(tmp_path, monkeypatch):
    from talon_sd.models import load_model

    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_llama(tmp_path / "tiny")
    with pytest.raises(TalonError, match="^attn_implementation: got 'flash_attention_2'"):
        load_model(str(folder), attn_implementation="flash_attention_2")


# ---------------------------------------------------------------------------------------------- options
def test_overrides_keep_every_field_not_overridden(llama_pair):
    target, draft = llama_pair
    generator = SpeculativeGenerator.from_models(target, draft, tree=TreeConfig("eagle", budget=32, topk=8, depth=6),
                                                 budget=40)
    assert (generator.tree_config.budget, generator.tree_config.topk, generator.tree_config.depth) == (40, 8, 6)
    talon = TreeConfig("talon", budget=20, topk=7, mu=0.1).with_options(budget=12)
    assert (talon.budget, talon.topk, talon.mu) == (12, 7, 0.1)
    chain = TreeConfig("chain", depth=3).with_options(budget=8)
    assert (chain.budget, chain.depth) == (8, 7)


@pytest.mark.parametrize("options,field", [
    (dict(method="talon", depth=5), "depth"),
    (dict(method="eagle", mu=0.1), "mu"),
    (dict(method="chain", budget=8, depth=3), "budget"),
    (dict(method="chain", topk=3), "topk"),
    (dict(method="static", topk=2), "topk"),
    (dict(method="ar", budget=8), "budget"),
    (dict(method="static", budget="auto"), "budget"),
    (dict(method="chain", budget="auto", depth=3), "depth"),
])
def test_contradictory_or_ignored_options_are_refused(options, field):
    with pytest.raises(TalonError, match=f"^{field}:"):
        TreeConfig(**options)


def test_chain_budget_sets_its_depth():
    assert TreeConfig("chain", budget=6).depth == 5
    assert TreeConfig("chain", depth=2).budget == 3


def test_api_defaults_to_the_online_budget(llama_pair):
    target, draft = llama_pair
    for method in ("talon", "eagle", "chain"):
        assert SpeculativeGenerator.from_models(target, draft, tree=method).tree_config.auto
    assert not SpeculativeGenerator.from_models(target, draft, tree="talon", budget=8).tree_config.auto
    assert not SpeculativeGenerator.from_models(target, draft, tree="chain", depth=2).tree_config.auto


# ---------------------------------------------------------------------------------------------- stopping
WORDS = " ".join(f"w{i}" for i in range(3, 12))


@pytest.fixture(scope="module")
def word_generator(tmp_path_factory):
    from talon_sd.models import load_model

    folder = tmp_path_factory.mktemp("tiny")
    target = load_model(str(save_tiny_llama(folder / "target", seed=0)), dtype="float32", device="cpu")
    draft = load_model(str(save_tiny_llama(folder / "draft", seed=1)), dtype="float32", device="cpu")
    return SpeculativeGenerator.from_models(target.model, draft.model, target.tokenizer, draft_tokenizer=draft.tokenizer,
                                            tree="talon", budget=6, chat_template=False)


def streamed_and_result(generator, **options):
    stream = generator.stream(WORDS, **options)
    text = "".join(stream)
    return text, stream.result


def test_finish_reason_for_each_stop_condition(word_generator):
    free, result = streamed_and_result(word_generator, max_new_tokens=30, ignore_eos=True)
    assert (result.finish_reason, result.stop_reason, len(result.token_ids)) == ("length", "max_new_tokens", 30)
    assert free == result.text
    words = free.split()
    # a stop string made of a word in the middle (string form) and a list with a later one
    for stop in (words[5], [words[9], "never-there"]):
        text, stopped = streamed_and_result(word_generator, max_new_tokens=30, ignore_eos=True, stop=stop)
        first = stop if isinstance(stop, str) else stop[0]
        assert (stopped.finish_reason, stopped.stop_reason, stopped.stop_string) == ("stop", "stop_string", first)
        assert text == stopped.text == free[: free.index(first)]  # the stop string is not part of the text
    # EOS: make a token the model emits a few tokens in (and not before) the end-of-sequence id
    at = next(i for i in range(2, 30) if result.token_ids[i] not in result.token_ids[:i])
    eos_id = result.token_ids[at]
    generator = SpeculativeGenerator.from_models(word_generator.target_model, word_generator.draft_model,
                                                 word_generator.tokenizer, tree="talon", budget=6, chat_template=False)
    generator.eos_token_ids = frozenset({eos_id})
    text, ended = streamed_and_result(generator, max_new_tokens=30)
    assert (ended.finish_reason, ended.stop_reason, ended.token_ids) == ("stop", "eos", result.token_ids[: at + 1])
    assert text == ended.text
    _, ignored = streamed_and_result(generator, max_new_tokens=30, ignore_eos=True)
    assert (ignored.finish_reason, len(ignored.token_ids)) == ("length", 30)


def test_a_stream_never_yields_text_a_stop_string_cuts(word_generator):
    free, _ = streamed_and_result(word_generator, max_new_tokens=20, ignore_eos=True)
    words = free.split()
    stop = f"{words[4]} {words[5]} {words[6]}"  # spans several tokens: its first words must be held back
    chunks = list(word_generator.stream(WORDS, max_new_tokens=20, ignore_eos=True, stop=stop))
    assert "".join(chunks) == free[: free.index(stop)]
    assert all(words[4] not in chunk for chunk in chunks[-2:]) or free.index(stop) > free.index(words[4])


def test_context_limit_lowers_max_new_tokens_with_a_warning(word_generator):
    with pytest.warns(TalonWarning, match="max_new_tokens: lowered from 1000"):
        result = word_generator.generate(WORDS, max_new_tokens=1000, ignore_eos=True)
    assert result.finish_reason == "length" and result.stop_reason == "context"
    assert len(result.token_ids) < 1000


def test_short_draft_context_is_checked(llama_pair):
    target, draft = llama_pair
    import copy

    short = copy.deepcopy(draft)
    short.config.max_position_embeddings = 40
    generator = SpeculativeGenerator.from_models(target, short, tree="talon", budget=8)
    with pytest.raises(TalonError, match="draft's context is 40"):
        generator.generate(input_ids=list(range(3, 40)), max_new_tokens=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = generator.generate(input_ids=[5, 6, 7], max_new_tokens=100, ignore_eos=True)
    assert any("draft's context of 40" in str(w.message) for w in caught)
    assert len(result.token_ids) <= 40 - 3 - 8


# ---------------------------------------------------------------------------------------------- vocabulary
def test_a_draft_with_a_larger_vocabulary_never_puts_an_unknown_id_in_a_tree():
    target = tiny_model("llama", seed=0)
    torch.manual_seed(1)
    big = tiny_model("llama", seed=1, vocab=VOCAB + 32)
    with torch.no_grad():  # make the extra ids the draft's favourites
        big.lm_head.weight[VOCAB:] = big.lm_head.weight[:32] * 3
    generator = SpeculativeGenerator.from_models(target, big, tree="talon", budget=10)
    prompt = [5, 17, 33, 8, 5, 17]
    result = generator.generate(input_ids=prompt, max_new_tokens=20, ignore_eos=True)
    assert result.token_ids == plain_greedy(target, prompt, 20)


def test_from_models_compares_tokenizers_when_both_are_given(tmp_path):
    from talon_sd.models import load_model

    a = load_model(str(save_tiny_llama(tmp_path / "a", vocab=64)), dtype="float32", device="cpu")
    b = load_model(str(save_tiny_llama(tmp_path / "b", vocab=48)), dtype="float32", device="cpu")
    with pytest.raises(TalonError, match="^draft: vocabulary differs"):
        SpeculativeGenerator.from_models(a.model, b.model, a.tokenizer, draft_tokenizer=b.tokenizer)


def test_onednn_packed_float32_models_decode_exactly(tmp_path, monkeypatch):
    """cpu_kernels='packed' packs float32 linears for oneDNN: same greedy tokens as the unpacked model, and
    speculative output still equal to plain greedy of the packed target."""
    import copy

    from talon_sd.lm import pack_linears_for_cpu

    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    target, draft = tiny_model("qwen2", seed=5).cpu(), tiny_model("qwen2", seed=6).cpu()  # packing is CPU-only
    packed_target, packed_draft = copy.deepcopy(target), copy.deepcopy(draft)
    assert pack_linears_for_cpu(packed_target) == 2 * 7 + 1 and pack_linears_for_cpu(packed_draft) == 15
    prompt = [5, 17, 33, 8, 5, 17]
    with torch.no_grad():
        torch.testing.assert_close(packed_target(torch.tensor([prompt])).logits, target(torch.tensor([prompt])).logits,
                                   atol=1e-4, rtol=1e-4)
    expected = plain_greedy(packed_target, prompt, 30)
    assert expected == plain_greedy(target, prompt, 30)
    tokens, _ = run(packed_target, make_drafter("model", packed_draft, VOCAB), TreeConfig("talon", budget=8, topk=3), prompt, 30)
    assert tokens == expected
    folder = save_tiny_llama(tmp_path / "tiny")
    generator = SpeculativeGenerator(str(folder), str(folder), dtype="float32", device="cpu", tree="talon", budget=6,
                                     cpu_kernels="packed", quantize="none")
    assert any(type(m).__name__ == "MkldnnLinear" for m in generator.target_model.modules())
    assert generator.cpu_kernels == {"target": "packed", "draft": "packed"}
    plain = SpeculativeGenerator(str(folder), str(folder), dtype="float32", device="cpu", tree="talon", budget=6,
                                 cpu_kernels="default", quantize="none")
    assert not any(type(m).__name__ == "MkldnnLinear" for m in plain.target_model.modules())
    assert plain.cpu_kernels == {"target": "default", "draft": "default"}
    ids = [3, 4, 5, 3, 4]
    assert generator.generate(input_ids=ids, max_new_tokens=12).token_ids == plain.generate(input_ids=ids, max_new_tokens=12).token_ids
    with pytest.raises(TalonError, match="^cpu_kernels: got 'fast'"):
        SpeculativeGenerator(str(folder), str(folder), dtype="float32", device="cpu", cpu_kernels="fast")


def test_packing_releases_the_weight_file_and_keeps_tied_weights_tied(tmp_path):
    """A model loaded from safetensors views the file through one mapping; after packing, nothing of the model
    may still view it (else the whole file stays resident beside the packed copies), with the same logits and
    a tied input/output embedding still one tensor."""
    import gc

    from talon_sd.lm import pack_linears_for_cpu
    from talon_sd.models import load_model

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "tied")
    weights = str((tmp_path / "tied" / "model.safetensors").resolve())

    def mapped() -> bool:
        gc.collect()
        with open("/proc/self/maps") as maps:
            return any(line.rstrip().endswith(weights) for line in maps)

    model = load_model(str(tmp_path / "tied"), dtype="float32", device="cpu", with_tokenizer=False).model
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    prompt = torch.tensor([[5, 17, 33, 8, 5, 17]])
    with torch.no_grad():
        before = model(prompt).logits
    embedding = model.get_input_embeddings()
    assert mapped()  # loaded as a view of the file: what packing must release
    assert pack_linears_for_cpu(model) == 2 * 7 + 1
    assert not mapped()
    assert model.get_input_embeddings() is embedding and not embedding.weight.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(model(prompt).logits, before, atol=1e-4, rtol=1e-4)
    # the tie survives the copies: one tensor for every module that shared it
    model = Qwen2ForCausalLM(config).eval()
    assert pack_linears_for_cpu(model, keep_output=True) == 2 * 7  # the output embedding stays a plain Linear
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight


def test_auto_cpu_kernels_pack_only_where_one_row_is_not_slower(tmp_path, monkeypatch):
    """cpu_kernels='auto' times 1 and 4 rows through the model's largest linear both ways and packs when the
    packed path serves one row at least as fast, or nearly as fast (ONE_ROW_TOLERANCE) while serving 4 rows
    in FEW_ROWS_WIN of the time (plain decoding is the floor speculation must not lower)."""
    from talon_sd import lm

    model = tiny_model("qwen2", seed=5).cpu()
    choose = lambda seconds: lm.choose_cpu_kernels(model, measure=lambda m: seconds)  # noqa: E731
    assert choose({1: (0.0020, 0.0010)}) == "packed"
    assert choose({1: (0.0010, 0.0012)}) == "default"  # one row only: no few-row evidence
    assert choose({1: (0.0010, 0.0012), 4: (0.0100, 0.0040)}) == "packed"  # within tolerance, 4 rows 0.4x
    assert choose({1: (0.0010, 0.0012), 4: (0.0100, 0.0070)}) == "default"  # 4 rows only 0.7x
    assert choose({1: (0.0010, 0.0013), 4: (0.0100, 0.0030)}) == "default"  # one row 1.3x: plain would slow
    # the Intel Xeon's measured ratios (docs/BENCHMARKS.md, "Dtypes and kernels") keep torch's own kernel
    assert choose({1: (0.232, 0.280), 4: (0.178, 0.154)}) == "default"
    assert choose(None) == "default"
    # a disturbed measurement is measured again: "default" only when every measurement says so
    readings = iter([{1: (0.0010, 0.0013)}, {1: (0.0010, 0.0008)}])
    calls = []
    assert lm.choose_cpu_kernels(model, measure=lambda m: calls.append(1) or next(readings)) == "packed"
    assert len(calls) == 2
    calls.clear()
    assert lm.choose_cpu_kernels(model, measure=lambda m: calls.append(1) or {1: (0.0010, 0.0013)}) == "default"
    assert len(calls) == lm.KERNEL_MEASUREMENTS
    measured = lm.linear_seconds(model, repeats=3)  # the real measurement: positive times for 1 and 4 rows
    assert measured is not None and set(measured) == {1, 4}
    assert all(seconds > 0 for pair in measured.values() for seconds in pair)
    assert lm.linear_seconds(tiny_model("qwen2", seed=5).to(torch.bfloat16)) is None  # nothing to pack
    head_only = tiny_model("qwen2", seed=5).to(torch.bfloat16)
    head_only.lm_head.float()  # the output embedding is the only float32 linear: never timed (a GB on real models)
    assert lm.linear_seconds(head_only) is None
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    lm.linear_seconds(model, repeats=1)
    assert torch.equal(torch.rand(3), expected_draw)  # a user's seeded sequence is not moved by the measurement
    before = [p.clone() for p in model.parameters()]
    lm.linear_seconds(model, repeats=2)  # measuring leaves the model as it was
    assert not any(type(m).__name__ == "MkldnnLinear" for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))

    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_llama(tmp_path / "tiny")
    for seconds, expected in (({1: (0.002, 0.001)}, "packed"), ({1: (0.001, 0.002), 4: (0.004, 0.003)}, "default")):
        monkeypatch.setattr(lm, "linear_seconds", lambda m, seconds=seconds: seconds)
        generator = SpeculativeGenerator(str(folder), str(folder), dtype="float32", device="cpu", tree="talon", budget=6,
                                         quantize="none")
        assert generator.cpu_kernels == {"target": expected, "draft": expected}
        assert any(type(m).__name__ == "MkldnnLinear" for m in generator.target_model.modules()) == (expected == "packed")


def test_an_int8_draft_changes_what_is_proposed_never_the_output(tmp_path, monkeypatch):
    """The draft LM's float32 linears dynamically quantized to int8 (output head included), no target linear: every
    tree method still reproduces the target's plain greedy output; quantize='auto' takes int8 only where one int8
    row is measured at least as fast as the fastest float32 path; the controller's memory is kept apart.
    quantize='int8' makes target and draft weight-only int8, and speculation reproduces that target."""
    import copy

    from talon_sd import lm
    from talon_sd.controller_memory import memory_key

    target, draft = tiny_model("qwen2", seed=5).cpu(), tiny_model("qwen2", seed=6).cpu()
    int8_draft = copy.deepcopy(draft)
    assert lm.quantize_linears_int8(int8_draft) == 2 * 7 + 1
    assert lm.kernels_of(int8_draft) == "int8" and lm.kernels_of(draft) == "default"
    assert lm.quantize_linears_int8(int8_draft) == 0  # nothing float32 left to quantize
    prompt = [5, 17, 33, 8, 5, 17]
    with torch.no_grad():
        moved = (int8_draft(torch.tensor([prompt])).logits - draft(torch.tensor([prompt])).logits).abs().max()
    assert 0 < moved < 0.5  # another draft, close to the float32 one
    expected = plain_greedy(target, prompt, 30)
    for tree in (TreeConfig("talon", budget=8, topk=3), TreeConfig("eagle", budget=8, topk=3, depth=3),
                 TreeConfig("chain", budget=5, depth=4)):
        tokens, _ = run(target, make_drafter("model", int8_draft, VOCAB), tree, prompt, 30)
        assert tokens == expected, tree

    choose = lambda seconds: lm.choose_draft_quantization(draft, measure=lambda m, fallback: seconds)  # noqa: E731
    assert choose((0.0042, 0.0005)) == "int8"  # the AVX2-only EPYC's reading of the 0.5B draft
    assert choose((0.0010, 0.0020)) == "none"
    assert choose(None) == "none"
    measured = lm.int8_linear_seconds(draft, repeats=2)  # the real measurement leaves the model as it was
    assert measured is not None and all(seconds > 0 for seconds in measured) and lm.kernels_of(draft) == "default"
    assert lm.int8_linear_seconds(tiny_model("qwen2", seed=5).to(torch.bfloat16)) is None

    from talon_sd.bench.machine import _weights

    assert _weights(int8_draft) == _weights(draft)  # int8 weights counted where parameters no longer hold them
    tied = Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    tied_int8 = copy.deepcopy(tied)
    assert lm.quantize_linears_int8(tied_int8) == 7 + 1 and lm.is_int8_linear(tied_int8.get_output_embeddings())
    assert _weights(tied_int8) == _weights(tied)  # the tied head's int8 copy is not a second embedding

    # a tuned profile's draft curve starts only the kind of draft it timed (int8 forwards cost a third)
    import argparse

    from talon_sd import cli_common as cli
    from talon_sd.bench import profiles

    profile = {"methods": {"talon": {"best": {"budget": 12}}},
               "cost_curve": {"verify": {"1": 0.4, "8": 0.6}, "draft": {"1": 0.12}}}
    monkeypatch.setattr(profiles, "find_profile", lambda key: (profile, "profile.json"))
    for setting, timed, prior in (("none", None, True), ("int8", None, False), ("int8", "int8-weights", True),
                                  ("none", "int8", False), ("int4", "int4", True), ("int4", "int8", False)):
        profile["draft_kernels"] = timed
        args = argparse.Namespace(target=None, draft=None, dtype="float32", device="cpu", drafter="model",
                                  quantize=setting, temperature=0.0)
        start = cli.controller_start(args, TreeConfig("talon", budget="auto"))
        assert start["initial_budget"] == 12 and ("cost_prior" in start) == prior, (setting, timed)
    args.quantize = "auto"
    assert cli._expected_draft_kernels(args) == ("int8" if lm.int8_available() else None)
    args.dtype = "bfloat16"
    assert cli._expected_draft_kernels(args) == ("int8" if lm.int8_available() else None)  # loaded in float32 for it

    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_llama(tmp_path / "tiny")
    make = lambda quantize: SpeculativeGenerator(str(folder), str(folder), dtype="float32", device="cpu",  # noqa: E731
                                                 tree="talon", budget=6, cpu_kernels="default", quantize=quantize)
    monkeypatch.setattr(lm, "int8_linear_seconds", lambda m, fallback: (0.002, 0.001))  # int8 faster: auto quantizes the draft
    made = {setting: make(setting) for setting in ("auto", "none", "int8")}
    assert made["auto"].cpu_kernels == {"target": "default", "draft": "int8"}
    assert made["none"].cpu_kernels == {"target": "default", "draft": "default"}
    assert made["int8"].cpu_kernels == {"target": "int8-weights", "draft": "int8-weights"}
    ids = [3, 4, 5, 3, 4]
    for setting, generator in made.items():
        reference = "int8" if setting == "int8" else "none"  # the output is the (quantized) target's
        assert (generator.generate(input_ids=ids, max_new_tokens=12).token_ids
                == made[reference].generate(input_ids=ids, max_new_tokens=12, tree="ar").token_ids), setting
    assert memory_key(made["auto"], None, None) != memory_key(made["none"], None, None)
    monkeypatch.setattr(lm, "int8_linear_seconds", lambda m, fallback: (0.001, 0.002))  # int8 slower: auto keeps float32
    assert make("auto").cpu_kernels["draft"] == "default"
    # a bfloat16 run loads its draft in float32 to quantize it, and casts it to bfloat16 where int8 is slower
    make_bf16 = lambda quantize: SpeculativeGenerator(str(folder), str(folder), dtype="bfloat16", device="cpu",  # noqa: E731
                                                      tree="talon", budget=6, quantize=quantize)
    slower = make_bf16("auto")
    assert slower.cpu_kernels["draft"] == "default" and slower.draft_model.dtype == torch.bfloat16
    monkeypatch.setattr(lm, "int8_linear_seconds", lambda m, fallback: (0.002, 0.001))
    faster, as_loaded = make_bf16("auto"), make_bf16("none")
    assert faster.cpu_kernels["draft"] == "int8" and as_loaded.draft_model.dtype == torch.bfloat16
    assert faster.target_model.dtype == torch.bfloat16 and as_loaded.cpu_kernels["draft"] == "default"
    assert len(faster.generate(input_ids=ids, max_new_tokens=12, ignore_eos=True).token_ids) == 12  # mixed dtypes run
    with pytest.raises(TalonError, match="^quantize: got 'int3'"):
        make("int3")


def test_auto_budget_calls_continue_the_previous_calls_controller_per_method_drafter_and_mode(llama_pair):
    target, draft = llama_pair
    generator = SpeculativeGenerator.from_models(target, draft, tree="talon")  # budget "auto"
    prompt = torch.tensor([5, 9, 14, 3, 7, 11])
    first = generator.generate(input_ids=prompt, max_new_tokens=40)
    learned = generator.learned_budget
    assert set(learned) == {("talon", "model", False)}
    key = ("talon", "model", False)
    assert generator.controller_memory()[key].verify.adds == first.stats.target_forwards
    second = generator.generate(input_ids=prompt, max_new_tokens=40)
    # starts where the first call ended: its controller goes on counting (which budget its first step takes
    # depends on measured costs, which a loaded machine changes: not asserted)
    assert generator.controller_memory()[key].verify.adds == first.stats.target_forwards + second.stats.target_forwards
    assert second.stats.reasons[0] != "initial"
    assert second.token_ids == first.token_ids == plain_greedy(target, prompt.tolist(), 40)
    generator.generate(input_ids=prompt, max_new_tokens=20, drafter="ngram")
    generator.generate(input_ids=prompt, max_new_tokens=20, do_sample=True, seed=0)
    assert set(generator.learned_budget) == {("talon", "model", False), ("talon", "ngram", False),
                                             ("talon", "model", True)}
    memory = generator.controller_memory()  # n-gram matches do not follow the target's confidence (control docs)
    assert memory[("talon", "ngram", False)].settings.kind_floor == 0 < memory[key].settings.kind_floor
