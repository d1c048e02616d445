"""The benchmark loop: every variant on every prompt, interleaved prompt by prompt.

Contract
--------
:func:`run_bench` takes a ready :class:`~talon_sd.generator.SpeculativeGenerator` (any models: the
packaged Qwen pair, or tiny test models with ``tokenizer=None`` and :class:`Prompt` s holding
``input_ids``), the prompts, the variants and one :class:`Decoding`, and returns one
:class:`SampleRecord` per (prompt turn, variant), nothing else changed.

* **Interleaving.** For each prompt turn (a *sample*) every variant runs once, before the next
  sample starts, so that machine drift (thermal, other load) hits every method alike; the order of
  the variants rotates by one at each sample, so that no method is always first after a switch.
* **Repeats** (``repeats`` R > 1; the machine is noisy). Each sample runs R rounds, the variant order
  rotated once more each round, and every variant, ``ar`` too, runs once per round; each variant keeps the
  run with the median seconds (for an even R the slower of the two middle ones), its stats and tokens
  with it, and ``round_seconds`` lists every round's seconds. ``ar`` is repeated as well so that a ratio to
  it compares median with median: a single ``ar`` run that the machine slowed or sped up by 10-20% (seen
  on the 2-core EPYC: plain decoding read 0.83-1.19x of itself request by request) would move every ratio
  of the sample; its kept run is the reference for the conversation and for ``identical_to_ar`` (greedy
  ``ar`` commits the same tokens every round). Online budget controllers start every run of a sample from what they had
  learned before the sample (:meth:`~talon_sd.generator.SpeculativeGenerator.restore_controller_memory`),
  so no round learns from an earlier round of the same prompt; the kept run's controller goes on to
  the next sample.
* **Warm-up.** Before any timing, each variant generates ``warmup_tokens`` tokens once for the
  first prompt (first-call allocations, lazy initialisation), untimed; what the online budget controllers
  learned from it is then forgotten (:meth:`~talon_sd.generator.SpeculativeGenerator.restore_controller_memory`),
  so the first timed run starts from the controllers the bench was given. The warm-up's times are cold (the
  first draft forward ever): kept, they would tell the controller that drafting costs more than it does.
* **Multi-turn prompts** (MT-Bench) are real conversations: turn k is sent after the user turns
  1..k-1 and the model's own answers to them. The answer used is the one of the *reference* variant
  (``ar``, the target's own decoding; the first variant if there is no ``ar``), so that every method
  is timed on the same turn-k prompt and greedy outputs stay comparable token for token.
* **Seeds.** Sample i uses seed ``decoding.seed + i`` for every variant (sampling mode).
* ``identical_to_ar`` (greedy mode only): the variant's token ids equal ``ar``'s for that sample.
* **Interruption** (Ctrl-C): the records of every sample whose variants all finished are returned,
  so that a long run can still be written out (compare with :func:`count_samples`).
* **Checkpoint** (optional, :class:`~talon_sd.bench.checkpoint.Checkpoint`): each finished sample is
  appended to it, and the samples it already holds (``checkpoint.done``) are reused, not re-run; a
  reused MT-Bench first turn still feeds its answer to the second turn.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from ..errors import TalonError, bad_argument

from .datasets import Prompt
from .methods import Decoding, Outcome, Variant, run_variant


@dataclass
class SampleRecord:
    """One timed generation of one variant for one prompt turn."""

    index: int  # sample number in run order (one per prompt turn)
    dataset: str
    question_id: str
    turn: int  # 1-based
    label: str
    method: str
    prompt_tokens: int
    seed: int
    outcome: Outcome
    text: str
    identical_to_ar: bool | None  # None in sampling mode or without an ar variant
    round_seconds: list[float] | None = None  # every round's seconds when the sample ran more than once

    @property
    def new_tokens(self) -> int:
        return len(self.outcome.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.outcome.seconds if self.outcome.seconds > 0 else 0.0


@dataclass(frozen=True)
class Sample:
    """One prompt turn to run: its run-order ``index``, ``turn`` (0-based) of ``prompt``, token ids, seed."""

    index: int
    prompt: Prompt
    turn: int
    ids: torch.Tensor  # [L] prompt token ids, chat template and earlier turns included
    seed: int


def count_samples(prompts: Sequence[Prompt]) -> int:
    """Prompt turns in ``prompts`` (each runs once per variant)."""
    return sum(prompt.num_turns for prompt in prompts)


def runs_per_sample(variants: Sequence[Variant], repeats: int = 1) -> int:
    """Timed generations per prompt turn: every variant, ``ar`` too, ``repeats`` times (module contract)."""
    return len(variants) * repeats


def run_bench(generator, prompts: Sequence[Prompt], variants: Sequence[Variant], decoding: Decoding,
              warmup_tokens: int = 8, progress: bool = True, description: str = "bench",
              checkpoint=None, repeats: int = 1) -> list[SampleRecord]:
    """Run every variant on every prompt turn (see the module contract)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise bad_argument("repeats", repeats, "an integer >= 1")
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"variant labels must be unique, got {labels}")
    ar_label = next((v.label for v in variants if v.method == "ar"), None)
    reference_label = ar_label or labels[0]
    done: dict[int, list[SampleRecord]] = checkpoint.done if checkpoint is not None else {}
    if warmup_tokens > 0 and prompts and len(done) < count_samples(prompts):
        warm = replace(decoding, max_new_tokens=warmup_tokens)
        first_ids = prompt_ids(generator, prompts[0], [], 0)
        before = generator.controller_memory()
        with _progress_bar(len(variants), f"{description} warm-up", progress) as bar:
            for variant in variants:
                bar.set_postfix_str(variant.label)
                run_variant(generator, variant, first_ids, warm, decoding.seed)
                bar.update(1)
        generator.restore_controller_memory(before)  # cold times teach the controllers nothing (module contract)
    per_sample = runs_per_sample(variants, repeats)
    bar = _progress_bar(count_samples(prompts) * per_sample, description, progress, initial=per_sample * len(done))
    records: list[SampleRecord] = []
    index = 0
    try:
        for prompt in prompts:
            history: list[dict] = []
            for turn in range(prompt.num_turns):
                ids = prompt_ids(generator, prompt, history, turn)
                if index in done:
                    turn_records = done[index]
                else:
                    sample = Sample(index=index, prompt=prompt, turn=turn, ids=ids, seed=decoding.seed + index)
                    turn_records = _run_sample(generator, variants, sample, decoding, bar, repeats)
                    if checkpoint is not None:
                        checkpoint.append(turn_records)
                records.extend(turn_records)
                outcomes = {r.label: r.outcome for r in turn_records}
                if prompt.input_ids is None:
                    answer = text_of(generator, outcomes[reference_label].token_ids)
                    history = history + [{"role": "user", "content": prompt.turns[turn]},
                                         {"role": "assistant", "content": answer}]
                index += 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: keeping the {index} complete prompt turns", file=sys.stderr)
    finally:
        bar.close()
    return records


def _run_sample(generator, variants: Sequence[Variant], sample: Sample, decoding: Decoding, bar,
                repeats: int = 1) -> list[SampleRecord]:
    """Every variant on one prompt turn, in rotated order, ``repeats`` rounds; records in variant order, each
    with its median run."""
    runs: dict[str, list[tuple[Outcome, dict | None]]] = {variant.label: [] for variant in variants}
    before = generator.controller_memory() if repeats > 1 else None
    for round_index in range(repeats):
        shift = (sample.index + round_index) % len(variants)
        for variant in list(variants[shift:]) + list(variants[:shift]):
            bar.set_postfix_str(f"{sample.prompt.dataset} #{sample.prompt.question_id} t{sample.turn + 1} "
                                f"{variant.label}" + (f" round {round_index + 1}/{repeats}" if repeats > 1 else ""))
            if before is not None:
                generator.restore_controller_memory(before)
            outcome = run_variant(generator, variant, sample.ids, decoding, sample.seed)
            runs[variant.label].append((outcome, generator.controller_memory() if before is not None else None))
            bar.update(1)
    kept = {label: sorted(rounds, key=lambda run: run[0].seconds)[len(rounds) // 2] for label, rounds in runs.items()}
    if before is not None:  # each variant's kept run passes on what its controllers learned
        memory = dict(before)
        for variant in variants:
            memory.update({key: c for key, c in kept[variant.label][1].items() if before.get(key) is not c})
        generator.restore_controller_memory(memory)
    outcomes = {label: run[0] for label, run in kept.items()}
    ar_label = next((v.label for v in variants if v.method == "ar"), None)
    ar_tokens = outcomes[ar_label].token_ids if ar_label and decoding.greedy else None
    return [SampleRecord(
        index=sample.index, dataset=sample.prompt.dataset, question_id=sample.prompt.question_id,
        turn=sample.turn + 1, label=variant.label, method=variant.method, prompt_tokens=int(sample.ids.numel()),
        seed=sample.seed, outcome=outcomes[variant.label], text=text_of(generator, outcomes[variant.label].token_ids),
        identical_to_ar=None if ar_tokens is None else outcomes[variant.label].token_ids == ar_tokens,
        round_seconds=[run[0].seconds for run in runs[variant.label]] if len(runs[variant.label]) > 1 else None,
    ) for variant in variants]


def prompt_ids(generator, prompt: Prompt, history: list[dict], turn: int) -> torch.Tensor:
    """Token ids [L] of turn ``turn`` of ``prompt`` after the conversation ``history``: through the chat
    template, or (``--no-chat-template``, base models) the turns and answers as plain text, one blank line apart."""
    if prompt.input_ids is not None:
        return generator.encode_prompt(input_ids=list(prompt.input_ids))
    if not generator.chat_template:
        return generator.encode_prompt("\n\n".join([m["content"] for m in history] + [prompt.turns[turn]]))
    if generator.tokenizer is not None and not getattr(generator.tokenizer, "chat_template", None):
        raise TalonError("prompt: the tokenizer has no chat template (a base model?); run with --no-chat-template")
    return generator.encode_prompt(history + [{"role": "user", "content": prompt.turns[turn]}])


def text_of(generator, token_ids: list[int]) -> str:
    """Decoded text (special tokens dropped), or the ids joined by spaces without a tokenizer."""
    if generator.tokenizer is None:
        return " ".join(map(str, token_ids))
    return generator.tokenizer.decode(token_ids, skip_special_tokens=True)


def _progress_bar(total: int, description: str, enabled: bool, initial: int = 0):
    """tqdm bar on stderr; ``initial`` counts work reloaded from a checkpoint (kept out of the rate and ETA)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=description, unit="gen", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, mininterval=1.0)
