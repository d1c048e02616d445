"""``talon bench``, ``talon sweep`` and ``talon tune`` (registered by :mod:`talon_sd.cli`).

Cheap arguments (datasets, data files, limit, methods, grids, tree options, ``auto`` profiles) are
all checked before any model is loaded; every mistake is a one-line TalonError (exit status 2).

    talon bench --dtype bfloat16 --limit 5 --max-new-tokens 128 --out runs/greedy
        -> runs/greedy/{results.json, outputs.jsonl, report.md, plots/*.png} and a table on stdout
    talon sweep --datasets mt_bench,humaneval --budgets 8,16,32,64,96 --mus 0.01,0.03 --out runs/sweep
    talon tune --dtype bfloat16            -> the machine profile used by --budget auto
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import shlex
import sys

from ..errors import TalonError, bad_argument
from .datasets import DATASETS, load_prompts, parse_dataset_names, split_list
from .llamacpp import LLAMACPP_METHODS, check_available
from .methods import AUTO, METHODS, TUNED, TUNED_KEY, Decoding, bench_variants, parse_methods
from .sweep import SWEEP_METHODS

TUNE_METHODS = ("talon", "eagle", "chain", "static")
# Calibration length per prompt: a sampled step's accepted length is random even for a fixed context,
# so a sampled calibration needs more steps for the same precision (at 24 tokens, about 17 steps per
# configuration, TALON's sampled MAT was not even monotone in N in one calibration).
CALIBRATION_TOKENS_GREEDY = 24
CALIBRATION_TOKENS_SAMPLED = 64


def register(commands) -> None:
    """Add the ``bench``, ``sweep`` and ``tune`` subcommands to the ``talon`` parser."""
    bench = commands.add_parser("bench", help="compare every method on the benchmark datasets, side by side")
    _add_model_arguments(bench)
    _add_run_arguments(bench, datasets="all", limit=5, max_new_tokens=128, out="bench")
    bench.add_argument("--methods", default=",".join(m for m in METHODS if m not in LLAMACPP_METHODS),
                       help="comma-separated, some of " + ", ".join(METHODS) + " (ar always runs: the baseline; "
                            "default: all but the llama.cpp methods, which need llama-cpp-python)")
    bench.add_argument("--head", default=None, help="an EAGLE-3 head folder for the methods named with @eagle3")
    bench.add_argument("--budget", type=_auto_or_tuned, default=None,
                       help="'auto': talon, eagle and chain with the online budget controller (static: tuned); "
                            "'tuned': every tree method at the options `talon tune` picked for this machine")
    bench.add_argument("--talon-budget", type=_int_or_auto, default=None, help="talon N (int, auto or tuned)")
    bench.add_argument("--talon-mu", type=float, default=None, help="talon gate mu")
    bench.add_argument("--talon-topk", type=int, default=None, help="talon root children K")
    bench.add_argument("--eagle-budget", type=_int_or_auto, default=None, help="eagle total tokens (int, auto or tuned)")
    bench.add_argument("--eagle-topk", type=int, default=None, help="eagle top-k per layer")
    bench.add_argument("--eagle-depth", type=int, default=None, help="eagle draft layers")
    bench.add_argument("--chain-depth", type=_int_or_auto, default=None, help="chain draft tokens per step (int, auto or tuned)")
    bench.add_argument("--static-budget", type=_int_or_auto, default=None, help="static tree nodes (int or tuned)")
    bench.set_defaults(handler=run_bench_command, subparser=bench)

    sweep = commands.add_parser("sweep", help="speedup against the tree budget N (and mu, top-k, depth)")
    _add_model_arguments(sweep)
    _add_run_arguments(sweep, datasets="mt_bench,gsm8k,humaneval", limit=2, max_new_tokens=64, out="sweep")
    sweep.add_argument("--methods", default="talon,eagle", help="some of " + ", ".join(SWEEP_METHODS))
    sweep.add_argument("--budgets", default="8,16,32,64,96",
                       help="budgets N (tree nodes, root counted); 'auto' adds the online controller's variant")
    sweep.add_argument("--mus", default="0.03", help="talon gate values")
    sweep.add_argument("--talon-topks", default="4", help="talon root children K")
    sweep.add_argument("--eagle-topks", default="4", help="eagle top-k per layer")
    sweep.add_argument("--eagle-depths", default="5", help="eagle draft layers")
    sweep.set_defaults(handler=run_sweep_command, subparser=sweep)

    tune = commands.add_parser("tune", help="measure this machine and pick each method's budget (--budget auto)")
    _add_model_arguments(tune)
    tune.add_argument("--methods", default="talon,eagle,chain", help="some of " + ", ".join(TUNE_METHODS))
    tune.add_argument("--calibration-datasets", default="mt_bench,gsm8k,humaneval",
                      help="prompt sets the calibration prompts are taken from, round-robin")
    tune.add_argument("--calibration-prompts", type=int, default=3, help="prompts decoded per configuration")
    tune.add_argument("--calibration-tokens", type=int, default=None,
                      help=f"new tokens per calibration prompt (default {CALIBRATION_TOKENS_GREEDY} greedy, "
                           f"{CALIBRATION_TOKENS_SAMPLED} sampled: a sampled step's accepted length varies far more)")
    tune.add_argument("--repeats", type=int, default=5, help="timed forwards per size (median)")
    tune.add_argument("--context", type=int, default=200, help="cache length of the timed forwards")
    tune.add_argument("--verify-sizes", default=None, help="tree sizes T to time the target on (default 1..128)")
    tune.add_argument("--draft-widths", default=None, help="frontier widths to time the draft on (default 1..64)")
    tune.add_argument("--talon-budgets", default=None, help="default 4,6,8,12,16,24,32,48")
    tune.add_argument("--talon-mus", default=None, help="default 0.01,0.03,0.1")
    tune.add_argument("--talon-topks", default=None, help="default 4")
    tune.add_argument("--eagle-depths", default=None, help="default 2,3,4,5,6")
    tune.add_argument("--eagle-budgets", default=None, help="default 6,8,12,16,24,32,48")
    tune.add_argument("--eagle-topks", default=None, help="default 2,4,8")
    tune.add_argument("--chain-depths", default=None, help="default 1,2,3,4,5,6")
    tune.add_argument("--static-budgets", default=None, help="default 4,6,8,12,16,24,32")
    tune.add_argument("--temperature", type=float, default=0.0,
                      help="calibrate acceptance at this temperature: 0 = greedy (default); the profile serves "
                           "--budget auto only for runs of the same mode (greedy, or sampling)")
    tune.add_argument("--seed", type=int, default=0, help="calibration prompt i samples with seed + i")
    tune.add_argument("--tolerance", type=float, default=0.0,
                      help="prefer the smallest budget within this fraction of the best prediction")
    tune.add_argument("--no-progress", action="store_true")
    tune.set_defaults(handler=run_tune_command, subparser=tune)


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The shared model flags; here ``--threads`` defaults to every available core (a fixed count)."""
    from ..cli_common import add_model_arguments

    add_model_arguments(parser)
    for action in parser._actions:
        if action.dest == "threads":
            action.help = "torch CPU threads, fixed for the whole run (default: every available core)"


def _add_run_arguments(parser: argparse.ArgumentParser, datasets: str, limit: int, max_new_tokens: int, out: str) -> None:
    parser.add_argument("--datasets", default=None,
                        help=f"comma-separated, some of {', '.join(DATASETS)} or all (default: {datasets}; "
                             "none when only --data is given)")
    parser.set_defaults(default_datasets=datasets)
    parser.add_argument("--data", action="append", default=[], metavar="FILE.jsonl",
                        help="extra prompt file, one JSON object with a 'turns' list per line (repeatable)")
    parser.add_argument("--limit", type=int, default=limit, help=f"prompts per dataset (default {limit})")
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    parser.add_argument("--seed", type=int, default=0, help="prompt turn i samples with seed + i (every method alike)")
    parser.add_argument("--warmup-tokens", type=int, default=8, help="untimed warm-up generation per method")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timed runs of every variant (ar too) per prompt turn, each keeping its median run "
                             "(the machine is noisy; default 1)")
    parser.add_argument("--out", default=None, help=f"output folder (default runs/{out}-<time>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its checkpoint.jsonl (same arguments): finished "
                             "prompt turns are kept, the rest run")
    parser.add_argument("--no-chat-template", action="store_true",
                        help="send the prompts as plain text (base models whose tokenizer has no chat template)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-progress", action="store_true")


# ---------------------------------------------------------------------------------------------- bench


def run_bench_command(args: argparse.Namespace) -> int:
    """``talon bench``: validate, load the models once, run, write everything, print the table."""
    _configure_threads(args)
    prompts, decoding = _prompts_and_decoding(args)
    methods = parse_methods(args.methods)
    if args.drafter != "model" and "hf-assisted" in methods:
        raise TalonError("methods: hf-assisted needs the draft model (--drafter model)")
    if any(name.endswith("@eagle3") for name in methods) and not args.head and args.drafter != "eagle3":
        raise TalonError("head: methods with @eagle3 need --head DIR (an EAGLE-3 head folder)")
    external = [name for name in methods if name in LLAMACPP_METHODS]
    for name in external:
        check_available(name)
    variants = bench_variants(methods, _method_overrides(args), tuned=_tuned_lookup(args))
    checkpoint = _open_checkpoint(args, "bench", prompts, variants, decoding)
    _check_load(args)
    generator = _load_generator(args)
    for name in external:
        check_available(name, generator)
    return _run_and_write(args, generator, prompts, variants, decoding, checkpoint, kind="bench")


def _method_overrides(args: argparse.Namespace) -> dict[str, dict]:
    """Per-method TreeConfig fields from the flags; ``--budget auto`` makes every unset tuned flag auto."""
    overrides = {
        "talon": {"budget": args.talon_budget, "mu": args.talon_mu, "topk": args.talon_topk},
        "eagle": {"budget": args.eagle_budget, "topk": args.eagle_topk, "depth": args.eagle_depth},
        "chain": {"depth": args.chain_depth},
        "static": {"budget": args.static_budget},
    }
    if args.budget is not None:
        for method, name in TUNED_KEY.items():
            if overrides[method][name] is None:
                overrides[method][name] = TUNED if args.budget == TUNED or method == "static" else AUTO
    return overrides


def _tuned_lookup(args: argparse.Namespace):
    from .tune import tuned_tree_options

    return lambda method: tuned_tree_options(method, args.target, args.draft, args.dtype, args.temperature,
                                             getattr(args, "quantize", "none"))


# ---------------------------------------------------------------------------------------------- sweep


def run_sweep_command(args: argparse.Namespace) -> int:
    """``talon sweep``: the grid of configurations, run like a benchmark."""
    from .sweep import sweep_variants

    _configure_threads(args)
    prompts, decoding = _prompts_and_decoding(args)
    methods = parse_methods(args.methods, SWEEP_METHODS)
    variants = sweep_variants(
        methods, _budgets(args.budgets), _numbers("mus", args.mus, float),
        _numbers("talon-topks", args.talon_topks, int), _numbers("eagle-topks", args.eagle_topks, int),
        _numbers("eagle-depths", args.eagle_depths, int),
    )
    checkpoint = _open_checkpoint(args, "sweep", prompts, variants, decoding)
    _check_load(args)
    generator = _load_generator(args)
    return _run_and_write(args, generator, prompts, variants, decoding, checkpoint, kind="sweep")


# ---------------------------------------------------------------------------------------------- shared


def _configure_threads(args: argparse.Namespace) -> None:
    """Fixed thread count: ``--threads`` or every core this process may use."""
    from ..cli_common import configure_torch
    from .machine import available_cores

    if args.threads is None:
        args.threads = available_cores()
    configure_torch(args)


def _check_sampling(args: argparse.Namespace) -> None:
    """``--temperature`` (NaN refused) and ``--seed``, shared by bench, sweep and tune."""
    if not args.temperature >= 0:
        raise bad_argument("temperature", args.temperature, "a number >= 0 (0 = greedy)")
    if args.seed < 0:
        raise bad_argument("seed", args.seed, "an integer >= 0")


def _prompts_and_decoding(args: argparse.Namespace):
    if isinstance(args.max_new_tokens, bool) or args.max_new_tokens < 1:
        raise bad_argument("max-new-tokens", args.max_new_tokens, "an integer >= 1")
    _check_sampling(args)
    if args.warmup_tokens < 0:
        raise bad_argument("warmup-tokens", args.warmup_tokens, "an integer >= 0")
    if args.repeats < 1:
        raise bad_argument("repeats", args.repeats, "an integer >= 1")
    datasets_text = args.datasets if args.datasets is not None else ("" if args.data else args.default_datasets)
    datasets = parse_dataset_names(datasets_text)
    prompts = load_prompts(datasets, args.limit, args.data)
    return prompts, Decoding(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)


def _check_load(args: argparse.Namespace) -> None:
    """Record the load average before models load; warn when other processes already use the CPU."""
    from .machine import load_average

    args.load_before = load_average()
    if args.load_before and args.load_before[0] > 0.5:
        print(f"talon: warning: load average {args.load_before[0]} before the run: other processes use the CPU, "
              "timings will be slower and noisier", file=sys.stderr)


def _load_generator(args: argparse.Namespace):
    from ..generator import SpeculativeGenerator

    from ..cli_common import controller_start
    from ..config import TreeConfig

    start = controller_start(args, TreeConfig("talon", budget="auto"))  # this machine's costs, if tuned
    start.pop("initial_budget", None)  # each variant's own start: its method default
    return SpeculativeGenerator(args.target, args.draft, tree="talon", drafter=args.drafter, dtype=args.dtype,
                                device=args.device, chat_template=not args.no_chat_template,
                                cpu_kernels=args.cpu_kernels, quantize=getattr(args, "quantize", "auto"),
                                head=getattr(args, "head", None), **start)


def _open_checkpoint(args: argparse.Namespace, kind: str, prompts, variants, decoding: Decoding):
    """The run's checkpoint in ``--out`` (created now, so that --resume mistakes fail before models load)."""
    from .checkpoint import Checkpoint
    from .runner import count_samples

    if args.out is None:
        if args.resume:
            raise TalonError("resume: give the --out folder of the run to continue")
        args.out = f"runs/{kind}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    return Checkpoint(pathlib.Path(args.out), run_fingerprint(args, kind, prompts, variants, decoding),
                      resume=args.resume, variant_labels=[v.label for v in variants],
                      planned=count_samples(prompts))


def _run_and_write(args, generator, prompts, variants, decoding: Decoding, checkpoint, kind: str) -> int:
    from . import plots, report
    from .results import build_results, write_results
    from .runner import count_samples, run_bench

    out_dir = pathlib.Path(args.out)
    load_before = getattr(args, "load_before", None)
    planned, resumed = count_samples(prompts), len(checkpoint.done)
    if resumed:
        print(f"talon: resuming {out_dir}: {resumed} of {planned} prompt turns already done", file=sys.stderr)
    records = run_bench(generator, prompts, variants, decoding, warmup_tokens=args.warmup_tokens,
                        progress=not args.no_progress, description=kind, checkpoint=checkpoint, repeats=args.repeats)
    done = len({r.index for r in records})
    if not records:
        print("talon: interrupted before the first prompt finished; nothing written", file=sys.stderr)
        return 130
    settings = {
        "datasets": list(dict.fromkeys(p.dataset for p in prompts)), "data_files": list(args.data),
        "limit": args.limit, "warmup_tokens": args.warmup_tokens, "repeats": args.repeats, "target": _model_label(args.target, "target"),
        "draft": _model_label(args.draft, "draft"), "drafter": args.drafter, "requested_dtype": args.dtype,
        "complete": done == planned, "planned_samples": planned, "resumed_samples": resumed,
        "load_average_before": load_before,
        "profile": _profile_used(args, variants), "arguments": _arguments(args),
    }
    results = build_results(records, variants, decoding, settings, kind=kind, command=command_line(args),
                            generator=generator)
    json_path = write_results(results, records, out_dir)
    print(report.summary_table(results["summary"]))
    plot_files = []
    if not args.no_plots:
        plot_files = plots.write_bench_plots(results, out_dir / "plots") if kind == "bench" else \
            [p for p in [plots.plot_sweep(results, out_dir / "plots" / "sweep.png"),
                         plots.plot_budgets(results, out_dir / "plots" / "budgets.png")] if p is not None]
    writer = report.write_markdown if kind == "bench" else report.write_sweep_markdown
    markdown = writer(results, out_dir, plot_files)
    print(f"\nwrote {json_path}, {markdown}" + (f" and {len(plot_files)} plots in {out_dir / 'plots'}" if plot_files else ""),
          file=sys.stderr)
    return 0 if done == planned else 130


def run_fingerprint(args: argparse.Namespace, kind: str, prompts, variants, decoding: Decoding) -> dict:
    """Every setting that changes what a run generates: a checkpoint only resumes the same run."""
    import dataclasses
    import hashlib
    import json

    prompt_text = json.dumps([[p.dataset, p.question_id, list(p.turns), p.input_ids] for p in prompts])
    return {
        "kind": kind, "target": str(args.target), "draft": str(args.draft), "drafter": args.drafter,
        "dtype": args.dtype, "device": args.device, "decoding": dataclasses.asdict(decoding),
        # absent at the default: older checkpoints still resume
        **({"quantize": args.quantize} if getattr(args, "quantize", "auto") != "auto" else {}),
        "variants": [v.describe() for v in variants],
        "prompts": hashlib.sha256(prompt_text.encode("utf-8")).hexdigest(),
        # absent at 1: older checkpoints still resume; "repeated": ar runs every round too (a checkpoint of the runs
        # that repeated every variant but ar is not resumed)
        **({"repeats": args.repeats, "repeated": "every variant"} if args.repeats > 1 else {}),
    }


def _profile_used(args: argparse.Namespace, variants) -> str | None:
    """The tuned profile file the ``auto`` variants came from, if any."""
    if not any(variant.tuned for variant in variants):
        return None
    from .profiles import find_profile, profile_key

    found = find_profile(profile_key(args.target, args.draft, args.dtype, temperature=args.temperature,
                                     quantize=getattr(args, "quantize", "none")))
    return str(found[1]) if found else None


def _model_label(name: str | None, role: str) -> str:
    from .profiles import model_name

    return model_name(name, role)


def _arguments(args: argparse.Namespace) -> dict:
    return {k: v for k, v in vars(args).items() if k not in ("handler", "subparser", "default_datasets", "load_before")}


def command_line(args: argparse.Namespace) -> str:
    """The command as typed when run from the ``talon`` script, else rebuilt from the parsed flags."""
    if sys.argv[1:2] == [args.command]:
        return "talon " + shlex.join(sys.argv[1:])
    words = ["talon", args.command]
    for action in args.subparser._actions:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value is False or value == [] or value == action.default:
            continue
        flag = action.option_strings[-1]
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, str(value)]
    return shlex.join(words)


def _numbers(name: str, text: str | None, kind: type) -> list:
    """Comma-separated numbers of ``kind``; TalonError naming the flag otherwise."""
    items = split_list(text)
    expected = "comma-separated " + ("integers" if kind is int else "numbers")
    if not items:
        raise bad_argument(name, text, expected)
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise bad_argument(name, text, expected) from None


def _budgets(text: str | None) -> list:
    """``--budgets``: integers, and ``auto`` for the online controller."""
    items = split_list(text)
    if AUTO not in items:
        return _numbers("budgets", text, int)
    rest = [item for item in items if item != AUTO]
    return [AUTO] + (_numbers("budgets", ",".join(rest), int) if rest else [])


def _int_or_auto(text: str):
    if text in (AUTO, TUNED):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, 'auto' or 'tuned', got {text!r}") from None


def _auto_or_tuned(text: str):
    if text not in (AUTO, TUNED):
        raise argparse.ArgumentTypeError(f"expected 'auto' or 'tuned' (per-method numbers: --talon-budget, ...), got {text!r}")
    return text


# ---------------------------------------------------------------------------------------------- tune


def run_tune_command(args: argparse.Namespace) -> int:
    """``talon tune``: measure, calibrate, choose, save the profile, print the table."""
    from .profiles import profile_key, save_profile
    from .tuner import TuneSettings, profile_table, run_tune
    from .tune import DEFAULT_STAGES, DRAFT_WIDTHS, VERIFY_SIZES

    _configure_threads(args)
    methods = parse_methods(args.methods, TUNE_METHODS)
    if args.drafter != "model":
        raise TalonError("drafter: talon tune measures the draft model (--drafter model)")
    if args.calibration_tokens is None:
        args.calibration_tokens = CALIBRATION_TOKENS_SAMPLED if args.temperature > 0 else CALIBRATION_TOKENS_GREEDY
    for name in ("calibration_prompts", "calibration_tokens", "repeats", "context"):
        value = getattr(args, name)
        if value < 1:
            raise bad_argument(name.replace("_", "-"), value, "an integer >= 1")
    if not 0 <= args.tolerance < 1:
        raise bad_argument("tolerance", args.tolerance, "a number in [0, 1)")
    _check_sampling(args)
    stages = {method: _stages(args, method, DEFAULT_STAGES[method]) for method in methods}
    calibration_datasets = parse_dataset_names(args.calibration_datasets)
    if not calibration_datasets:
        raise bad_argument("calibration-datasets", args.calibration_datasets, "some of " + ", ".join(DATASETS))
    settings = TuneSettings(
        verify_sizes=tuple(_positive("verify-sizes", args.verify_sizes, VERIFY_SIZES)),
        draft_widths=tuple(_positive("draft-widths", args.draft_widths, DRAFT_WIDTHS)),
        context=args.context, repeats=args.repeats, calibration_datasets=tuple(calibration_datasets),
        calibration_prompts=args.calibration_prompts, calibration_tokens=args.calibration_tokens,
        tolerance=args.tolerance, temperature=args.temperature, seed=args.seed, stages=stages,
    )
    key = profile_key(args.target, args.draft, args.dtype, args.device, args.threads, args.temperature)
    _check_load(args)
    generator = _load_generator(args)
    key["dtype"] = str(generator.target.dtype).replace("torch.", "")
    profile = run_tune(generator, methods, settings, key, progress=not args.no_progress)
    profile["command"] = command_line(args)
    path = save_profile(profile)
    print(profile_table(profile))
    print()
    for method in methods:
        entry = profile["methods"][method]
        options = ", ".join(f"{k}={v}" for k, v in entry["best"].items() if k in _tuned_fields(method))
        print(f"{method}: {options}  (predicted {entry['predicted_tokens_per_s']:.2f} tok/s)")
    print(f"\nprofile written to {path}; use it with --budget auto", file=sys.stderr)
    return 0


def _tuned_fields(method: str) -> tuple[str, ...]:
    from .tune import TUNED_FIELDS

    return TUNED_FIELDS[method]


def _positive(name: str, text: str | None, default) -> list[int]:
    if text is None:
        return list(default)
    values = _numbers(name, text, int)
    if min(values) < 1:
        raise bad_argument(name, text, "comma-separated integers >= 1")
    return values


def _stages(args: argparse.Namespace, method: str, defaults) -> tuple:
    """The method's search stages, each stage's values from its flag (``--talon-budgets``...) or the default;
    every resulting TreeConfig is validated now, before any model loads."""
    from ..config import TreeConfig

    stages = []
    for name, values in defaults:
        flag = f"{method}-{name}s" if name != "mu" else f"{method}-mus"
        text = getattr(args, flag.replace("-", "_"), None)
        if text is not None:
            values = tuple(_numbers(flag, text, float if name == "mu" else int))
        for value in values:
            try:
                TreeConfig(method=method, **{name: value})
            except TalonError as error:
                raise TalonError(f"{flag}: {error}") from None
        stages.append((name, tuple(values)))
    return tuple(stages)
