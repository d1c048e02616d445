"""The serving table: ``talon serve`` in four set-ups, each load-tested with ``talon bench-serve`` at several numbers
of concurrent clients, on the packaged pair and the packaged prompts.

    (a) batch 1      today's one-request-at-a-time server (``--max-batch 1``, budget auto)
    (b) plain        continuous batching, plain decoding (``--tree ar``)
    (c) fixed        continuous batching, TALON at a fixed budget per request (``--budget 4``)
    (d) shared       continuous batching, TALON with one verify budget shared by the batch (``--budget auto``)

Each set-up is one server process (``--fresh-controller``: it starts from nothing and learns as the load goes on),
load-tested at each client count in turn with ``--requests-per-client`` requests per client (greedy, the datasets'
first turns one after another, ``--max-tokens`` each, EOS kept). With ``--repeats R`` the set-ups run in turn R
times (interleaved, a new server each time) and the table gives each cell's median and its runs. Resumable: each
finished cell is written to ``OUT/results.json`` at once and skipped when the script runs again. Prints a markdown
table and writes ``OUT/rows_per_request.png`` (rows verified per request per step against clients).

    python scripts/serve_table.py --clients 1,2,4,8 --max-tokens 128 --out docs/bench/serve-epyc-bf16-int8
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import time

SETUPS = {
    "a": ("batch 1", ["--max-batch", "1"]),
    "b": ("plain", ["--tree", "ar"]),
    "c": ("fixed N=4", ["--tree", "talon", "--budget", "4"]),
    "d": ("shared auto", ["--tree", "talon", "--budget", "auto"]),
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(flags: list[str], extra: list[str], log: pathlib.Path) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "talon_sd.cli", "serve", "--port", str(port), "--fresh-controller", *extra, *flags]
    handle = open(log, "w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                               env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"talon serve exited with {process.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.kill()
    raise SystemExit(f"talon serve not ready after 600 s; see {log}")


def stop_server(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def cell_key(setup: str, clients: int, repeat: int) -> str:
    return f"{setup}/{clients}" if repeat == 0 else f"{setup}/{clients}/r{repeat}"


def median_cell(results: dict, setup: str, clients: int) -> dict | None:
    """The cell's reports over its repeats: medians of the figures, and the total tok/s of each run."""
    runs = [results[key] for key in results if key == f"{setup}/{clients}" or key.startswith(f"{setup}/{clients}/r")]
    if not runs:
        return None
    figures = ("output_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "request_tokens_per_s_p50", "rows_per_request_step")
    cell = {name: statistics.median(run[name] for run in runs) for name in figures}
    cell["runs"] = [run["output_tokens_per_s"] for run in runs]
    cell["requests"] = sum(run["requests"] for run in runs)
    return cell


def table(results: dict, setups: list[str], clients: list[int]) -> str:
    lines = ["| set-up | clients | total tok/s | x (a) | x (b) | TTFT p50 / p99 s | one request tok/s p50 | "
             "rows / request step | requests |", "|---|---|---|---|---|---|---|---|---|"]
    for key in setups:
        for count in clients:
            cell = median_cell(results, key, count)
            if cell is None:
                continue
            base = {other: median_cell(results, other, count) for other in ("a", "b")}
            ratio = {other: f"{cell['output_tokens_per_s'] / base[other]['output_tokens_per_s']:.2f}" if base[other]
                     else "-" for other in base}
            runs = f" ({' / '.join(f'{run:.2f}' for run in cell['runs'])})" if len(cell["runs"]) > 1 else ""
            lines.append(f"| ({key}) {SETUPS[key][0]} | {count} | {cell['output_tokens_per_s']:.2f}{runs} | "
                         f"{ratio['a']} | {ratio['b']} | {cell['ttft_p50_s']:.2f} / {cell['ttft_p99_s']:.2f} | "
                         f"{cell['request_tokens_per_s_p50']:.2f} | {cell['rows_per_request_step']:.2f} | "
                         f"{cell['requests']} |")
    return "\n".join(lines)


def plot(results: dict, setups: list[str], clients: list[int], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5.5, 3.5))
    for key in setups:
        points = [(count, median_cell(results, key, count)["rows_per_request_step"]) for count in clients
                  if median_cell(results, key, count) is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=f"({key}) {SETUPS[key][0]}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(clients, [str(count) for count in clients])
    axes.set_xlabel("concurrent clients")
    axes.set_ylabel("rows verified per request per step")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setups", default="a,b,c,d", help="some of a,b,c,d (module docstring)")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="run the set-ups in turn this many times")
    parser.add_argument("--datasets", default="all")
    parser.add_argument("--server-flags", default="", help="extra flags for every server, e.g. '--dtype float32'")
    parser.add_argument("--out", required=True, help="folder for results.json, the server logs and the plot")
    args = parser.parse_args(argv)
    from talon_sd.bench.machine import machine_info
    from talon_sd.serve.loadtest import LoadSettings, run_load_test

    setups, clients = args.setups.split(","), [int(count) for count in args.clients.split(",")]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    results = saved.get("cells", {})
    machine = saved.get("machine") or machine_info()
    command = "python scripts/serve_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for repeat in range(args.repeats):
        for key in setups:
            todo = [count for count in clients if cell_key(key, count, repeat) not in results]
            if not todo:
                continue
            process, url = start_server(SETUPS[key][1], args.server_flags.split(), out / f"server-{key}.log")
            try:
                for count in todo:
                    settings = LoadSettings(url=url, clients=count, duration=24 * 3600, max_tokens=args.max_tokens,
                                            max_requests=count * args.requests_per_client, datasets=args.datasets)
                    report = run_load_test(settings)
                    results[cell_key(key, count, repeat)] = report
                    path.write_text(json.dumps({"command": command, "machine": machine, "cells": results}, indent=1))
                    print(f"({key}) {count} clients, run {repeat + 1}: {report['output_tokens_per_s']:.2f} tok/s, "
                          f"TTFT p50 {report['ttft_p50_s']:.2f} s, rows/request step {report['rows_per_request_step']}, "
                          f"errors {report['errors']}", flush=True)
            finally:
                stop_server(process)
    print(f"{machine.get('cpu')} ({machine.get('isa')}), {machine.get('torch_threads')} threads; {command}")
    print(table(results, setups, clients))
    plot(results, setups, clients, out / "rows_per_request.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
