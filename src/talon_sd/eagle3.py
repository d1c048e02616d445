"""EAGLE-3 draft heads: the module, reading published checkpoints, and writing our own.

An EAGLE-3 head (Li et al., "EAGLE-3", 2025; ../shared/reference/eagle3_training.md) drafts from the
TARGET's hidden states instead of running a second LM. For the committed token at position t it takes
``f_t``, the residual stream entering three target layers (default {2, L//2, L-3}) concatenated
``[3 * H_target]``, projects it with ``fc`` to H, and pairs it with the embedding of the next token
x_{t+1}; one Llama-style decoder layer over ``[input_layernorm(embed) ; hidden_norm(h)]`` (2H wide
q/k/v, residual on h, then MLP) gives a hidden state whose ``lm_head(norm(.))`` predicts x_{t+2} over a
draft vocabulary of ``Vd`` ids (``target_id = draft_id + d2t[draft_id]``). Deeper draft steps feed the
layer's own output hidden state back in place of ``fc(f)``.

Checkpoint format (what SafeAILab/EAGLE, SpecForge, SGLang and vLLM read and write):

    config.json         Llama-style keys, num_hidden_layers 1, vocab_size (target), draft_vocab_size,
                        optional target_hidden_size and aux layer ids in two conventions:
                        eagle_aux_hidden_state_layer_ids (vLLM: the layers whose *inputs* are read, as
                        here) and eagle_config.eagle_aux_hidden_state_layer_ids (SGLang, SpecForge: the
                        layers whose *outputs* are read, i.e. ours minus one); both are written, the
                        top-level key wins when reading
    model.safetensors   fc.weight [H, 3H_t], midlayer.{hidden_norm, input_layernorm,
    (or pytorch_model.bin)  post_attention_layernorm}.weight [H], midlayer.self_attn.{q,k,v,o}_proj.weight,
                        midlayer.mlp.{gate,up,down}_proj.weight, norm.weight, lm_head.weight [Vd, H],
                        d2t [Vd] int64, t2d [V] bool; optional embed_tokens.weight
    vLLM spelling:      layers.0.* for midlayer.*, draft_id_to_target_id for d2t (t2d absent)

This module holds no decoding state; :class:`talon_sd.drafters.eagle3.Eagle3Drafter` keeps the head's
KV cache, and ``talon train-head`` (:mod:`talon_sd.train`) trains it.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

import torch
from torch import nn

from .errors import TalonError

REQUIRED_TENSORS = (
    "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight",
    "midlayer.self_attn.v_proj.weight", "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight",
)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target layers whose inputs EAGLE-3 reads by default: 2, L // 2 and L - 3."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """The head's shape, as config.json states it."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    # RoPE scaling as transformers' rope_parameters name it, rope_theta left out (e.g. {"rope_type": "llama3",
    # "factor": 8.0, ...} for Llama 3.1 heads); None: plain RoPE
    rope_scaling: dict | None = field(default=None, compare=False)

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layers: tuple[int, ...] | None = None) -> "Eagle3Config":
        """A head shaped like the target's decoder layers (what EAGLE-3 trains for a target)."""
        text = target_config.get_text_config(decoder=True)
        hidden = int(text.hidden_size)
        heads = int(text.num_attention_heads)
        rope = getattr(text, "rope_parameters", None) or {}
        return cls(
            hidden_size=hidden, intermediate_size=int(text.intermediate_size), num_attention_heads=heads,
            num_key_value_heads=int(getattr(text, "num_key_value_heads", heads)),
            head_dim=int(getattr(text, "head_dim", None) or hidden // heads), vocab_size=int(text.vocab_size),
            draft_vocab_size=int(draft_vocab_size), target_hidden_size=hidden,
            aux_layers=tuple(aux_layers or default_aux_layers(int(text.num_hidden_layers))),
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", getattr(text, "rope_theta", 10000.0))),
            max_position_embeddings=int(getattr(text, "max_position_embeddings", 32768)),
            rope_scaling=_rope_scaling(rope),
        )

    @classmethod
    def from_json(cls, data: dict, target_config=None, where: str = "config.json") -> "Eagle3Config":
        """Read a published config.json (SafeAILab, SpecForge, vLLM spellings); missing aux layers
        default to {2, L//2, L-3} of the target."""
        try:
            hidden = int(data["hidden_size"])
            heads = int(data["num_attention_heads"])
            vocab = int(data["vocab_size"])
            intermediate = int(data["intermediate_size"])
        except (KeyError, TypeError, ValueError) as error:
            raise TalonError(f"draft: {where} lacks a usable {error} (expected a Llama-style EAGLE-3 head config)") from None
        aux = data.get("eagle_aux_hidden_state_layer_ids")  # vLLM: layer inputs, our convention
        nested = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if aux is None and nested is not None:  # SGLang/SpecForge: layer outputs (the input of the next layer)
            aux = [int(i) + 1 for i in nested]
        if aux is None:
            if target_config is None:
                raise TalonError(f"draft: {where} names no aux layers and no target is given to default them")
            aux = default_aux_layers(int(target_config.get_text_config(decoder=True).num_hidden_layers))
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        return cls(
            hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads), vocab_size=vocab,
            draft_vocab_size=int(data.get("draft_vocab_size") or vocab),
            target_hidden_size=int(data.get("target_hidden_size") or hidden), aux_layers=tuple(int(i) for i in aux),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", data.get("rope_theta", 10000.0))),
            max_position_embeddings=int(data.get("max_position_embeddings", 32768)),
            hidden_act=str(data.get("hidden_act", "silu")), rope_scaling=_rope_scaling(rope),
        )

    def to_json(self) -> dict:
        """config.json as SpecForge/SGLang write it (read by SafeAILab, SGLang and vLLM)."""
        return {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            **({"rope_scaling": dict(self.rope_scaling)} if self.rope_scaling else {}),
            # two conventions for one set of layers: vLLM reads the top-level ids as layer inputs (ours);
            # SGLang and SpecForge read eagle_config's as layer outputs and capture the input of id + 1
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in self.aux_layers],
                             "use_aux_hidden_state": True},
        }

    def llama_config(self):
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim, num_hidden_layers=1, vocab_size=self.vocab_size, rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings, hidden_act=self.hidden_act,
            rope_parameters=dict(self.rope_scaling or {"rope_type": "default"}, rope_theta=self.rope_theta),
        )


def _rope_scaling(rope: dict) -> dict | None:
    """The scaling part of a config's rope_parameters / rope_scaling (legacy "type" read as "rope_type"),
    or None for plain RoPE."""
    rope = dict(rope or {})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope.pop("rope_theta", None)
    return rope if rope.get("rope_type") not in (None, "default") else None


class _Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width = config.num_attention_heads * config.head_dim
        kv_width = config.num_key_value_heads * config.head_dim
        self.q_proj = nn.Linear(2 * config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(2 * config.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(2 * config.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.mlp = LlamaMLP(config.llama_config())


class Eagle3Head(nn.Module):
    """The head's weights and its steps; attention is left to the caller (inference cache or training-time test).

    One draft step for T rows, as the drafter and the trainer both run it::

        h = head.project(features)                         # [T, H] from [T, 3H_t] (first step only)
        q, k, v = head.qkv(h, token_ids, positions)        # [heads, T, d], [kv_heads, T, d] x 2, RoPE applied
        attended = attention(q, k, v, mask)                # [heads, T, d], the caller's keys and mask
        h_out = head.finish(h, attended)                   # [T, H]: residual + MLP (fed back next step)
        log_p = head.log_p_draft(h_out)                    # [T, Vd]
    """

    def __init__(self, config: Eagle3Config, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        self.embed_tokens = embed_tokens  # the target's, frozen; never saved with the head
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(config.llama_config())
        # float32 master copies of the rotary frequencies (not buffers: casts leave them alone), see _apply
        self._rotary_float32 = {name: buffer.detach().clone().float() for name, buffer in self.rotary.named_buffers()}
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool) if config.draft_vocab_size ==
                             config.vocab_size else torch.zeros(config.vocab_size, dtype=torch.bool))

    def _apply(self, fn, recurse=True):
        """Moves and casts keep the rotary frequencies in float32, as vLLM and SGLang compute RoPE: a bf16
        head would otherwise round them (2^-9 relative), turning far positions by a wrong angle."""
        super()._apply(fn, recurse)
        device = self.rotary.inv_freq.device
        for name, frequencies in self._rotary_float32.items():
            setattr(self.rotary, name, frequencies.to(device))
        return self

    # ------------------------------------------------------------------ one draft step, in parts
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """[T, 3H_t] target features -> [T, H]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def qkv(self, hidden: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor):
        """Queries [heads, T, d] and keys, values [kv_heads, T, d] (RoPE at ``positions`` [T]) for rows
        whose input is ``hidden`` [T, H] and the embedding of ``token_ids`` [T]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        layer, config = self.midlayer, self.config
        embedded = self.embed_tokens(token_ids.to(self.embed_tokens.weight.device)).to(hidden.device, hidden.dtype)
        inputs = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)  # [T, 2H]
        count = inputs.shape[0]
        q = layer.self_attn.q_proj(inputs).view(count, config.num_attention_heads, config.head_dim).transpose(0, 1)
        k = layer.self_attn.k_proj(inputs).view(count, config.num_key_value_heads, config.head_dim).transpose(0, 1)
        v = layer.self_attn.v_proj(inputs).view(count, config.num_key_value_heads, config.head_dim).transpose(0, 1)
        cos, sin = self.rotary(v, positions.to(v.device)[None])  # [1, T, d]
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        return q[0], k[0], v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Scaled dot-product attention with grouped kv heads; ``bias`` [T, S] additive (0 or -inf-like)."""
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        k = k.repeat_interleave(groups, dim=0)  # [heads, S, d]
        v = v.repeat_interleave(groups, dim=0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.device, q.dtype))  # [heads, T, d]

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual on ``hidden`` [T, H] plus the attention output, then the MLP: the step's output [T, H]."""
        layer = self.midlayer
        count = hidden.shape[0]
        hidden = hidden + layer.self_attn.o_proj(attended.transpose(0, 1).reshape(count, -1))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def draft_logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, Vd] logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden_out)).float()

    def target_ids(self) -> torch.Tensor:
        """[Vd] the target id of every draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def trainable_parameters(self):
        return [p for name, p in self.named_parameters() if not name.startswith("embed_tokens")]


def _read_tensors(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    safetensors_file = folder / "model.safetensors"
    bin_file = folder / "pytorch_model.bin"
    try:
        if bin_file.is_file():
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        if safetensors_file.is_file():
            from safetensors.torch import load_file

            return load_file(str(safetensors_file))
    except Exception as error:  # corrupt files raise many types
        raise TalonError(f"draft: cannot read the EAGLE-3 weights in {folder} ({str(error).splitlines()[0]})") from None
    raise TalonError(f"draft: {folder} has no model.safetensors or pytorch_model.bin (expected an EAGLE-3 head)")


def _canonical_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """vLLM's spelling (layers.0.*, draft_id_to_target_id) and prefixes (model.) to SafeAILab's."""
    named = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("model.") if not name.startswith("model.layers") else name.removeprefix("model.")
        if name.startswith("layers.0."):
            name = "midlayer." + name.removeprefix("layers.0.")
        if name == "draft_id_to_target_id":
            name = "d2t"
        named[name] = tensor
    return named


def load_eagle3_head(source: str | pathlib.Path, target_model) -> Eagle3Head:
    """Read an EAGLE-3 head folder for ``target_model``; one-line TalonError when it does not fit."""
    folder = pathlib.Path(source).expanduser()
    if not folder.is_dir():
        raise TalonError(f"draft: no such EAGLE-3 head folder {str(source)!r}")
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise TalonError(f"draft: cannot read {folder / 'config.json'} ({error.__class__.__name__})") from None
    target_text = target_model.config.get_text_config(decoder=True)
    config = Eagle3Config.from_json(data, target_model.config, where=str(folder / "config.json"))
    target_hidden = int(target_text.hidden_size)
    if config.target_hidden_size != target_hidden:
        raise TalonError(f"draft: the head reads target hidden size {config.target_hidden_size}, the target has {target_hidden}")
    target_vocab = int(target_model.get_input_embeddings().weight.shape[0])
    if config.vocab_size != target_vocab:
        raise TalonError(f"draft: the head's vocab_size is {config.vocab_size}, the target's is {target_vocab}")
    layers = int(target_text.num_hidden_layers)
    if any(not 0 <= layer < layers for layer in config.aux_layers) or len(config.aux_layers) != 3:
        raise TalonError(f"draft: aux layers {list(config.aux_layers)} do not fit a target of {layers} layers")
    tensors = _canonical_names(_read_tensors(folder))
    missing = [name for name in REQUIRED_TENSORS if name not in tensors]
    if missing:
        raise TalonError(f"draft: the EAGLE-3 head in {folder} lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    if config.draft_vocab_size != config.vocab_size and "d2t" not in tensors:
        raise TalonError(f"draft: the head's draft vocabulary ({config.draft_vocab_size}) needs a d2t tensor")
    embed = target_model.get_input_embeddings()
    if "embed_tokens.weight" in tensors:
        if tuple(tensors["embed_tokens.weight"].shape) != tuple(embed.weight.shape):
            raise TalonError("draft: the head's embed_tokens does not match the target's embedding")
    head = Eagle3Head(config, embed)
    state = {name: tensor for name, tensor in tensors.items() if name != "embed_tokens.weight" and name != "t2d"}
    expected = {name: tuple(p.shape) for name, p in head.state_dict().items() if not name.startswith(("embed_tokens", "rotary"))}

    def check_shape(name: str, tensor: torch.Tensor) -> None:
        if name in expected and tuple(tensor.shape) != expected[name]:
            raise TalonError(f"draft: tensor {name} has shape {tuple(tensor.shape)}, the config implies {expected[name]}")

    for name, tensor in state.items():
        check_shape(name, tensor)
    if "d2t" in state:  # t2d follows from d2t; a stored t2d must agree with it
        ids = torch.arange(config.draft_vocab_size) + state["d2t"].long()  # [Vd] target ids, as head.target_ids()
        if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
            raise TalonError("draft: the head's d2t maps draft ids outside the target vocabulary")
        state["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool).index_fill_(0, ids, True)
        if "t2d" in tensors and not torch.equal(tensors["t2d"].bool(), state["t2d"]):
            raise TalonError("draft: the head's t2d does not mark exactly the target ids its d2t maps to")
    elif "t2d" in tensors:
        check_shape("t2d", tensors["t2d"])
        state["t2d"] = tensors["t2d"].bool()
    head.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    device, dtype = embed.weight.device, embed.weight.dtype
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_eagle3_head(head: Eagle3Head, folder: str | pathlib.Path, dtype: torch.dtype = torch.bfloat16) -> pathlib.Path:
    """Write ``head`` in the published format: config.json + model.safetensors (no embed_tokens)."""
    from safetensors.torch import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in head.state_dict().items():
        if name.startswith(("embed_tokens", "rotary")):
            continue
        tensor = tensor.detach().cpu()
        tensors[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    from .train.store import atomic_target, atomic_write_text  # here: talon_sd.train imports this module

    (folder / "pytorch_model.bin").unlink(missing_ok=True)  # an older head's .bin would win over this export
    # written beside, then renamed: an interrupted export leaves the previous head whole, never half a file
    with atomic_target(folder / "model.safetensors") as temporary:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(temporary))
    atomic_write_text(folder / "config.json", json.dumps(head.config.to_json(), indent=2))
    return folder


def init_eagle3_head(target_model, draft_vocab: torch.Tensor | None = None, aux_layers=None, seed: int = 0,
                     output_from_target: bool = False) -> Eagle3Head:
    """A fresh head for ``target_model``: ``draft_vocab`` [Vd] sorted target ids (None: the full vocabulary),
    weights initialised like a Llama layer (normal std 0.02, norms at 1). ``output_from_target``: the
    head's ``lm_head`` starts from the target's output rows of the draft vocabulary and its final ``norm``
    from the target's final norm (the head's hidden size is the target's), so training starts from "predict
    the target's last hidden state" rather than from a random vocabulary projection (vLLM's speculators
    initialise their EAGLE-3 drafts the same way)."""
    target_vocab = int(target_model.get_input_embeddings().weight.shape[0])
    used = torch.arange(target_vocab) if draft_vocab is None else torch.as_tensor(draft_vocab, dtype=torch.long).sort().values
    config = Eagle3Config.for_target(target_model.config, int(used.numel()), aux_layers)
    generator = torch.Generator().manual_seed(seed)
    head = Eagle3Head(config, target_model.get_input_embeddings())
    with torch.no_grad():
        for name, parameter in head.named_parameters():
            if name.startswith("embed_tokens"):
                continue
            if parameter.dim() == 1:
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
        head.d2t.copy_(used - torch.arange(used.numel()))
        head.t2d.zero_()
        head.t2d[used] = True
        if output_from_target:
            output = target_model.get_output_embeddings()
            decoder = target_model.get_decoder() if hasattr(target_model, "get_decoder") else None
            final_norm = getattr(decoder, "norm", None)
            if output is None or final_norm is None or getattr(final_norm, "weight", None) is None:
                raise TalonError("head-init: the target has no output embedding and final norm to start the head "
                                 "from; use --head-init random")
            rows = output.weight.detach()[used.to(output.weight.device)]  # [Vd, H]
            head.lm_head.weight.copy_(rows.to(device=head.lm_head.weight.device, dtype=head.lm_head.weight.dtype))
            head.norm.weight.copy_(final_norm.weight.detach().to(device=head.norm.weight.device,
                                                                 dtype=head.norm.weight.dtype))
    head.embed_tokens.weight.requires_grad_(False)
    embed = target_model.get_input_embeddings().weight
    return head.to(device=embed.device, dtype=embed.dtype)  # beside the target (a GPU target trains on the GPU)


def attention_bias(visible: torch.Tensor) -> torch.Tensor:
    """[T, S] bool -> additive float mask (0 where visible, a large negative number elsewhere)."""
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device)
    return bias.masked_fill_(~visible, torch.finfo(torch.float32).min)
