"""``talon serve`` (the OpenAI-compatible server) and ``talon bench-serve`` (its load test), registered
by :mod:`talon_sd.cli`. Cheap arguments are checked before any model is loaded; mistakes are one-line
:class:`TalonError` messages (exit status 2).

    talon serve --dtype bfloat16 --port 8000 [--api-key KEY] [--max-batch 8] [--max-queue 64] [--max-model-len N]
    talon bench-serve --url http://127.0.0.1:8000 --clients 4 --duration 60 --max-tokens 64 --out load.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys

from ..errors import TalonError, bad_argument

GRACEFUL_SHUTDOWN_SECONDS = 5  # on SIGINT/SIGTERM, streams still open after this are cancelled
DEFAULT_MAX_BATCH = 8  # bf16 CPU linears cost about the same for 1-8 rows, 3x that for 16 (docs/SERVING.md)
WARM_UP_TOKENS = 2  # one tiny generation before the port opens, so the first request is not the slow one


def register(commands) -> None:
    """Add ``serve`` and ``bench-serve`` to the ``talon`` subcommands."""
    from ..cli_common import add_memory_argument, add_model_arguments, add_tree_arguments

    serve = commands.add_parser("serve", help="OpenAI-compatible HTTP server (continuous batching)")
    add_model_arguments(serve)
    add_tree_arguments(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("TALON_API_KEY"),
                       help="require 'Authorization: Bearer KEY' on /v1/* (default: $TALON_API_KEY, else open)")
    serve.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                       help=f"requests generated together, one verify forward for all (default {DEFAULT_MAX_BATCH}); "
                            "1: one at a time")
    serve.add_argument("--max-queue", type=int, default=64,
                       help="requests allowed to wait (the running ones not counted); more get HTTP 429")
    serve.add_argument("--max-model-len", type=int, default=None,
                       help="prompt + completion tokens per request (default and maximum: the target's context)")
    serve.add_argument("--served-model-name", default=None,
                       help="the model name clients send (default: the --target value)")
    serve.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    add_memory_argument(serve)
    serve.set_defaults(handler=run_serve)

    bench = commands.add_parser("bench-serve", help="load-test a local talon serve with concurrent streaming clients")
    bench.add_argument("--url", default="http://127.0.0.1:8000", help="the server (127.0.0.1 / localhost only)")
    bench.add_argument("--clients", type=int, default=4, help="concurrent streaming clients")
    bench.add_argument("--duration", type=float, default=30.0, help="seconds during which requests start")
    bench.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    bench.add_argument("--max-requests", type=int, default=None, help="stop after this many requests in all")
    bench.add_argument("--prompt", default="Write a Python function that reverses a string.")
    bench.add_argument("--datasets", default=None,
                       help="send the packaged benchmark prompts in turn instead of --prompt (all, or names: gsm8k,qa)")
    bench.add_argument("--ignore-eos", action="store_true", help="every completion exactly --max-tokens long")
    bench.add_argument("--api-key", default=os.environ.get("TALON_API_KEY"))
    bench.add_argument("--out", default=None, help="also write the report as JSON to this file")
    bench.set_defaults(handler=run_bench_serve)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..cli_common import make_generator, restore_controller_memory
    from ..controller_memory import save_memory
    from ..models import DEFAULT_TARGET
    from .app import ServerSettings, create_app
    from .engine import BatchedEngine, BatchOneEngine
    from .metrics import ServerMetrics
    from .scheduler import BatchScheduler, FifoScheduler

    _check_serve_args(args)
    log = _serve_logger(args.log_level)
    generator = make_generator(args)
    memory_key = restore_controller_memory(generator, args)  # what the last run learned (saved again at exit)
    max_batch = args.max_batch
    if max_batch > 1 and generator.target.layout.has_sliding:
        log.warning("talon serve: the target has sliding-window layers, which batched decoding does not support: "
                    "serving one request at a time")
        max_batch = 1
    engine = BatchedEngine(generator, args.max_model_len, max_batch) if max_batch > 1 \
        else BatchOneEngine(generator, args.max_model_len)
    _warm_up(generator, log)
    metrics = ServerMetrics()
    scheduler = BatchScheduler(engine, args.max_queue, metrics) if max_batch > 1 \
        else FifoScheduler(engine, args.max_queue, metrics)
    settings = ServerSettings(model_name=args.served_model_name or args.target or DEFAULT_TARGET,
                              server_tree=generator.tree_config, max_model_len=engine.max_model_len, api_key=args.api_key)
    log.info("talon serve: %s, tree %s, max_model_len %d, batch up to %d (FIFO, up to %d waiting), API key %s",
             settings.model_name, settings.server_tree.label, settings.max_model_len, max_batch, args.max_queue,
             "required" if args.api_key else "off")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        log.warning("talon serve: listening on %s with no --api-key: anyone who can reach it can use it", args.host)

    def remember() -> None:
        if memory_key is not None and save_memory(generator, memory_key) is not None:
            log.info("talon serve: saved what the budget controller learned for the next run")

    app = create_app(scheduler, metrics, settings, on_shutdown=remember)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS)
    return 0


def _check_serve_args(args: argparse.Namespace) -> None:
    if not 1 <= args.port <= 65535:
        raise bad_argument("port", args.port, "an integer in [1, 65535]")
    if args.max_batch < 1:
        raise bad_argument("max_batch", args.max_batch, "an integer >= 1")
    if args.max_queue < 1:
        raise bad_argument("max_queue", args.max_queue, "an integer >= 1")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise bad_argument("max_model_len", args.max_model_len, "an integer >= 2")
    if args.api_key is not None and not args.api_key.strip():
        raise bad_argument("api_key", args.api_key, "a non-empty key")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise bad_argument("served_model_name", args.served_model_name, "a non-empty name")


def _serve_logger(level: str) -> logging.Logger:
    log = logging.getLogger("talon_sd.serve")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level.upper())
    return log


def _warm_up(generator, log: logging.Logger) -> None:
    """A two-token generation, so that the first client does not pay for lazy initialisation."""
    try:
        generator.generate(input_ids=[0, 0], max_new_tokens=WARM_UP_TOKENS)
    except TalonError as error:
        log.warning("talon serve: warm-up skipped (%s)", error)


def run_bench_serve(args: argparse.Namespace) -> int:
    from .loadtest import LoadSettings, format_report, run_load_test

    settings = LoadSettings(url=args.url, clients=args.clients, duration=args.duration, max_tokens=args.max_tokens,
                            max_requests=args.max_requests, prompt=args.prompt, api_key=args.api_key,
                            ignore_eos=args.ignore_eos, datasets=args.datasets)
    report = run_load_test(settings)
    print(format_report(report))
    if args.out:
        path = pathlib.Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["errors"] == 0 else 1
