"""The train stage: the EAGLE-3 head trained with the training-time test (:mod:`.ttt`) on stored features.

Recipe (../shared/reference/eagle3_training.md): AdamW (0.9, 0.95), no weight decay, linear warmup over
``warmup_fraction`` of the steps then cosine decay to ``min_lr_ratio * lr``, gradients clipped to 0.5,
bf16 autocast where the CPU computes bf16 natively (float32 master weights), batches of whole samples
up to ``batch_tokens`` tokens. A seeded ``val_fraction`` of the samples is held out; the head is
validated before training and after every epoch (per-step top-1 agreement with the target, soft
cross-entropy, implied chain length).

Folder layout::

    <work>/train/settings.json     the run's settings (another run is refused)
    <work>/train/checkpoint.pt     head weights, optimizer, scheduler, RNG, step, epoch, batch, log
    <work>/train_log.jsonl         {"kind": "train", step, loss, lr, ...} and {"kind": "val", epoch, ...}

Resumability: the data order is a function of (seed, epoch) only, so (epoch, batch) is the whole
data-order state. A checkpoint is written every ``checkpoint_every`` steps, at the end of every epoch
and when the run is interrupted (Ctrl-C is deferred to the end of the running step); a rerun continues
from it and, with the same settings and threads, ends with the same weights as an uninterrupted run.
"""

from __future__ import annotations

import math
import os
import pathlib
import signal
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch

from ..eagle3 import Eagle3Head, save_eagle3_head
from ..errors import bad_argument
from .features import FeatureStore
from .store import JsonlLog, atomic_target, atomic_write_text, check_settings
from .ttt import Agreement, make_batch, ttt_forward, ttt_loss

CHECKPOINT = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
MIN_SAMPLE_TOKENS = 3  # a sample needs x_{t+1} and x_{t+2} after some f_t


@dataclass(frozen=True)
class TrainConfig:
    """How the head is trained; CLI flags map onto the fields."""

    ttt_steps: int = 3  # --ttt-steps: k unrolled draft steps
    epochs: int = 3  # --epochs
    lr: float = 3e-4  # --lr: peak learning rate
    batch_tokens: int = 2048  # --batch-tokens: tokens per optimizer step (whole samples)
    val_fraction: float = 0.05  # --val-fraction
    seed: int = 0  # --seed
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1
    grad_clip: float = 0.5
    step_weight: float = 0.8  # loss weight of step j is step_weight ** j
    precision: str = "auto"  # --precision: auto (bf16 autocast where the CPU is fast at it), float32, bfloat16
    head_init: str = "random"  # --head-init: random, or target (lm_head rows and final norm copied from the target;
    # measured no better on the packaged target's 81K-token run, docs/BENCHMARKS.md, "The EAGLE-3 head")
    checkpoint_every: int = 50  # --checkpoint-every: steps between checkpoints (not a training setting)

    def __post_init__(self) -> None:
        for name, low in (("ttt_steps", 1), ("epochs", 1), ("batch_tokens", 8), ("checkpoint_every", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad_argument(name.replace("_", "-"), value, f"an integer >= {low}")
        if not 0 < self.lr < 1:
            raise bad_argument("lr", self.lr, "a learning rate in (0, 1)")
        if not 0 <= self.val_fraction < 1:
            raise bad_argument("val-fraction", self.val_fraction, "a fraction in [0, 1)")
        if not 0 <= self.warmup_fraction < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise bad_argument("warmup_fraction", (self.warmup_fraction, self.min_lr_ratio), "fractions in [0, 1)")
        if not self.grad_clip > 0 or not 0 < self.step_weight <= 1:
            raise bad_argument("grad_clip", (self.grad_clip, self.step_weight), "grad_clip > 0 and step_weight in (0, 1]")
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise bad_argument("precision", self.precision, "auto, float32 or bfloat16")
        if self.head_init not in ("target", "random"):
            raise bad_argument("head-init", self.head_init, "target or random")

    def settings(self) -> dict:
        """Everything that changes the trained weights (checkpoint_every does not)."""
        settings = asdict(self)
        del settings["checkpoint_every"]
        return settings

    def resolved(self, device: torch.device) -> "TrainConfig":
        """This config with precision "auto" made concrete for ``device``: what a run stores, so a resume on a
        CPU of another kind keeps the precision (or is refused) instead of switching it halfway."""
        return replace(self, precision="bfloat16" if self.autocast_bfloat16(torch.device(device)) else "float32")

    def autocast_bfloat16(self, device: torch.device) -> bool:
        if self.precision != "auto":
            return self.precision == "bfloat16"
        from ..models import cpu_has_fast_bfloat16

        return device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bfloat16())


@dataclass(frozen=True)
class TrainResult:
    steps: int
    epochs: int
    train_samples: int
    val_samples: int
    train_tokens: int  # per epoch
    seconds: float  # training wall time, summed over resumed runs
    parameters: int  # trainable
    curve: list  # validation records, before training then after every epoch


def split_samples(store: FeatureStore, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Seeded (train, validation) positions; samples too short for any row are left out of both."""
    usable = [i for i, length in enumerate(store.lengths) if length >= MIN_SAMPLE_TOKENS]
    order = torch.randperm(len(usable), generator=torch.Generator().manual_seed(seed)).tolist()
    shuffled = [usable[i] for i in order]
    count = min(len(shuffled) - 1, max(1, round(fraction * len(shuffled)))) if fraction > 0 and len(shuffled) > 1 else 0
    return sorted(shuffled[count:]), sorted(shuffled[:count])


def epoch_batches(train: list[int], lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch: a seeded shuffle, packed greedily up to ``batch_tokens`` tokens."""
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch + 1)
    return pack([train[i] for i in torch.randperm(len(train), generator=generator).tolist()], lengths, batch_tokens)


def pack(order: list[int], lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Consecutive samples of ``order`` grouped up to ``batch_tokens`` tokens (a longer sample goes alone)."""
    batches, current, tokens = [], [], 0
    for position in order:
        if current and tokens + lengths[position] > batch_tokens:
            batches.append(current)
            current, tokens = [], 0
        current.append(position)
        tokens += lengths[position]
    if current:
        batches.append(current)
    return batches


def learning_rate_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class _DeferredInterrupt:
    """While active (main thread only), the first Ctrl-C sets ``requested`` instead of raising; a second
    one raises at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("\ninterrupt: stopping after this step (Ctrl-C again to stop now, losing the step)", flush=True)

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Trainer:
    """Trains ``head`` (float32 trainable weights) on ``store`` in ``work``; see the module docstring.

    ``upstream`` identifies the features (the features stage's settings); with ``config.settings()`` under
    "train" it is what ``<work>/train`` is bound to."""

    def __init__(self, head: Eagle3Head, store: FeatureStore, config: TrainConfig, work: pathlib.Path, upstream: dict,
                 progress: bool = True) -> None:
        self.head, self.store, self.config, self.progress = head, store, config, progress
        self.folder = pathlib.Path(work) / "train"
        self.device = head.fc.weight.device
        config = self.config = config.resolved(self.device)  # "auto" is stored resolved (TrainConfig.resolved)
        check_step_memory(config, int(head.config.draft_vocab_size), self.device)  # before anything is written
        self.bfloat16 = config.autocast_bfloat16(self.device)
        check_settings(self.folder, upstream | {"train": config.settings()}, "train")
        self.log = JsonlLog(pathlib.Path(work) / LOG_FILE)
        self.train, self.val = split_samples(store, config.val_fraction, config.seed)
        self.plan = [epoch_batches(self.train, store.lengths, config.batch_tokens, config.seed, epoch)
                     for epoch in range(config.epochs)]
        self.total_steps = sum(len(batches) for batches in self.plan)
        self.parameters = head.trainable_parameters()
        self.optimizer = torch.optim.AdamW(self.parameters, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
        warmup = max(1, round(config.warmup_fraction * self.total_steps))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: learning_rate_factor(step, self.total_steps, warmup, config.min_lr_ratio))
        self.in_draft_vocab = head.t2d.cpu()  # [V] bool
        self.target_ids = head.target_ids().cpu()  # [Vd]
        self.step, self.epoch, self.batch, self.seconds = 0, 0, 0, 0.0
        self.window = [0.0, 0, 0]  # training loss sum, steps and tokens since the last "train" log record
        self.curve: list[dict] = []
        self._load_checkpoint()

    # ------------------------------------------------------------------------------------------ the loop

    def run(self, on_step: Callable[[int], None] | None = None) -> TrainResult:
        """Train to the end of the plan (continuing a checkpoint); ``on_step(step)`` after every step."""
        from tqdm.auto import tqdm

        if not self.curve:
            self._validate(epoch=0)
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step", disable=not self.progress)
        self._started = time.perf_counter() - self.seconds
        self._window_started = time.perf_counter()
        consistent = True  # False while a step is half done: such a state is never saved
        try:
            with _DeferredInterrupt() as interrupt:
                for positions in self._remaining_batches():
                    consistent = False
                    loss, tokens = self._train_step(positions)
                    consistent = True
                    self._advance(loss, tokens, bar)
                    if on_step is not None:
                        on_step(self.step)
                    if interrupt.requested:
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            if consistent:
                self._save_checkpoint()
                bar.write(f"train: interrupted; checkpoint at step {self.step} of {self.total_steps} in "
                          f"{self.folder / CHECKPOINT} (rerun the same command to continue)")
            raise
        finally:
            bar.close()
        return TrainResult(
            steps=self.step, epochs=self.config.epochs, train_samples=len(self.train), val_samples=len(self.val),
            train_tokens=sum(self.store.lengths[i] for i in self.train), seconds=round(self.seconds, 1),
            parameters=sum(p.numel() for p in self.parameters), curve=list(self.curve),
        )

    def _remaining_batches(self):
        """The batches still to train, in order; every finished epoch is validated and checkpointed on the way."""
        while self.epoch < self.config.epochs:
            batches = self.plan[self.epoch]
            while self.batch < len(batches):
                yield batches[self.batch]  # _advance moves self.batch on
            self.epoch, self.batch = self.epoch + 1, 0
            self._validate(epoch=self.epoch)
            self._save_checkpoint()

    def _advance(self, loss: float, tokens: int, bar) -> None:
        """Count a finished step: progress bar, a "train" log record and a checkpoint every checkpoint_every steps."""
        self.batch += 1
        self.step += 1
        self.seconds = time.perf_counter() - self._started
        self.window = [self.window[0] + loss, self.window[1] + 1, self.window[2] + tokens]
        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.1e}")
        bar.update(1)
        if self.step % self.config.checkpoint_every:
            return
        elapsed = time.perf_counter() - self._window_started
        self.log.append({"kind": "train", "epoch": self.epoch, "step": self.step, "loss": round(self.window[0] / self.window[1], 5),
                   "lr": self.scheduler.get_last_lr()[0],
                   "tokens_per_s": round(self.window[2] / elapsed, 1) if elapsed else None})
        self.window, self._window_started = [0.0, 0, 0], time.perf_counter()
        self._save_checkpoint()

    def _train_step(self, positions: list[int]) -> tuple[float, int]:
        batch = make_batch([self.store.load(i) for i in positions], self.config.ttt_steps, self.in_draft_vocab)
        self.head.train()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bfloat16):
            logits = ttt_forward(self.head, _to(batch, self.device))
        loss = ttt_loss(logits, batch, self.config.step_weight)
        self.optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:  # a batch with no loss row (every teacher argmax outside the draft vocabulary)
            loss.backward()     # has nothing to learn: the schedule still advances, so a resume does not stall
            torch.nn.utils.clip_grad_norm_(self.parameters, self.config.grad_clip)
            self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach()), batch.tokens_count

    @torch.no_grad()
    def evaluate(self, positions: list[int]) -> dict:
        """Agreement summary (:meth:`Agreement.summary`) of the head on ``positions``."""
        agreement = Agreement(self.config.ttt_steps)
        self.head.eval()
        batches = pack(positions, self.store.lengths, self.config.batch_tokens)
        for batch_positions in batches:
            batch = make_batch([self.store.load(i) for i in batch_positions], self.config.ttt_steps, self.in_draft_vocab)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bfloat16):
                logits = ttt_forward(self.head, _to(batch, self.device))
            agreement.observe(logits, batch, self.target_ids)
        return agreement.summary()

    def _validate(self, epoch: int) -> None:
        if not self.val:
            return
        record = {"kind": "val", "epoch": epoch, "step": self.step, "seconds": round(self.seconds, 1)}
        record.update(self.evaluate(self.val))
        self.curve.append(record)
        self.log.append(record)

    # ------------------------------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self) -> None:
        state = {
            "step": self.step, "epoch": self.epoch, "batch": self.batch, "seconds": self.seconds,
            "head": {name: p.detach().clone() for name, p in self.head.named_parameters() if p.requires_grad},
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "rng": torch.get_rng_state(), "curve": self.curve, "log": self.log.records, "window": self.window,
        }
        with atomic_target(self.folder / CHECKPOINT) as temporary:
            torch.save(state, temporary)

    def _load_checkpoint(self) -> None:
        path = self.folder / CHECKPOINT
        if not path.is_file():
            self.log.rewrite([])  # a fresh run: any log of an unfinished first attempt is stale
            return
        state = torch.load(path, map_location="cpu", weights_only=True)
        with torch.no_grad():
            named = dict(self.head.named_parameters())
            for name, tensor in state["head"].items():
                named[name].copy_(tensor)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        self.step, self.epoch, self.batch, self.seconds = state["step"], state["epoch"], state["batch"], state["seconds"]
        self.curve = list(state["curve"])
        self.window = list(state["window"])
        self.log.rewrite(list(state["log"]))  # records after the checkpoint belong to a lost future


def _to(batch, device: torch.device):
    """The batch's model inputs on ``device`` (targets stay where they are)."""
    if device.type == "cpu":
        return batch
    from dataclasses import replace

    return replace(batch, aux=batch.aux.to(device), tokens=batch.tokens.to(device), positions=batch.positions.to(device))


LOGIT_BYTES_PER_ENTRY = 24  # fp32 logits, log-softmax, teacher softmax and their gradients, per row x draft id


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` (RAM for the CPU), None when unknown."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[1])
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None


def check_step_memory(config: TrainConfig, draft_vocab: int, device: torch.device) -> None:
    """Refuse, before any step, a run whose draft-vocabulary logits alone (batch tokens x TTT steps x Vd)
    would not fit in 70% of the device's memory (a full-vocabulary head with the default batch needs
    ~20 GB a step): a clear error now rather than an out-of-memory kill hours in."""
    total = device_memory_bytes(device)
    need = config.batch_tokens * config.ttt_steps * draft_vocab * LOGIT_BYTES_PER_ENTRY
    if total is not None and need > 0.7 * total:
        fitting = max(8, int(0.7 * total / (config.ttt_steps * draft_vocab * LOGIT_BYTES_PER_ENTRY)))
        raise bad_argument("batch-tokens", config.batch_tokens,
                           f"at most ~{fitting} with draft vocabulary {draft_vocab} and {config.ttt_steps} TTT steps "
                           f"(a step's logits would need ~{need / 2**30:.1f} GiB of the {total / 2**30:.1f} GiB here); "
                           "lower --batch-tokens or --draft-vocab")


def prepare_head_for_training(head: Eagle3Head) -> Eagle3Head:
    """float32 trainable weights (the frozen target embedding keeps the target's dtype; the rotary
    frequencies are float32 in training and inference alike, :meth:`Eagle3Head._apply`)."""
    for parameter in head.trainable_parameters():
        parameter.data = parameter.data.float()
        parameter.requires_grad_(True)
    head.embed_tokens.weight.requires_grad_(False)
    return head


def export_head(head: Eagle3Head, out: pathlib.Path, report: dict) -> pathlib.Path:
    """The head in the published format (bf16 ``model.safetensors`` + ``config.json``) plus ``training.json``."""
    import json

    folder = save_eagle3_head(head, out)
    atomic_write_text(folder / "training.json", json.dumps(report, indent=2, default=str))
    return folder


def format_curve(curve: list[dict]) -> str:
    """The validation curve as a text table: one line per validation."""
    if not curve:
        return "validation: none (val-fraction 0)"
    steps = len(curve[0]["top1"])
    header = f"{'epoch':>5} {'step':>6} " + " ".join(f"{'top1@' + str(j):>7}" for j in range(steps)) + \
        f" {'loss@0':>7} {'chain':>6}"
    lines = [header]
    for record in curve:
        top1 = " ".join(f"{(value or 0.0):>7.3f}" for value in record["top1"])
        loss = record["loss"][0]
        lines.append(f"{record['epoch']:>5} {record['step']:>6} {top1} {loss if loss is None else round(loss, 3):>7} "
                     f"{record['chain_length'] or 0:>6.3f}")
    return "\n".join(lines)
