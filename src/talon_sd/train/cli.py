"""``talon train-head``: train an EAGLE-3 head for a target, offline and resumable.

    talon train-head --target M --out DIR [--work DIR] [--stage data|features|train|all] [--resume] ...

Stages (each skips what is already on disk in ``--work``, default ``runs/head-<target>``): data (prompts
and the target's answers), features (teacher-forced target features), train (the training-time test),
then the head is exported to ``--out`` with ``training.json``. Rerunning the same command continues;
``--resume`` takes every setting not given on the command line from the work folder; a folder made with
other settings is refused with a one-line error (before any model is loaded).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
from dataclasses import asdict, dataclass

from ..config import CPU_KERNELS
from ..errors import TalonError, bad_argument

STAGES = ("data", "features", "train", "all")
DEFAULT_SELF_PROMPTS = 500  # with no --prompts
DEFAULT_SOURCE_PROMPTS = 500  # with no --prompts

# flag dest -> (settings section, field); --seed seeds both the data and the train stage
SETTING_FLAGS = {
    "prompts": ("data", "prompt_files"), "self_prompts": ("data", "self_prompts"),
    "source_prompts": ("data", "source_prompts"), "source_dir": ("data", "source_roots"),
    "max_new_tokens": ("data", "max_new_tokens"), "max_request_tokens": ("data", "max_request_tokens"),
    "gen_batch": ("data", "batch_size"), "answer_temperature": ("data", "answer_temperature"),
    "seed": ("data", "seed"), "draft_vocab": ("features", "draft_vocab"), "aux_layers": ("features", "aux_layers"),
    "ttt_steps": ("train", "ttt_steps"), "epochs": ("train", "epochs"), "lr": ("train", "lr"),
    "batch_tokens": ("train", "batch_tokens"), "val_fraction": ("train", "val_fraction"),
    "precision": ("train", "precision"), "head_init": ("train", "head_init"),
}


def register(commands) -> None:
    """Add ``train-head`` to the ``talon`` subcommands."""
    parser = commands.add_parser("train-head", help="train an EAGLE-3 head for a target (offline, resumable)",
                                 description="Train an EAGLE-3 head for a target, offline: data (prompts answered by "
                                             "the target) -> features -> training-time test -> export. Every stage "
                                             "resumes from the work folder.")
    parser.add_argument("--target", default=None, help="target model: built-in name, folder, .gguf file or hub id "
                        "(default: qwen2.5-coder-1.5b-instruct)")
    parser.add_argument("--dtype", default=None, help="auto (default), float32 or bfloat16: the target's dtype")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if present)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--cpu-kernels", default="auto", choices=CPU_KERNELS,
                        help="auto (default) or packed: oneDNN-packed float32 linears in the target's decoder on CPU "
                             "for the data and features stages (their forwards are batched, where packing won on "
                             "every CPU measured, so auto times nothing here); default: torch's own kernels")
    data = parser.add_argument_group("data")
    data.add_argument("--prompts", action="append", default=None, metavar="FILE.jsonl",
                      help='prompts, one JSON object a line with "turns": [...] or "prompt": "..." (repeatable)')
    data.add_argument("--self-prompts", type=int, default=None, metavar="N",
                      help=f"requests the target writes itself (Magpie); default {DEFAULT_SELF_PROMPTS} without --prompts, else 0")
    data.add_argument("--source-prompts", type=int, default=None, metavar="N",
                      help=f"requests about local Python code; default {DEFAULT_SOURCE_PROMPTS} without --prompts, else 0")
    data.add_argument("--source-dir", action="append", default=None, metavar="DIR",
                      help="where the code for --source-prompts comes from (repeatable; default: the standard library)")
    data.add_argument("--max-new-tokens", type=int, default=None, help="answer length cap (default 256)")
    data.add_argument("--max-request-tokens", type=int, default=None, help="self-prompt length cap (default 160)")
    data.add_argument("--gen-batch", type=int, default=None, help="sequences per generate call (default 16)")
    data.add_argument("--answer-temperature", type=float, default=None, help="0 = greedy answers (default)")
    features = parser.add_argument_group("features")
    features.add_argument("--draft-vocab", type=int, default=None, metavar="VD",
                          help="draft vocabulary size (default 8192, clamped to the target's)")
    features.add_argument("--aux-layers", type=_layers, default=None, metavar="A,B,C",
                          help="target layers whose inputs the head reads (default 2,L//2,L-3)")
    train = parser.add_argument_group("train")
    train.add_argument("--ttt-steps", type=int, default=None, metavar="K", help="training-time-test steps (default 3)")
    train.add_argument("--epochs", type=int, default=None, help="default 3")
    train.add_argument("--lr", type=float, default=None, help="peak learning rate (default 3e-4)")
    train.add_argument("--batch-tokens", type=int, default=None, help="tokens per optimizer step (default 2048)")
    train.add_argument("--val-fraction", type=float, default=None, help="held-out share of the samples (default 0.05)")
    train.add_argument("--precision", default=None, choices=("auto", "float32", "bfloat16"),
                       help="auto (default): bf16 autocast where the CPU is fast at it")
    train.add_argument("--head-init", default=None, choices=("target", "random"),
                       help="random (default): every head weight from scratch; target: the head's lm_head starts "
                            "from the target's output rows of the draft vocabulary and its final norm from the "
                            "target's (as vLLM's speculators does; no better on the packaged target's small run)")
    train.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default 50)")
    parser.add_argument("--seed", type=int, default=None, help="default 0")
    parser.add_argument("--work", default=None, help="work folder (default runs/head-<target>)")
    parser.add_argument("--out", default=None, help="where the trained head is written (needed by --stage train/all)")
    parser.add_argument("--stage", default="all", choices=STAGES, help="run up to this stage only, or all (default)")
    parser.add_argument("--resume", action="store_true",
                        help="take every setting not given here from the work folder's run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run_train_head)


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three comma-separated integers, got {text!r}") from None


@dataclass(frozen=True)
class RunPlan:
    """Everything one invocation does, resolved from the flags (and the work folder with --resume)."""

    target: str
    dtype: str
    data: object  # DataConfig
    features: object  # FeatureConfig
    train: object  # TrainConfig
    work: pathlib.Path
    out: pathlib.Path | None
    stage: str

    def settings(self, stage: str) -> dict:
        """What identifies the output of ``stage`` (each stage includes the ones before it)."""
        settings = self.identity() | {"data": self.data.settings()}
        if stage in ("features", "train"):
            settings["features"] = asdict(self.features)
        if stage == "train":
            settings["train"] = self.train.settings()
        return settings

    def identity(self) -> dict:
        """What identifies the model every stage reads."""
        return {"target": self.target, "dtype": self.dtype}

    def stages(self) -> tuple[str, ...]:
        return ("data", "features", "train") if self.stage == "all" else (self.stage,)


def resolve_plan(args: argparse.Namespace) -> RunPlan:
    """Flags (plus, with --resume, the work folder's settings) -> a checked :class:`RunPlan`."""
    from ..models import DEFAULT_TARGET, resolve_device, resolve_dtype
    from .data import DataConfig
    from .features import FeatureConfig
    from .store import read_json
    from .trainer import TrainConfig

    target = args.target
    work = pathlib.Path(args.work).expanduser() if args.work else None
    saved: dict = {}
    if args.resume:
        if work is None:
            work = default_work(target or DEFAULT_TARGET)
        saved = next((s for s in (read_json(work / stage / "settings.json") for stage in ("train", "features", "data"))
                      if s is not None), None)
        if saved is None:
            raise TalonError(f"resume: {work} holds no run to resume (no settings.json); drop --resume to start one")
        target = target or saved["target"]
    target = target or DEFAULT_TARGET
    if pathlib.Path(target).expanduser().exists():
        target = str(pathlib.Path(target).expanduser().resolve())
    work = work or default_work(target)
    device = resolve_device(args.device)
    dtype = args.dtype or saved.get("dtype") or "auto"
    dtype = str(resolve_dtype(dtype, device)).removeprefix("torch.")

    values = {}
    for dest, (section, field) in SETTING_FLAGS.items():
        given = getattr(args, dest)
        if given is not None:
            values[dest] = tuple(given) if isinstance(given, list) else given
        elif section in saved and field in saved[section]:
            stored = saved[section][field]
            values[dest] = tuple(stored) if isinstance(stored, list) else stored
    if missing := [d for d in ("self_prompts", "source_prompts") if d not in values]:
        defaults = {"self_prompts": 0, "source_prompts": 0} if values.get("prompts") else \
            {"self_prompts": DEFAULT_SELF_PROMPTS, "source_prompts": DEFAULT_SOURCE_PROMPTS}
        values.update({d: defaults[d] for d in missing})

    def pick(section: str, config_class):
        fields = {field: values[dest] for dest, (sec, field) in SETTING_FLAGS.items() if sec == section and dest in values}
        if section == "data":
            fields["prompt_files"] = tuple(str(pathlib.Path(p).expanduser().resolve()) for p in values.get("prompts", ()))
            fields["source_roots"] = tuple(str(pathlib.Path(p).expanduser().resolve()) for p in values.get("source_dir", ()))
        if section == "train":
            fields["checkpoint_every"] = args.checkpoint_every
            if "seed" in values:
                fields["seed"] = values["seed"]
        config = config_class(**fields)
        return config.resolved(device) if section == "train" else config  # precision "auto" made concrete

    plan = RunPlan(target=target, dtype=dtype, data=pick("data", DataConfig), features=pick("features", FeatureConfig),
                   train=pick("train", TrainConfig), work=work,
                   out=pathlib.Path(args.out).expanduser() if args.out else None, stage=args.stage)
    if plan.stage in ("train", "all") and plan.out is None:
        raise TalonError("out: required with --stage train or all (the folder the trained head is written to)")
    last = ("data", "features", "train").index(plan.stages()[-1])
    for stage in ("data", "features", "train")[: last + 1]:  # refuse another run's folder before loading any model
        check_settings_early(plan, stage)
    return plan


def check_settings_early(plan: RunPlan, stage: str) -> None:
    from .store import check_settings

    check_settings(plan.work / stage, plan.settings(stage), stage, write=False)


def default_work(target: str) -> pathlib.Path:
    name = pathlib.Path(target).name or target
    return pathlib.Path("runs") / ("head-" + re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-"))


def command_line(plan: RunPlan) -> str:
    """The command that makes this run again, every setting spelled out."""
    data, features, train = plan.data, plan.features, plan.train
    words = ["talon", "train-head", "--target", plan.target, "--dtype", plan.dtype]
    for path in data.prompt_files:
        words += ["--prompts", path]
    for path in data.source_roots:
        words += ["--source-dir", path]
    words += ["--self-prompts", data.self_prompts, "--source-prompts", data.source_prompts,
              "--max-new-tokens", data.max_new_tokens, "--max-request-tokens", data.max_request_tokens,
              "--gen-batch", data.batch_size, "--answer-temperature", data.answer_temperature,
              "--draft-vocab", features.draft_vocab]
    if features.aux_layers:
        words += ["--aux-layers", ",".join(map(str, features.aux_layers))]
    words += ["--ttt-steps", train.ttt_steps, "--epochs", train.epochs, "--lr", train.lr,
              "--batch-tokens", train.batch_tokens, "--val-fraction", train.val_fraction, "--precision", train.precision,
              "--head-init", train.head_init,
              "--seed", train.seed, "--work", plan.work]
    if plan.out is not None:
        words += ["--out", plan.out]
    return shlex.join(str(word) for word in words)


def stages_need_target_forwards(stages) -> bool:
    """Whether the target runs forwards in these stages (data: generation; features: teacher forcing)."""
    return "data" in stages or "features" in stages


def run_train_head(args: argparse.Namespace) -> int:
    from ..cli_common import configure_torch

    configure_torch(args)
    if args.checkpoint_every < 1:
        raise bad_argument("checkpoint-every", args.checkpoint_every, "an integer >= 1")
    plan = resolve_plan(args)
    progress = not args.no_progress
    from ..models import load_model

    loaded = load_model(plan.target, dtype=plan.dtype, device=args.device)
    if args.cpu_kernels in ("auto", "packed") and stages_need_target_forwards(plan.stages()):
        from ..lm import pack_linears_for_cpu

        pack_linears_for_cpu(loaded.model, keep_output=True)  # the features stage reads the output head's rows
    report = {"command": command_line(plan), "target": plan.target, "dtype": plan.dtype, "work": str(plan.work)}
    stages = plan.stages()
    if "data" in stages:
        from .data import build_data

        summary = build_data(loaded.model, loaded.tokenizer, plan.data, plan.work / "data", plan.identity(), progress)
        print(f"data: {summary.samples} samples, {summary.tokens} tokens ({summary.answer_tokens} answer tokens), "
              f"{summary.skipped} skipped, prompts {summary.prompts_by_source} -> {plan.work / 'data'}")
    if "features" in stages:
        from .data import read_samples
        from .features import write_features

        summary = write_features(loaded.model, read_samples(plan.work / "data"), plan.features, plan.work / "features",
                                 plan.settings("data"), progress)
        print(f"features: {summary.samples} samples, {summary.tokens} tokens, draft vocabulary {summary.draft_vocab} "
              f"(covers {summary.coverage:.1%} of answer tokens), teacher {summary.teacher}, "
              f"{summary.bytes / 1e9:.2f} GB -> {plan.work / 'features'}")
    if "train" in stages:
        train(plan, loaded.model, report, progress)
    return 0


def train(plan: RunPlan, model, report: dict, progress: bool) -> None:
    """The train stage and the export."""
    from ..eagle3 import init_eagle3_head
    from .features import FeatureStore
    from .store import read_json
    from .trainer import Trainer, export_head, format_curve, prepare_head_for_training

    store = FeatureStore(plan.work / "features")
    head = prepare_head_for_training(init_eagle3_head(model, draft_vocab=store.draft_ids, aux_layers=store.aux_layers,
                                                      seed=plan.train.seed,
                                                      output_from_target=plan.train.head_init == "target"))
    trainer = Trainer(head, store, plan.train, plan.work, plan.settings("features"), progress)
    result = trainer.run()
    print(format_curve(result.curve))
    report.update({
        "draft_vocab": int(store.draft_ids.numel()), "ttt_steps": plan.train.ttt_steps, "aux_layers": list(store.aux_layers),
        "parameters": result.parameters, "data": read_json(plan.work / "data" / "summary.json"),
        "features": read_json(plan.work / "features" / "summary.json"),
        "train": {k: v for k, v in asdict(result).items() if k != "curve"}, "validation": result.curve,
        "settings": plan.settings("train"),
    })
    stage_seconds = [(report.get(name) or {}).get("seconds") or 0.0 for name in ("data", "features", "train")]
    report["wall_seconds"] = round(sum(stage_seconds), 1)
    folder = export_head(head, plan.out, report)
    print(f"head: {folder} (Vd {report['draft_vocab']}, k {plan.train.ttt_steps}, {result.parameters / 1e6:.1f}M "
          f"trainable parameters); use it with: talon generate --drafter eagle3 --draft {folder} ...")
