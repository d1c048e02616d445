"""The features stage: one teacher-forced target forward per sample, stored in safetensors shards.

For a sample x_0 .. x_{T-1} the target runs once over the whole sequence and we keep, per position t:

* ``aux``      [T, 3H] bf16: the residual stream entering the three aux layers (HF ``hidden_states[i]``),
               low -> mid -> high: the EAGLE-3 feature f_t (what :class:`~talon_sd.drafters.Eagle3Drafter`
               gets from the verify forwards);
* ``teacher``  the target's next-token distribution after x_t, as whichever is smaller on disk:
               ``hidden`` [T, H] bf16, the final hidden state after the final norm, from which the trainer
               computes ``lm_head(h)[:, draft_ids]`` with ``teacher_head.safetensors`` (the lm_head rows
               of the draft ids, float32) -- chosen when H <= Vd (Qwen2.5-1.5B: 1536 vs 8192, 5.3x
               smaller) -- or ``logits`` [T, Vd] bf16 restricted to the draft vocabulary (Vd < H, or a
               model whose logits are not ``lm_head(h)``, e.g. with final logit soft-capping);
* ``argmax``   [T] int32: the target's greedy next token over the FULL vocabulary (for the loss mask
               "argmax outside the draft vocabulary" and for honest agreement numbers);
* ``ids`` [T] int32 and ``loss_mask`` [T] uint8 of the sample.

Folder layout (``<work>/features``)::

    settings.json              the run's settings (refuses another run)
    meta.json                  teacher kind, aux layers, draft ids + coverage (written before any shard)
    teacher_head.safetensors   "weight" [Vd, H] float32 (+ "bias" [Vd]); teacher kind ``hidden`` only
    shard-00000.safetensors    samples [0, S), tensors concatenated over tokens + "offsets" [S + 1]
    index.json                 per-sample lengths and shard files: written last, the stage is finished

Shards are written to a temporary name and renamed; a rerun skips the shards on disk. Cost on disk per
token: 6H + 2 * min(H, Vd) + 9 bytes (Qwen2.5-1.5B: 12.3 kB, so 1M tokens = 12 GB).
"""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from ..eagle3 import default_aux_layers
from ..errors import TalonError, bad_argument
from .data import Sample
from .store import atomic_target, atomic_write_text, check_settings, read_json
from .vocab import select_draft_vocab


@dataclass(frozen=True)
class FeatureConfig:
    """What the features stage stores; CLI flags map onto the fields."""

    draft_vocab: int = 8192  # --draft-vocab: Vd, clamped to the target's vocabulary
    aux_layers: tuple[int, ...] | None = None  # --aux-layers; None = EAGLE-3's (2, L // 2, L - 3)
    shard_size: int = 128  # samples per shard

    def __post_init__(self) -> None:
        if isinstance(self.draft_vocab, bool) or not isinstance(self.draft_vocab, int) or self.draft_vocab < 2:
            raise bad_argument("draft-vocab", self.draft_vocab, "an integer >= 2 (draft vocabulary size)")
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise bad_argument("shard-size", self.shard_size, "an integer >= 1")
        if self.aux_layers is not None and (len(self.aux_layers) != 3 or any(int(i) < 0 for i in self.aux_layers)):
            raise bad_argument("aux-layers", self.aux_layers, "three layer indices >= 0, low to high")

    def layers_for(self, model) -> tuple[int, int, int]:
        """The aux layers for ``model``, checked against its depth."""
        count = int(model.config.get_text_config(decoder=True).num_hidden_layers)
        layers = tuple(int(i) for i in (self.aux_layers or default_aux_layers(count)))
        if any(not 0 <= i < count for i in layers):
            raise TalonError(f"aux-layers: {list(layers)} do not fit a target of {count} layers (each in [0, {count}); "
                             "EAGLE-3's default 2, L//2, L-3 needs at least 4 layers)")
        return layers


@dataclass(frozen=True)
class TeacherOutputs:
    aux: torch.Tensor  # [T, 3H]
    final: torch.Tensor  # [T, H], after the final norm
    logits: torch.Tensor  # [T, V]


@torch.inference_mode()
def teacher_forward(model, ids: torch.Tensor, aux_layers: tuple[int, ...]) -> TeacherOutputs:
    """One causal forward of the target over ``ids`` [T] (no cache): aux features, final hidden, logits."""
    device = model.get_input_embeddings().weight.device
    output = model(input_ids=ids.to(device)[None], output_hidden_states=True, use_cache=False)
    aux = torch.cat([output.hidden_states[layer][0] for layer in aux_layers], dim=-1)  # [T, 3H]
    return TeacherOutputs(aux=aux, final=output.hidden_states[-1][0], logits=output.logits[0])


@dataclass(frozen=True)
class SampleFeatures:
    """One sample as the trainer reads it."""

    ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool
    aux: torch.Tensor  # [T, 3H] bf16
    teacher: torch.Tensor  # [T, Vd] float32 logits over the draft vocabulary
    argmax: torch.Tensor  # [T] int64, the target's full-vocabulary argmax after each position


@dataclass(frozen=True)
class FeatureSummary:
    samples: int
    tokens: int
    teacher: str
    draft_vocab: int
    coverage: float
    bytes: int
    seconds: float


def write_features(model, samples: Sequence[Sample], config: FeatureConfig, folder: pathlib.Path, upstream: dict,
                   progress: bool = True) -> FeatureSummary:
    """Run (or finish) the features stage in ``folder`` for ``samples``. ``upstream`` identifies the samples
    (the data stage's settings); with the config under "features" it is what the folder is bound to."""
    from tqdm.auto import tqdm

    folder = pathlib.Path(folder)
    check_settings(folder, upstream | {"features": asdict(config)}, "features")
    done = read_json(folder / "summary.json")
    if done is not None and (folder / "index.json").is_file():
        return FeatureSummary(**done)
    layers = config.layers_for(model)
    meta = read_json(folder / "meta.json") or _write_meta(model, samples, config, layers, folder)
    draft_ids = torch.tensor(meta["draft_ids"], dtype=torch.long)
    shards = [list(samples[i: i + config.shard_size]) for i in range(0, len(samples), config.shard_size)]
    bar = tqdm(total=len(samples), desc="features", unit="sample", disable=not progress)
    for number, shard in enumerate(shards):
        path = folder / shard_name(number)
        if path.is_file():
            bar.update(len(shard))
            continue
        started = time.perf_counter()
        tensors: dict[str, list[torch.Tensor]] = {"ids": [], "loss_mask": [], "aux": [], "teacher": [], "argmax": []}
        for sample in shard:
            ids = torch.tensor(sample.ids, dtype=torch.long)
            out = teacher_forward(model, ids, layers)
            teacher = out.final if meta["teacher"] == "hidden" else out.logits[:, draft_ids.to(out.logits.device)]
            tensors["ids"].append(ids.to(torch.int32))
            tensors["loss_mask"].append(torch.tensor(sample.loss_mask, dtype=torch.uint8))
            tensors["aux"].append(out.aux.to("cpu", torch.bfloat16))
            tensors["teacher"].append(teacher.to("cpu", torch.bfloat16))
            tensors["argmax"].append(out.logits.argmax(-1).to("cpu", torch.int32))
            bar.update(1)
        _save_shard(path, tensors, [sample.index for sample in shard], time.perf_counter() - started)
    bar.close()
    index = {"shards": [shard_name(n) for n in range(len(shards))], "lengths": [len(s.ids) for s in samples],
             "shard_size": config.shard_size}
    atomic_write_text(folder / "index.json", json.dumps(index))
    summary = FeatureSummary(
        samples=len(samples), tokens=sum(index["lengths"]), teacher=meta["teacher"], draft_vocab=len(meta["draft_ids"]),
        coverage=meta["coverage"], bytes=sum(p.stat().st_size for p in folder.glob("*.safetensors")),
        seconds=round(sum(_shard_seconds(folder / name) for name in index["shards"]), 1),
    )
    atomic_write_text(folder / "summary.json", json.dumps(summary.__dict__, indent=2))
    return summary


def _shard_seconds(path: pathlib.Path) -> float:
    """The time the target spent on one shard (its metadata), summed later over runs."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as shard:
        return float((shard.metadata() or {}).get("seconds", 0.0))


def shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def _write_meta(model, samples: Sequence[Sample], config: FeatureConfig, layers, folder: pathlib.Path) -> dict:
    """Choose the draft vocabulary and the teacher kind; write meta.json (and the teacher head)."""
    from safetensors.torch import save_file

    vocab_size = int(model.get_input_embeddings().weight.shape[0])
    vocabulary = select_draft_vocab(samples, config.draft_vocab, vocab_size)
    hidden = int(model.config.get_text_config(decoder=True).hidden_size)
    output = model.get_output_embeddings()
    plain_head = not getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    kind = "hidden" if hidden <= vocabulary.ids.numel() and plain_head and output is not None else "logits"
    if kind == "hidden":
        rows = vocabulary.ids.to(output.weight.device)
        head = {"weight": output.weight.detach()[rows].float().cpu().contiguous()}  # [Vd, H]
        if getattr(output, "bias", None) is not None:
            head["bias"] = output.bias.detach()[rows].float().cpu().contiguous()
        with atomic_target(folder / "teacher_head.safetensors") as temporary:
            save_file(head, str(temporary))
    meta = {"teacher": kind, "aux_layers": list(layers), "hidden_size": hidden, "vocab_size": vocab_size,
            "coverage": round(vocabulary.coverage, 6), "draft_ids": vocabulary.ids.tolist()}
    atomic_write_text(folder / "meta.json", json.dumps(meta))
    return meta


def _save_shard(path: pathlib.Path, tensors: dict[str, list[torch.Tensor]], indices: list[int], seconds: float) -> None:
    from safetensors.torch import save_file

    lengths = torch.tensor([0] + [t.numel() for t in tensors["ids"]])
    joined = {name: torch.cat(parts).contiguous() for name, parts in tensors.items()}
    joined["offsets"] = lengths.cumsum(0)  # [S + 1]
    joined["sample_index"] = torch.tensor(indices, dtype=torch.long)  # [S], prompt index of each sample
    with atomic_target(path) as temporary:
        save_file(joined, str(temporary), metadata={"seconds": f"{seconds:.2f}"})


class FeatureStore:
    """Read access to a finished features stage: ``load(i)`` for sample i (0 .. num_samples - 1)."""

    def __init__(self, folder: pathlib.Path) -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file

        self.folder = pathlib.Path(folder)
        index = read_json(self.folder / "index.json")
        meta = read_json(self.folder / "meta.json")
        if index is None or meta is None:
            raise TalonError(f"features: the features stage in {self.folder} is not finished; run --stage features first")
        self.lengths: list[int] = index["lengths"]
        self.shard_size: int = index["shard_size"]
        self.teacher_kind: str = meta["teacher"]
        self.aux_layers = tuple(meta["aux_layers"])
        self.draft_ids = torch.tensor(meta["draft_ids"], dtype=torch.long)  # [Vd]
        self.coverage: float = meta["coverage"]
        self._shards = [safe_open(str(self.folder / name), framework="pt") for name in index["shards"]]
        self._offsets = [shard.get_tensor("offsets").tolist() for shard in self._shards]
        self._head = load_file(str(self.folder / "teacher_head.safetensors")) if self.teacher_kind == "hidden" else None

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    def load(self, position: int) -> SampleFeatures:
        shard = self._shards[position // self.shard_size]
        local = position % self.shard_size
        start, end = self._offsets[position // self.shard_size][local: local + 2]

        def read(name: str) -> torch.Tensor:
            return shard.get_slice(name)[start:end]

        teacher = read("teacher").float()
        if self._head is not None:  # final hidden [T, H] -> draft-vocabulary logits [T, Vd]
            teacher = teacher @ self._head["weight"].T + (self._head["bias"] if "bias" in self._head else 0.0)
        return SampleFeatures(ids=read("ids").long(), loss_mask=read("loss_mask").bool(), aux=read("aux"),
                              teacher=teacher, argmax=read("argmax").long())
