"""The one boundary to Hugging Face models: a causal LM with its own KV cache.

Tree attention reaches the model only through the forward call's public arguments: ``input_ids``,
``position_ids``, a 4-D additive ``attention_mask`` ``[1, 1, T, past + T]`` and a ``DynamicCache``
(no copied modeling files, no patched attention); or, for Llama, Qwen2 and Mistral models with the CPU's
``grouped`` attention, through :mod:`talon_sd.decoder`, which computes that forward's arithmetic op for op (tested
bit for bit) without its per-module overhead. Cache layout while verifying a tree of N nodes::

    cache rows:  [ committed tokens except the root (past) | root n1 n2 ... n(N-1) ]
                                                              ^ tree nodes, index order
    after acceptance of the path root -> n2 -> n5:
                 [ committed tokens except the root | root n2 n5 ]      (one gather per tensor)

Which models fit this contract (checked when a :class:`CausalLM` is made, see :func:`attention_layout`):

* attention implementation ``grouped`` (:mod:`talon_sd.attention`), ``sdpa`` or ``eager`` (the ones that take an
  additive 4-D mask);
  ``flash_attention_*`` and ``flex_attention`` ignore or reject such a mask and are refused;
* every layer ``full_attention`` or ``sliding_attention`` (Llama, Qwen2/2.5/3, Mistral, Gemma 2/3,
  Phi-3, ...). Sliding-window layers are supported exactly: the cache keeps every row (a full
  :class:`ReservedLayer`, never the rolling window layer, so "row == position" holds for committed
  tokens and ``keep``/``crop`` stay one gather), and the mask of a sliding layer also hides keys
  at positions ``<= query position - window``, as the model's own mask does. Models whose layers
  are mixed get a mask per layer type (``{"full_attention": ..., "sliding_attention": ...}``);
* anything else (chunked attention, linear attention / state-space layers, KV sharing) is refused
  with a :class:`~talon_sd.errors.TalonError` naming the layer type.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .decoder import LeanDecoder
from .errors import TalonError

SUPPORTED_ATTENTION = ("grouped", "sdpa", "eager")  # grouped: talon_sd.attention
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class AttentionLayout:
    """The attention pattern of every decoder layer, as the tree mask must reproduce it."""

    layer_types: tuple[str, ...]  # "full_attention" or "sliding_attention" per layer
    sliding_window: int | None  # keys at positions > query position - window are visible (sliding layers)

    @property
    def has_sliding(self) -> bool:
        return "sliding_attention" in self.layer_types

    @property
    def has_full(self) -> bool:
        return "full_attention" in self.layer_types


def attention_layout(model, role: str = "model") -> AttentionLayout:
    """The layout of ``model`` or a one-line :class:`TalonError` (starting with ``role``) saying why
    its attention or cache does not fit tree verification, and what to do."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    config = model.config
    model_type = getattr(config, "model_type", type(model).__name__)
    implementation = getattr(config, "_attn_implementation", None) or "sdpa"
    if implementation not in SUPPORTED_ATTENTION:
        raise TalonError(
            f"{role}: attention implementation {implementation!r} of this {model_type} model cannot take the tree "
            f"attention mask; load it with attn_implementation='sdpa' (or 'grouped', 'eager')"
        )
    decoder_config = config.get_text_config(decoder=True)
    try:
        layer_types, layer_kwargs = get_layer_types_and_kwargs(decoder_config)
    except Exception as error:  # configs without per-layer information
        raise TalonError(f"{role}: cannot read the layer types of this {model_type} model ({error})") from None
    unsupported = sorted(set(layer_types) - set(SUPPORTED_LAYER_TYPES))
    if unsupported:
        raise TalonError(
            f"{role}: {model_type} has {unsupported[0]!r} layers, which tree verification does not support "
            f"(supported: full and sliding-window attention)"
        )
    if isinstance(layer_kwargs, dict):  # transformers < 5.19: one set of kwargs shared by every layer
        layer_kwargs = [layer_kwargs] * len(layer_types)
    windows = {kwargs.get("sliding_window") for kind, kwargs in zip(layer_types, layer_kwargs) if kind == "sliding_attention"}
    if len(windows) > 1 or None in windows:
        raise TalonError(f"{role}: {model_type} has sliding layers with different windows {sorted(map(str, windows))}")
    window = int(windows.pop()) if windows else None
    return AttentionLayout(tuple(layer_types), window)


def _view_of_buffer(which: int) -> property:
    """A :class:`ReservedLayer`'s ``keys`` (0) or ``values`` (1): assigning a tensor that is not a view of its buffer
    (or None) releases the buffers."""
    attribute = ("_keys", "_values")[which]

    def assign(layer: "ReservedLayer", tensor: torch.Tensor | None) -> None:
        setattr(layer, attribute, tensor)
        if layer.buffers is not None and (tensor is None or tensor.data_ptr() != layer.buffers[which].data_ptr()):
            layer.buffers = None  # a tensor from outside: the reserved room is dropped

    return property(lambda layer: getattr(layer, attribute), assign)


class ReservedLayer(DynamicLayer):
    """A full cache layer that writes new rows into reserved room instead of concatenating: ``keys`` and
    ``values`` are views ``[..., :length, :]`` of buffers holding up to 1.5x the rows (256 more at least), so a
    step copies its own rows, not the whole cache (``DynamicLayer`` does ``torch.cat`` every step). Measured on
    the packaged pair, AMD EPYC (AVX2), 2 threads, one-token forwards alternated with a concatenating cache (median
    ratio of 16-30 pairs): at 1,600 cached rows the int4 target took 0.94x the time, the int4 draft LM 0.92x, the
    float32 target 0.97x; at 800 rows 0.98x (int4); at 200 no difference. Memory: up to 1.5x the rows in use
    (a prefill of L rows reserves 1.5 L). Assigning ``keys`` or ``values`` another tensor (the batched engine's
    padding, row removal; ``reset``) releases the buffers; the next ``update`` copies the assigned rows into
    new ones. Rows past ``length`` may be overwritten: views of a longer, cropped cache do not stay valid."""

    buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # keys, values [..., capacity, d]
    keys, values = _view_of_buffer(0), _view_of_buffer(1)

    def _in_buffers(self) -> bool:
        """Whether ``keys`` and ``values`` are still the leading rows of the buffers (the same storage, else the
        buffers were released when they were assigned: only a cut of the rows or the batch can differ)."""
        return self.buffers is not None and all(view.shape[:-2] == buffer.shape[:-2] and view.stride() == buffer.stride()
                                                for view, buffer in zip((self.keys, self.values), self.buffers))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        needed = length + key_states.shape[-2]
        if not self._in_buffers() or self.buffers[0].shape[-2] < needed:
            capacity = needed + max(256, needed // 2)
            self.buffers = tuple(states.new_empty(states.shape[:-2] + (capacity, states.shape[-1]))
                                 for states in (key_states, value_states))
            if length:
                self.buffers[0][..., :length, :] = self.keys
                self.buffers[1][..., :length, :] = self.values
        self.buffers[0][..., length:needed, :] = key_states
        self.buffers[1][..., length:needed, :] = value_states
        self.keys, self.values = (buffer[..., :needed, :] for buffer in self.buffers)
        return self.keys, self.values


class KVCache:
    """A ``DynamicCache`` of full layers (:class:`ReservedLayer`) with the verbs the decoding loop needs, and the
    position of every row (``positions [length]``; a committed row's position is its index, a tree node's is
    the root's position plus its depth)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.cache = DynamicCache()  # full layers only: a sliding-window layer would drop rows
        self.cache.layer_class_to_replicate = ReservedLayer  # made as the model's layers first write
        self.positions = torch.zeros(0, dtype=torch.long)  # [length]

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first ``length`` rows."""
        if length < self.length:
            self.cache.crop(length - self.length)
        self.positions = self.positions[:length]

    @torch.inference_mode()
    def keep(self, start: int, offsets: torch.Tensor) -> None:
        """Keep rows ``[:start]`` followed by rows ``start + offsets`` [K] (ascending), dropping the rest.

        Compaction of an accepted tree path: one gather and one copy per key/value tensor.
        """
        offsets = offsets.to(torch.long)
        count = int(offsets.numel())
        if count and not bool((offsets == torch.arange(count, device=offsets.device)).all()):
            rows = offsets + start
            for layer in self.cache.layers:
                rows = rows.to(layer.keys.device)
                layer.keys[..., start : start + count, :] = layer.keys.index_select(-2, rows)
                layer.values[..., start : start + count, :] = layer.values.index_select(-2, rows)
            rows = rows.to(self.positions.device)
            self.positions = torch.cat([self.positions[:start], self.positions[rows]])
        self.crop(start + count)


class CausalLM:
    """A Hugging Face causal LM plus its KV cache; every model call of the library goes through here.

    Several ``CausalLM`` may wrap the same model: each has its own cache (one per generation).
    ``role`` names the model in errors (``target``/``draft``).
    """

    def __init__(self, model, role: str = "model") -> None:
        self.model = model
        self.role = role
        self.layout = attention_layout(model, role)
        self.cache = KVCache()
        self.cache_keyword = _cache_keyword(model)  # what the model's forward calls its KV cache
        embeddings = model.get_input_embeddings()
        self.vocab_size = int(embeddings.weight.shape[0])
        self.device = embeddings.weight.device
        self.dtype = embeddings.weight.dtype
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.hidden_size = int(model.config.get_text_config(decoder=True).hidden_size)
        self.num_layers = int(model.config.get_text_config(decoder=True).num_hidden_layers)
        self.lean = LeanDecoder.of(model)  # transformers' arithmetic without its overhead, where it applies


    @functools.cached_property
    def linear_weights(self) -> int:
        """:func:`linear_weights` of the model (what a forward over many rows computes), counted on first use."""
        return linear_weights(self.model)

    def reset(self) -> None:
        self.cache.reset()

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [T] int64
        positions: torch.Tensor | None = None,  # [T] absolute positions; default: continue the cache
        visible: torch.Tensor | None = None,  # [T, past + T] bool; default: causal
        last_only: bool = False,
        capture: tuple[int, ...] = (),
    ):
        """Append ``tokens`` to the cache and return float32 logits ``[T, V]`` (``[1, V]`` if last_only);
        with ``capture`` (layer indices), ``(logits, features [T, H * len(capture)])``: the residual stream
        entering each of those layers (HF ``hidden_states[i]``), from this same forward."""
        past = self.cache.length
        count = int(tokens.shape[0])
        if positions is None:
            positions = torch.arange(past, past + count, device=self.device)
        positions = positions.to(self.device)
        if self._lean_for(capture):
            logits, features = self._lean_forward(tokens, positions, visible, True, capture)
            logits = logits[-1:] if last_only else logits  # [T or 1, V]
            return (logits, features) if capture else logits
        kwargs = {}
        if visible is not None:
            kwargs["attention_mask"] = self._tree_mask(visible.to(self.device), positions)
        output = self.model(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions[None],
            **{self.cache_keyword: self.cache.cache},
            use_cache=True,
            output_hidden_states=bool(capture),
            **kwargs,
        )
        self._appended(positions)
        # (logits_to_keep=1 is avoided on purpose: with T > 1 it made bf16 CPU forwards ~6x slower)
        logits = output.logits[0, -1:] if last_only else output.logits[0]
        logits = logits.float()  # [T or 1, V]
        if capture:
            return logits, _features(output.hidden_states, capture)
        return logits

    def _lean_for(self, capture: tuple[int, ...]) -> bool:
        """Whether the lean decoder runs this call (it captures the inputs of layers, not the final norm's output)."""
        return self.lean is not None and all(0 <= layer < self.num_layers for layer in capture)

    def _lean_forward(self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor | None, logits: bool,
                      capture: tuple[int, ...]):
        """:meth:`LeanDecoder.forward` over ``tokens`` [T] at ``positions`` [T] (on the device), seeing ``visible``
        [T, past + T] (None: causal), then the positions recorded."""
        count, past = int(tokens.shape[0]), self.cache.length
        if visible is None and count > 1:
            visible = torch.ones(count, past + count, dtype=torch.bool).tril(past)  # causal
        mask = None if visible is None else additive_mask(visible, self.dtype, self.device)  # [T, past + T]
        output = self.lean.forward(tokens.to(self.device), positions, self.cache.cache, mask, logits, capture)
        self._appended(positions)
        return output

    def _appended(self, positions: torch.Tensor) -> None:
        """Record the positions of rows just written (waiting for the device, so that a forward can be timed)."""
        self.cache.positions = torch.cat([self.cache.positions, positions.to(self.cache.positions.device)])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _tree_mask(self, visible: torch.Tensor, positions: torch.Tensor):
        """The additive mask(s) for ``visible`` [T, past + T]: one tensor ``[1, 1, T, past + T]``, or one per
        layer type when full and sliding layers are mixed (sliding layers also hide keys out of the window)."""
        layout = self.layout
        masks = {}
        if layout.has_full:
            masks["full_attention"] = self._additive(visible)
        if layout.has_sliding:
            key_positions = torch.cat([self.cache.positions.to(self.device), positions])  # [past + T]
            in_window = positions[:, None] - key_positions[None, :] < layout.sliding_window  # [T, past + T]
            masks["sliding_attention"] = self._additive(visible & in_window)
        return masks if len(masks) > 1 else next(iter(masks.values()))

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        return additive_mask(visible, self.dtype, self.device)[None, None]  # [1, 1, T, past + T]

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, capture: tuple[int, ...] = ()) -> torch.Tensor | None:
        """Reset the cache and fill it with ``tokens`` [L]. No logits are needed, so only the decoder
        stack runs (the output head over a long prompt would cost L x vocab for nothing). With
        ``capture``, returns the features ``[L, H * len(capture)]`` (see :meth:`forward`)."""
        self.reset()
        if not tokens.numel():
            return torch.zeros(0, self.hidden_size * len(capture), device=self.device) if capture else None
        if self._lean_for(capture):
            positions = torch.arange(int(tokens.numel()), device=self.device)
            return self._lean_forward(tokens, positions, None, False, capture)[1]
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        if decoder is None:
            output = self.forward(tokens, last_only=True, capture=capture)
            return output[1] if capture else None
        output = self._prefill_decoder(decoder, tokens, capture)
        return _features(output.hidden_states, capture) if capture else None

    def _prefill_decoder(self, decoder, tokens: torch.Tensor, capture: tuple[int, ...] = ()):
        """The decoder stack alone over ``tokens`` [L] into the (reset) cache; its output (hidden states of every
        layer with ``capture``). Waits for the device, so that the forward can be timed."""
        output = decoder(input_ids=tokens.to(self.device)[None], **{_cache_keyword(decoder): self.cache.cache},
                         use_cache=True, output_hidden_states=bool(capture))
        self.cache.positions = torch.arange(int(tokens.numel()))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return output

    def forward_tree(self, tree, capture: tuple[int, ...] = ()):
        """Verify a :class:`DraftTree` whose root follows the cache: logits ``[N, V]``, one per node
        (and with ``capture``, the nodes' features ``[N, H * len(capture)]``)."""
        past = self.cache.length
        return self.forward(tree.tokens, past + tree.positions, tree.visibility(past), capture=capture)

    def commit_tree(self, tree_size: int, path: list[int]) -> None:
        """After verifying a tree of ``tree_size`` nodes (the last rows of the cache), keep only the
        rows of the accepted ``path`` (node indices, root first): one gather per tensor."""
        self.cache.keep(self.cache.length - tree_size, torch.tensor(path, dtype=torch.long))


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """The additive attention mask of ``visible`` [..., T, K] (bool) in ``dtype`` on ``device``: 0 where a query sees a
    key, the dtype's lowest value elsewhere (not -inf, and not a bool mask, which eager attention would add)."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=device)
    bias.masked_fill_(~visible.to(device), torch.finfo(dtype).min)
    return bias


def _cache_keyword(module) -> str:
    """The name a model's forward takes its KV cache by: ``cache`` since transformers 5.2x (which deprecates
    ``past_key_values``, to be removed in 5.40), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def _features(hidden_states: tuple[torch.Tensor, ...], layers: tuple[int, ...]) -> torch.Tensor:
    """[T, H * len(layers)]: ``hidden_states[i]`` ([1, T, H], the input of layer i) concatenated, low to high."""
    return torch.cat([hidden_states[layer][0] for layer in layers], dim=-1)


def _mkldnn():
    """``torch.utils.mkldnn`` (its import warns: it is built on the deprecated torch.jit.script_method), or None
    where torch has no oneDNN."""
    import warnings

    if not torch.backends.mkldnn.is_available():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from torch.utils import mkldnn
        except ImportError:
            return None
    return mkldnn


def linear_weights(model) -> int:
    """The weights of ``model``'s linears, however stored (in x out each; quantized, packed), the output projection
    (``get_output_embeddings`` or ``lm_head``) excepted: what the compute of a forward over many rows grows with."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else \
        getattr(model, "lm_head", None)
    total = 0
    for module in model.modules():
        if module is output:
            continue
        if hasattr(module, "in_features") and hasattr(module, "out_features"):
            total += module.in_features * module.out_features
        elif type(module).__name__ == "MkldnnLinear":
            total += module.weight.shape[0] * module.weight.shape[1]
    return total


def _packable(module) -> bool:
    return (type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu")


def pack_linears_for_cpu(model, keep_output: bool = False) -> int:
    """Replace every ``nn.Linear`` of a float32 CPU model by its oneDNN-packed form
    (``torch.utils.mkldnn.to_mkldnn``), the output embedding excepted with ``keep_output`` (for a caller that
    reads its rows); returns how many were packed.

    Same float32 arithmetic in another order: logits moved by <= 7e-5, greedy argmax unchanged (measured on
    the packed 1.5B target; tests/test_edges.py checks speculative output against the packed model's own
    plain greedy). bfloat16 already runs through oneDNN, so only float32 models are packed. Weights become
    buffers of the packed modules (inference only). Whether packing pays is a property of the CPU:
    :func:`choose_cpu_kernels`.

    The tensors left unpacked (embeddings, norms, biases of other layers) are then copied into memory of the
    model's own (:func:`_own_unpacked_tensors`): a model loaded from safetensors views its weights in one
    mapping of the file, and a single tensor still viewing it keeps the whole file resident beside the packed
    copies (the packaged 1.5B target: 5.9 GB; a target + draft process 16.1 -> 9.7 GB)."""
    mkldnn = _mkldnn()
    if mkldnn is None:  # a torch without oneDNN: keep torch's own kernels
        return 0
    output = model.get_output_embeddings() if keep_output and hasattr(model, "get_output_embeddings") else None
    packed = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if _packable(child) and child is not output:
                setattr(module, name, mkldnn.to_mkldnn(child))
                packed += 1
    if packed:
        _own_unpacked_tensors(model)
    return packed


def _own_unpacked_tensors(model) -> None:
    """Replace every strided CPU parameter and buffer of ``model`` by a copy, tied ones by one shared copy
    (values, dtypes and ``requires_grad`` unchanged), so that nothing of it views a file mapping any more."""
    copies: dict[int, torch.Tensor] = {}
    for module in model.modules():
        owned = [*module.named_parameters(recurse=False, remove_duplicate=False),
                 *module.named_buffers(recurse=False, remove_duplicate=False)]
        for name, tensor in owned:
            if tensor.layout != torch.strided or tensor.device.type != "cpu":
                continue
            if id(tensor) not in copies:
                copy = tensor.detach().clone()
                if isinstance(tensor, torch.nn.Parameter):
                    copy = torch.nn.Parameter(copy, requires_grad=tensor.requires_grad)
                copies[id(tensor)] = copy
            setattr(module, name, copies[id(tensor)])


KERNEL_ROWS = (1, 4)  # rows timed by :func:`linear_seconds`: plain decoding, and a small tree's verify
ONE_ROW_TOLERANCE = 1.25  # packed may look this much slower on one row ...
FEW_ROWS_WIN = 0.6  # ... when it serves 4 rows in at most this share of the default's time
KERNEL_MEASUREMENTS = 3  # ``default`` only when this many measurements in a row say so


def linear_seconds(model, rows: tuple[int, ...] = KERNEL_ROWS, repeats: int = 15) -> dict[int, tuple[float, float]] | None:
    """Seconds of ``[r, in]`` through the model's largest float32 CPU linear (the output embedding excepted: a
    vocabulary-sized copy would cost a GB) for each ``r`` in ``rows``, with torch's own kernel and
    oneDNN-packed, interleaved so that drift hits both alike: ``{r: (default, packed)}``, each the fastest of
    ``repeats`` runs (the least disturbed by other work on the machine); None when nothing is packable."""
    mkldnn = _mkldnn()
    linear = _largest_linear(model)
    if mkldnn is None or linear is None:
        return None
    paths = {"default": linear, "packed": mkldnn.to_mkldnn(linear)}  # a packed copy; the model keeps its own weight
    source = torch.Generator().manual_seed(0)  # the global RNG is left untouched
    result = {}
    for count in rows:
        fastest = _fastest_seconds(paths, torch.randn(count, linear.in_features, generator=source), repeats)  # [r, in]
        result[count] = (fastest["default"], fastest["packed"])
    return result


def _largest_linear(model):
    """The model's largest float32 CPU ``nn.Linear``, the output embedding excepted (a vocabulary-sized copy would
    cost a GB); None when it has none."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if _packable(m) and m is not output]
    return max(linears, key=lambda m: m.weight.numel()) if linears else None


def _fastest_seconds(paths: dict, inputs: torch.Tensor, repeats: int) -> dict[str, float]:
    """``{name: seconds}``: the fastest of ``repeats`` runs of each path over ``inputs``, the paths interleaved so that
    drift hits all alike (the least disturbed run by other work on the machine), after 3 warm-up rounds."""
    import time

    samples: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        for index in range(repeats + 3):
            for name, path in paths.items():
                started = time.perf_counter()
                path(inputs)
                if index >= 3:
                    samples[name].append(time.perf_counter() - started)
    return {name: min(values) for name, values in samples.items()}


def choose_cpu_kernels(model, measure=None) -> str:
    """``"packed"`` when oneDNN-packed float32 linears serve one row at least as fast as torch's own kernel on
    this CPU, or nearly as fast (within ``ONE_ROW_TOLERANCE``) while serving 4 rows in at most ``FEW_ROWS_WIN``
    of its time; else ``"default"`` (also for models with nothing to pack: bfloat16, CUDA).

    Why measured and why one row first: the better path depends on the CPU. On the project's AMD EPYC hosts
    torch's default float32 linear is slow for a few rows and packing halves a target step (371 -> 177 ms;
    a 2-token verify 691 -> 233 ms); on an Intel Xeon with AMX torch's own kernel is the faster one for one
    row (232 vs 280 ms a step) and packing wins only from 4 rows on (docs/BENCHMARKS.md, "Dtypes and kernels"). One
    row is plain decoding, the floor the online controller falls back to: a kernel that slows it would
    make speculation's "never slower than plain decoding" a comparison against a slowed plain decoding. The
    draft LM gets the same rule on purpose: where packing loses one row (the Xeon: 114 vs 88 ms) it wins only
    from 4 rows on (154 vs 178 ms), and the trees chosen on such a CPU are mostly 1-2 rows wide per forward.

    Why 4 rows too, and the fastest run rather than the median: one row takes 2-6 ms here, and on the
    AVX2-only EPYC a load-time median with other work on the machine picked ``default`` for the 1.5B target
    in 2 of 2 loads (10.5 vs 18.7 ms, 6.2 vs 8.1 ms), a step 1.4x slower for the whole process, although
    packed is the faster path there in every quiet measurement (4.2-5.4 vs 5.3-7.1 ms). Under the same load
    4 rows kept their order in 6 of 6 measurements (packed 7-10 vs 17-20 ms; draft 3.0-3.8 vs 5.8-6.4 ms).
    The Xeon's outcomes are unchanged by the tolerance: its one-row losses are 1.21-1.30x with 4 rows at
    0.87x, far from ``FEW_ROWS_WIN``.
    Why up to ``KERNEL_MEASUREMENTS`` measurements: even so, one load in six of the 1.5B target on the quiet
    AVX2 EPYC picked ``default`` (a 523 ms plain step against 374-426 ms packed in the other five processes),
    while 12 measurements right after loading, in six fresh processes, all read packed at 0.71-0.80x one row.
    Whatever disturbed it lasted the whole ~1 s measurement, so ``default`` is taken only when every one of
    up to three measurements says so (about 2 s more at load where it is the right answer, as on the Xeon,
    whose ratios never come near a packed verdict).

    ``measure`` (default :func:`linear_seconds`) returns ``{rows: (default_seconds, packed_seconds)}`` with
    rows 1 (and 4, optional) or None."""
    measure = measure or linear_seconds
    for _ in range(KERNEL_MEASUREMENTS):
        seconds = measure(model)
        if seconds is None:
            return "default"
        if _packed_wins(seconds):
            return "packed"
    return "default"


def _packed_wins(seconds: dict[int, tuple[float, float]]) -> bool:
    """The rule of :func:`choose_cpu_kernels` for one measurement."""
    default_one, packed_one = seconds[1]
    if packed_one <= default_one:
        return True
    if 4 in seconds and packed_one <= ONE_ROW_TOLERANCE * default_one:
        default_four, packed_four = seconds[4]
        return packed_four <= FEW_ROWS_WIN * default_four
    return False


def apply_cpu_kernels(model, cpu_kernels: str) -> None:
    """Apply ``cpu_kernels`` (one of :data:`talon_sd.config.CPU_KERNELS`) to a loaded model; ``auto`` asks
    :func:`choose_cpu_kernels`. What the model then runs with is read off it: :func:`kernels_of`."""
    if cpu_kernels == "auto":
        cpu_kernels = choose_cpu_kernels(model)
    if cpu_kernels == "packed":
        pack_linears_for_cpu(model)


def kernels_of(model) -> str | None:
    """``"int4"`` / ``"int8-weights"`` for weight-only quantized linears (:mod:`talon_sd.quantize`), ``"int8"`` when
    the model has dynamically quantized linears (:func:`quantize_linears_int8`), ``"packed"`` when it has
    oneDNN-packed ones, ``"default"`` otherwise, None for no model."""
    if model is None:
        return None
    from .quantize import Int4Linear, Int8Linear

    if any(isinstance(m, Int4Linear) for m in model.modules()):
        return "int4"
    if any(isinstance(m, Int8Linear) for m in model.modules()):
        return "int8-weights"
    if any(is_int8_linear(m) for m in model.modules()):
        return "int8"
    return "packed" if any(type(m).__name__ == "MkldnnLinear" for m in model.modules()) else "default"


def is_int8_linear(module) -> bool:
    """Whether ``module`` is one of torch's dynamically quantized linears (:func:`quantize_linears_int8`)."""
    return ".quantized.dynamic." in type(module).__module__ and hasattr(module, "weight")


def _quantize_dynamic(module, spec, inplace: bool = False):
    """torch's dynamic int8 quantization of the linears ``spec`` names (names or types -> the per-channel qconfig),
    its deprecation warning silenced (see :func:`quantize_linears_int8`)."""
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {key: per_channel_dynamic_qconfig for key in spec}, dtype=torch.qint8,
                                inplace=inplace)


def int8_available() -> bool:
    """Whether this torch runs dynamically quantized int8 linears on CPU through an x86 engine (x86, fbgemm or onednn
    active: not qnnpack, the ARM engine, which was never measured here)."""
    return hasattr(torch, "ao") and torch.backends.quantized.engine in ("x86", "fbgemm", "onednn")


def draft_int8_possible(quantize: str, device: torch.device) -> bool:
    """Whether ``--quantize`` / ``quantize=`` ``quantize`` lets the draft LM's linears go int8 at load on ``device``:
    ``auto`` on CPU with an x86 quantized engine, whatever the target's dtype (the draft then loads in float32 and
    :func:`apply_draft_quantization` keeps int8 where it measures faster). One prediction for the generator's load
    and for matching a tuned profile's curves before loading."""
    return quantize == "auto" and torch.device(device).type == "cpu" and int8_available()


def quantize_linears_int8(model) -> int:
    """Replace every float32 CPU ``nn.Linear`` of a DRAFT model, its output head included, by torch's dynamically
    quantized int8 linear (weights int8 per output channel, activations quantized per call); returns how many.

    For the draft only, never the target: what the draft proposes never changes the output (verification is exact
    against the target, which stays as loaded), only how often it is accepted; the target's arithmetic is the output.
    Why: on the project's CPUs a float32 linear of a few rows streams 4 bytes a weight and, on the AVX2-only EPYC,
    pays 2-4x for a second row; int8 streams one byte and grows little with rows. The packaged 0.5B draft on that
    CPU, one forward on a 200-token cache (docs/BENCHMARKS.md, "Dtypes and kernels"): 1 / 4 / 16 tokens
    121 / 187 / 264 ms oneDNN-packed float32, 44 / 50 / 81 ms int8. The price is agreement: its argmax matched the
    target's on 61% of the positions of a mixed text against 66% for the float32 draft.

    ``torch.ao.quantization.quantize_dynamic`` is deprecated in favour of torchao, which has no CPU kernel for this
    path without extra builds; its deprecation warning is silenced here. The unquantized tensors (embeddings, norms)
    are copied out of any file mapping, as in :func:`pack_linears_for_cpu`."""
    names = {name for name, module in model.named_modules() if _packable(module)}
    if not names or not int8_available():
        return 0
    _quantize_dynamic(model, names, inplace=True)
    _own_unpacked_tensors(model)
    return len(names)


def int8_linear_seconds(model, repeats: int = 15,
                        fallback: torch.dtype = torch.float32) -> tuple[float, float] | None:
    """Seconds of one row through the model's largest float32 CPU linear (the output embedding excepted) as the
    draft would run it unquantized, in ``fallback`` (float32: torch's own or oneDNN-packed, whichever is faster;
    another dtype: a copy in it), and dynamically quantized to int8, each the fastest of ``repeats`` interleaved
    runs: ``(unquantized, int8)``; None when nothing can be quantized."""
    linear = _largest_linear(model)
    if linear is None or not int8_available():
        return None
    # copies: the model keeps its own weight
    paths = {"int8": _quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear})}
    if fallback == torch.float32:
        paths["default"] = linear
        mkldnn = _mkldnn()
        if mkldnn is not None:
            paths["packed"] = mkldnn.to_mkldnn(linear)
    else:
        paths["cast"] = _cast_path(linear, fallback)
    inputs = torch.randn(1, linear.in_features, generator=torch.Generator().manual_seed(0))  # [1, in]
    fastest = _fastest_seconds(paths, inputs, repeats)
    return min(value for name, value in fastest.items() if name != "int8"), fastest["int8"]


def _cast_path(linear, dtype: torch.dtype):
    """``linear`` as a copy in ``dtype``, called with and returning float32 rows."""
    import copy

    copied = copy.deepcopy(linear).to(dtype)
    return lambda rows: copied(rows.to(dtype)).float()


def choose_draft_quantization(model, measure=None, fallback: torch.dtype = torch.float32) -> str:
    """``"int8"`` when one row through the draft's largest linear, dynamically quantized, is at least as fast as
    the draft would run it otherwise, in ``fallback`` (float32, or the bfloat16 a bfloat16 run would load it in);
    ``"none"`` otherwise (also for a model not in float32, CUDA, or a torch without a quantized CPU engine).
    One row through a [1536 x 8960] linear, int8 against the run's float path (docs/BENCHMARKS.md, "Dtypes and
    kernels"): 0.49 against 4.2 ms (packed float32) on the AVX2-only EPYC, 0.13 against 1.04 ms (bfloat16) on the
    EPYC with AVX512-BF16, 0.37 against 0.91 ms (bfloat16) on the Xeon with AMX; through the 0.5B draft's largest
    linear on the EPYC with AVX512-BF16, 0.14-0.21 against 0.38-0.49 ms in bfloat16: a verdict far from the line,
    so one measurement decides. ``measure`` (default :func:`int8_linear_seconds`) is called as ``measure(model,
    fallback=...)`` and returns ``(unquantized_seconds, int8_seconds)`` or None."""
    seconds = (measure or int8_linear_seconds)(model, fallback=fallback)
    if seconds is None:
        return "none"
    float_seconds, int8_seconds = seconds
    return "int8" if int8_seconds <= float_seconds else "none"


def apply_draft_quantization(model, draft_quantization: str, cpu_kernels: str,
                             dtype: torch.dtype | None = None) -> None:
    """Set up a draft LM's linears: int8 (:func:`quantize_linears_int8`) when ``draft_quantization`` is ``int8``, or
    ``auto`` and :func:`choose_draft_quantization` says so; otherwise (or where nothing was quantized) the model is
    cast to ``dtype`` (default: as loaded) and :func:`apply_cpu_kernels` applies ``cpu_kernels``. A bfloat16 run
    loads its draft in float32 and passes ``dtype=torch.bfloat16``: int8 where faster, else bfloat16 as asked."""
    if draft_quantization == "auto":
        draft_quantization = choose_draft_quantization(model, fallback=dtype or torch.float32)
    if draft_quantization == "int8" and quantize_linears_int8(model):
        return
    if dtype is not None and next(model.parameters()).dtype != dtype:
        model.to(dtype)
    apply_cpu_kernels(model, cpu_kernels)
