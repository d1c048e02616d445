"""``talon serve`` as a real process on 127.0.0.1, talked to with the official ``openai`` client and raw
HTTP: greedy output equal to ``talon generate``, concurrent streams, disconnects, API key, a full
queue, every bad input as an OpenAI error object (never a 500), metrics, the load test, shutdown.

Two servers start once for the module (tiny random Llama pair, float32 on the CPU): an open one
(``--max-model-len 4096``, continuous batching: the default ``--max-batch 8``) and a guarded one (``--api-key``,
``--max-queue 1``, ``--max-batch 1``: one request at a time).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from talon_sd import SpeculativeGenerator
from talon_sd.cli import main
from talon_sd.config import SamplingConfig
from talon_sd.generator import GenerationResult, TextStream
from talon_sd.stats import DecodeStats
from talon_sd.serve.engine import Generation, GenerationRequest
from talon_sd.serve.scheduler import BatchScheduler, Cancelled, Chunk, Failed, FifoScheduler, Finished, QueueFull, Started
from test_models import save_tiny_llama

MODEL_NAME = "qwen2.5-coder-1.5b-instruct"  # the default name, so the README snippets run as written
API_KEY = "test-secret"
CONTEXT = 8192  # the tiny models' max_position_embeddings (save_tiny_llama writes 128): room for long streams
MAX_MODEL_LEN = 4096  # the open server's --max-model-len
LONG = 4000  # max_tokens of a stream that must still be running seconds later (with ignore_eos)
TREE_FLAGS = ["--tree", "talon", "--budget", "8"]

# The README snippets, verbatim but for the port (8000 in the README).
README_CURL = """curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" \\
  -d '{"model": "qwen2.5-coder-1.5b-instruct", "messages": [{"role": "user", "content": "Write a Python function that reverses a string."}], "max_tokens": 64, "temperature": 0}'"""
README_PYTHON = """from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")  # any key unless --api-key is set
reply = client.chat.completions.create(
    model="qwen2.5-coder-1.5b-instruct", max_tokens=64, temperature=0,  # temperature 0 = greedy
    messages=[{"role": "user", "content": "Write a Python function that reverses a string."}])
print(reply.choices[0].message.content)
print(reply.talon)  # speculative stats: mean_accepted_tokens (bonus token included), verify_steps, ...
for chunk in client.chat.completions.create(
        model="qwen2.5-coder-1.5b-instruct", max_tokens=64, temperature=0, stream=True,
        messages=[{"role": "user", "content": "Write a Python function that reverses a string."}]):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
"""


# ---------------------------------------------------------------------------------------------- servers
@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: pathlib.Path

    def wait_ready(self, timeout: float = 180.0) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"talon serve exited with {self.process.returncode}:\n{self.log_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"talon serve not ready after {timeout} s:\n{self.log_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample as ``name{label="value",...}`` -> value."""
        samples = {}
        for family in text_string_to_metric_families(httpx.get(f"{self.url}/metrics", timeout=10).text):
            for sample in family.samples:
                labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
                samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return samples


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spawn_server(folders: dict, root: pathlib.Path, name: str, *extra: str) -> Server:
    port = free_port()
    log = root / f"{name}.log"
    command = [sys.executable, "-m", "talon_sd.cli", "serve", "--target", folders["target"], "--draft", folders["draft"],
               "--dtype", "float32", "--device", "cpu", "--cpu-kernels", "packed", "--threads", "1", *TREE_FLAGS,
               "--port", str(port),
               "--served-model-name", MODEL_NAME, *extra]
    env = {**os.environ, "TALON_SD_CACHE": str(root / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    env.pop("TALON_API_KEY", None)
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return Server(process, f"http://127.0.0.1:{port}", log)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-models")
    result = {}
    for name, seed in (("target", 0), ("draft", 1)):
        folder = save_tiny_llama(root / name, vocab=64, seed=seed)
        config = json.loads((folder / "config.json").read_text())
        config["max_position_embeddings"] = CONTEXT
        (folder / "config.json").write_text(json.dumps(config))
        result[name] = str(folder)
    return result


@pytest.fixture(scope="module")
def servers(folders, tmp_path_factory):
    """Both servers, started side by side (each loads its models once)."""
    root = tmp_path_factory.mktemp("serve-run")
    started = {
        "open": spawn_server(folders, root, "open", "--max-model-len", str(MAX_MODEL_LEN), "--max-queue", "32"),
        "guarded": spawn_server(folders, root, "guarded", "--api-key", API_KEY, "--max-queue", "1", "--max-batch", "1"),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def server(servers) -> Server:
    return servers["open"]


@pytest.fixture(scope="module")
def guarded(servers) -> Server:
    return servers["guarded"]


@pytest.fixture(scope="module")
def oracle(folders):
    """Plain greedy decoding (the ``ar`` tree) in this process: what every greedy request must return."""
    generator = SpeculativeGenerator(folders["target"], None, tree="ar", dtype="float32", device="cpu",
                                     cpu_kernels="packed")  # the servers' kernels: the same arithmetic

    def complete(content: str, max_tokens: int) -> str:
        return generator.generate([{"role": "user", "content": content}], max_new_tokens=max_tokens).text

    return complete


def client_for(server: Server, api_key: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=60)


def open_stream(response: httpx.Response):
    """Read up to the first ``data:`` event; returns the line iterator, which the caller must keep: an
    abandoned iterator is closed, and httpx then closes the connection (a disconnect)."""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data: "):
            return lines
    pytest.fail("the stream ended before its first event")


def chat_body(content: str = "w3 w4 w5", **fields) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}], "temperature": 0, **fields}


# ---------------------------------------------------------------------------------------------- behaviour
def test_models_endpoint_lists_the_served_model(server):
    models = client_for(server).models.list()
    assert [model.id for model in models.data] == [MODEL_NAME]
    assert models.data[0].max_model_len == MAX_MODEL_LEN


def test_greedy_output_equals_talon_generate(server, folders, capsys):
    client = client_for(server)
    prompt = "w3 w4 w5 w3 w4"
    for raw, call in ((True, "completions"), (False, "chat")):
        cli_args = ["generate", prompt, "--target", folders["target"], "--draft", folders["draft"], "--dtype", "float32",
                    "--device", "cpu", "--cpu-kernels", "packed", "--max-new-tokens", "16", "--json", *TREE_FLAGS]
        assert main(cli_args + (["--no-chat-template"] if raw else [])) == 0
        expected = json.loads(capsys.readouterr().out)
        if call == "completions":
            reply = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0)
            text = reply.choices[0].text
            streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
                model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0, stream=True) if chunk.choices)
        else:
            messages = [{"role": "user", "content": prompt}]
            reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0)
            text = reply.choices[0].message.content
            streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0, stream=True) if chunk.choices)
        assert text == streamed == expected["text"], call
        assert reply.usage.completion_tokens == len(expected["token_ids"]), call
        assert reply.choices[0].finish_reason == expected["finish_reason"], call


def test_stream_has_role_chunks_stats_and_usage(server, oracle):
    chunks = list(client_for(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "w7 w8 w9"}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({chunk.id for chunk in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == oracle("w7 w8 w9", 12)
    finishing = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason in ("stop", "length")
    stats = finishing[0].talon
    assert stats["bonus_token_counted"] is True and stats["mean_accepted_tokens"] >= 1.0
    assert stats["verify_steps"] >= 1 and stats["method"].startswith("talon(N=8")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert chunks[-1].usage.total_tokens == chunks[-1].usage.prompt_tokens + chunks[-1].usage.completion_tokens


def test_non_stream_response_has_openai_shape_and_talon_stats(server):
    response = httpx.post(f"{server.url}/v1/chat/completions", json=chat_body(max_tokens=8), timeout=60)
    assert response.status_code == 200
    payload = response.json()
    assert payload["object"] == "chat.completion" and payload["id"].startswith("chatcmpl-")
    assert payload["model"] == MODEL_NAME and isinstance(payload["created"], int)
    assert payload["choices"][0]["message"]["role"] == "assistant"
    stats = payload["talon"]
    assert set(stats) >= {"mean_accepted_tokens", "bonus_token_counted", "draft_forwards_per_verify",
                          "acceptance_per_depth", "tokens_per_second", "verify_steps", "method"}
    hist = stats["accepted_length_hist"]
    # MAT counts the bonus token: committed tokens per verify step = mean(accepted + 1)
    committed = sum((int(accepted) + 1) * steps for accepted, steps in hist.items())
    assert stats["mean_accepted_tokens"] == pytest.approx(committed / stats["verify_steps"], abs=1e-3)


def test_stop_string_ends_the_text_before_it(server, oracle):
    full = oracle("w3 w4 w5", 16)
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[2]
    reply = client_for(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "w3 w4 w5"}], max_tokens=16, temperature=0, stop=[stop])
    assert reply.choices[0].message.content == full[:full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_temperature_defaults_to_1(server):
    client = client_for(server)
    messages = [{"role": "user", "content": "w3 w4 w5"}]
    texts = [client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, seed=7, **options)
             .choices[0].message.content for options in ({"temperature": 1.0}, {"temperature": 1.0}, {})]
    assert texts[0] == texts[1] == texts[2]  # same seed, same text; no temperature means 1 (sampling)
    greedy = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=0, seed=7)
    unseeded = [client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=1.0)
                for _ in range(3)]
    assert len({r.choices[0].message.content for r in unseeded} | {greedy.choices[0].message.content}) > 1
    assert greedy.talon["seed"] is None
    drawn = unseeded[0].talon["seed"]  # a request without a seed gets one drawn, which reproduces its text
    again = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16, temperature=1.0, seed=drawn)
    assert again.choices[0].message.content == unseeded[0].choices[0].message.content


def test_a_seed_gives_the_same_text_at_every_budget_and_beside_other_requests(server):
    """Sampling draws each position's token with noise keyed by (seed, position): requests with the same seed give
    the same text whatever tree and budget they ask for, sent at once beside requests of other seeds."""
    from concurrent.futures import ThreadPoolExecutor

    client = client_for(server)
    messages = [{"role": "user", "content": "w3 w4 w5 w3"}]
    trees = [{"tree": "ar"}, {"tree": "talon", "budget": 4}, {"tree": "talon", "budget": 24}, {"tree": "talon"},
             {"tree": "eagle", "budget": 12}, {"tree": "chain", "depth": 3}]
    jobs = [(seed, tree) for tree in trees for seed in (11, 12)]

    def ask(job):
        seed, tree = job
        reply = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=24, temperature=0.9,
                                               top_p=0.95, seed=seed, extra_body={"talon": tree})
        assert reply.talon["seed"] == seed
        return seed, reply.choices[0].message.content

    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(ask, jobs))
    by_seed = {seed: {text for s, text in texts if s == seed} for seed in (11, 12)}
    assert len(by_seed[11]) == 1 and len(by_seed[12]) == 1, by_seed
    assert by_seed[11] != by_seed[12]


def test_ten_concurrent_streams_each_get_their_own_greedy_text(server, oracle):
    prompts = [f"w{index} w{index + 3} w{index + 7}" for index in range(3, 13)]  # 10 streams

    async def one(client: AsyncOpenAI, prompt: str) -> str:
        stream = await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0, stream=True)
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])

    async def all_of_them() -> list[str]:
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
            return await asyncio.gather(*(one(client, prompt) for prompt in prompts))

    texts = asyncio.run(all_of_them())
    assert texts == [oracle(prompt, 12) for prompt in prompts]
    assert len(set(texts)) > 1  # the prompts lead to different texts: a mix-up would show


def test_batched_requests_with_their_own_trees_lengths_and_stops_get_their_own_text_and_stats(server, oracle):
    """Sent at once, they run in one batch: each text is its prompt's plain greedy text, cut at its own length and
    stop string; each reply's stats are its own tree's."""
    from concurrent.futures import ThreadPoolExecutor

    stopped = oracle("w6 w2 w9", 20)
    stop = " " + stopped.split()[3]
    jobs = [("w3 w4 w5", 5, {"tree": "ar"}, None), ("w4 w6 w8", 17, {"tree": "talon", "budget": 4}, None),
            ("w5 w9 w3", 9, {"tree": "talon"}, None), ("w6 w2 w9", 20, {"tree": "chain", "depth": 3}, [stop]),
            ("w7 w3 w9", 11, {"tree": "eagle", "budget": 12}, None), ("w8 w8 w3", 3, {}, None)]

    def ask(job):
        prompt, max_tokens, tree, stops = job
        return client_for(server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stop=stops, extra_body={"talon": tree})

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        replies = list(pool.map(ask, jobs))
    for (prompt, max_tokens, tree, stops), reply in zip(jobs, replies):
        expected = oracle(prompt, max_tokens)
        text = reply.choices[0].message.content
        assert text == (expected[:expected.index(stop)] if stops else expected), prompt
        assert reply.usage.completion_tokens <= max_tokens
        assert reply.talon["method"].startswith(tree.get("tree", "talon")), (tree, reply.talon["method"])
    assert replies[0].talon["mean_accepted_tokens"] == 1.0  # the plain one verified one token a step
    assert replies[3].choices[0].finish_reason == "stop" and replies[0].choices[0].finish_reason == "length"


def test_a_request_joins_a_running_batch_and_ends_before_it(server, oracle):
    """Continuous batching: a short request sent while a long stream runs is answered at once (one at a time, it
    would wait for the long one's 4,000 tokens), with its own greedy text; the long one goes on."""
    body = chat_body(max_tokens=LONG, stream=True, talon={"ignore_eos": True})
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as running:
        lines = open_stream(running)
        reply = client_for(server).chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "w9 w4 w7"}], max_tokens=10, temperature=0)
        assert reply.choices[0].message.content == oracle("w9 w4 w7", 10)
        assert server.metrics()["talon_running_requests"] == 1  # the long stream is still in the batch
        assert next(line for line in lines if line.startswith("data: "))  # and still streaming
        del lines


def test_client_disconnect_cancels_the_generation(server, oracle):
    before = server.metrics()
    body = chat_body(max_tokens=LONG, stream=True, talon={"ignore_eos": True})
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        open_stream(response)
    # the connection is closed: the worker stops at its next chunk, not after LONG tokens
    deadline = time.monotonic() + 30
    while server.metrics()["talon_requests_cancelled_total"] <= before["talon_requests_cancelled_total"]:
        assert time.monotonic() < deadline, "the disconnected request was never cancelled"
        time.sleep(0.1)
    after = server.metrics()
    assert sum(value for key, value in after.items() if key.startswith("talon_requests_finished_total")) == \
        sum(value for key, value in before.items() if key.startswith("talon_requests_finished_total"))
    reply = client_for(server).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "w3 w4 w5"}], max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == oracle("w3 w4 w5", 12)


LONG_PROMPT = " ".join(["w5"] * (MAX_MODEL_LEN + 10))
BAD_REQUESTS = [
    # (id, path, json body or raw text, status, param, code)
    ("malformed-json", "chat", "{not json", 400, None, None),
    ("body-is-a-list", "chat", "[1, 2]", 400, None, None),
    ("missing-messages", "chat", {"model": MODEL_NAME}, 400, "messages", None),
    ("empty-messages", "chat", {"messages": []}, 400, "messages", None),
    ("message-without-role", "chat", {"messages": [{"content": "w3"}]}, 400, "messages[0].role", None),
    ("image-content", "chat", chat_body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400,
     "messages[0].content", None),
    ("temperature-string", "chat", chat_body(temperature="hot"), 400, "temperature", None),
    ("temperature-negative", "chat", chat_body(temperature=-1), 400, "temperature", None),
    ("temperature-nan", "chat", '{"messages": [{"role": "user", "content": "w3"}], "temperature": NaN}', 400,
     "temperature", None),
    ("top-p-zero", "chat", chat_body(top_p=0), 400, "top_p", None),
    ("max-tokens-zero", "chat", chat_body(max_tokens=0), 400, "max_tokens", None),
    ("max-tokens-negative", "completions", {"prompt": "w3", "max_tokens": -5}, 400, "max_tokens", None),
    ("max-completion-tokens-zero", "chat", chat_body(max_completion_tokens=0), 400, "max_completion_tokens", None),
    ("max-tokens-past-context", "chat", chat_body(max_tokens=10**6), 400, "max_tokens", "context_length_exceeded"),
    ("prompt-past-context", "completions", {"prompt": LONG_PROMPT}, 400, "prompt", "context_length_exceeded"),
    ("messages-past-context", "chat", chat_body(LONG_PROMPT), 400, "messages", "context_length_exceeded"),
    ("n-two", "chat", chat_body(n=2), 400, "n", None),
    ("seed-negative", "chat", chat_body(seed=-1), 400, "seed", None),
    ("seed-huge", "chat", chat_body(seed=2**64), 400, "seed", None),
    ("stop-empty", "chat", chat_body(stop=[""]), 400, "stop", None),
    ("stop-wrong-type", "chat", chat_body(stop=[1]), 400, "stop", None),
    ("logprobs", "chat", chat_body(logprobs=True), 400, "logprobs", None),
    ("unknown-model", "chat", chat_body(model="gpt-5"), 404, "model", "model_not_found"),
    ("talon-budget", "chat", chat_body(talon={"budget": 1}), 400, "talon.budget", None),
    ("talon-tree", "chat", chat_body(talon={"tree": "beam"}), 400, "talon.tree", None),
    ("talon-typo", "chat", chat_body(talon={"budgt": 8}), 400, "talon.budgt", None),
    ("talon-mu", "completions", {"prompt": "w3", "talon": {"mu": 2.0}}, 400, "talon.mu", None),
    ("empty-prompt", "completions", {"prompt": "  "}, 400, "prompt", None),
    ("two-prompts", "completions", {"prompt": ["w3", "w4"]}, 400, "prompt", None),
    ("token-id-out-of-range", "completions", {"prompt": [3, 999]}, 400, "prompt", None),
    ("stream-with-bad-input", "chat", chat_body(stream=True, temperature=-1), 400, "temperature", None),
]


@pytest.mark.parametrize("path,body,status,param,code", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_input_is_an_openai_error_object(server, path, body, status, param, code):
    url = f"{server.url}/v1/{'chat/completions' if path == 'chat' else 'completions'}"
    if isinstance(body, str):
        response = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    else:
        response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["code"] == code, error
    assert error["message"] and "Traceback" not in response.text
    if param is not None:
        assert error["message"].startswith(f"{param}:"), error["message"]


def test_unknown_route_and_method_are_error_objects(server):
    missing = httpx.get(f"{server.url}/v2/nothing", timeout=10)
    wrong_method = httpx.get(f"{server.url}/v1/chat/completions", timeout=10)
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert set(missing.json()["error"]) == set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics_cover_requests_latency_tokens_and_memory(server):
    client_for(server).completions.create(model=MODEL_NAME, prompt="w9 w10", max_tokens=6, temperature=0)
    httpx.post(f"{server.url}/v1/completions", json={"prompt": "w3", "n": 3}, timeout=10)
    samples = server.metrics()
    assert samples['talon_requests_total{code="200",endpoint="/v1/completions"}'] >= 1
    assert samples['talon_requests_total{code="400",endpoint="/v1/completions"}'] >= 1
    assert not any(key.startswith("talon_requests_total") and 'code="500"' in key for key in samples)
    assert samples["talon_time_to_first_token_seconds_count"] >= 1
    assert samples["talon_time_per_output_token_seconds_count"] >= 1
    assert samples["talon_generated_tokens_total"] >= 6
    assert samples["talon_verify_steps_total"] >= 1
    assert samples["talon_verified_rows_total"] >= samples["talon_verify_steps_total"]  # a tree of 1 or more each
    assert samples["talon_accepted_tokens_per_step_count"] == samples["talon_verify_steps_total"]
    assert samples["talon_accepted_tokens_per_step_sum"] >= samples["talon_verify_steps_total"]  # bonus token counted
    assert samples["talon_draft_seconds_total"] > 0 and samples["talon_verify_seconds_total"] > 0
    assert samples["talon_queue_length"] == 0 and samples["talon_running_requests"] == 0
    assert samples["process_resident_memory_bytes"] > 10 * 2**20


def test_readme_snippets_run_as_written(server):
    port = server.url.rsplit(":", 1)[1]
    python = subprocess.run([sys.executable, "-c", README_PYTHON.replace("8000", port)], capture_output=True,
                            text=True, timeout=120)
    assert python.returncode == 0, python.stderr
    assert "mean_accepted_tokens" in python.stdout and "bonus_token_counted" in python.stdout
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed (the Python snippet passed)")
    curl = subprocess.run(["bash", "-c", README_CURL.replace("8000", port)], capture_output=True, text=True, timeout=120)
    assert curl.returncode == 0, curl.stderr
    payload = json.loads(curl.stdout)
    assert payload["object"] == "chat.completion" and payload["choices"][0]["message"]["content"]


def test_docs_show_the_snippets_tested_here():
    root = pathlib.Path(__file__).resolve().parents[1]
    serving = (root / "docs" / "SERVING.md").read_text()
    assert README_CURL in serving and README_PYTHON in serving
    readme = (root / "README.md").read_text()
    if "/v1/chat/completions" in readme:  # where the README shows how to call the server, these are its snippets
        assert README_CURL in readme and README_PYTHON in readme


def test_bench_serve_reports_latency_throughput_and_memory(server, tmp_path, capsys):
    out = tmp_path / "load.json"
    assert main(["bench-serve", "--url", server.url, "--clients", "2", "--duration", "2", "--max-tokens", "8",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == 0 and report["requests"] >= 2
    for key in ("requests_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "tpot_p50_s", "tpot_p95_s",
                "request_tokens_per_s_p50"):
        assert report[key] is not None and report[key] > 0, key
    assert report["ttft_p50_s"] <= report["ttft_p95_s"] <= report["ttft_p99_s"]
    assert report["tpot_p50_s"] <= report["tpot_p95_s"]
    assert report["rows_per_request_step"] >= 1.0  # the server's tree: talon N = 8
    assert report["rss_before_bytes"] > 0 and report["rss_after_bytes"] > 0
    assert "TTFT p50 / p95" in capsys.readouterr().out


def test_bench_serve_refuses_remote_urls_and_unknown_datasets():
    assert main(["bench-serve", "--url", "http://example.com:8000", "--duration", "1"]) == 2
    assert main(["bench-serve", "--datasets", "nosuch", "--duration", "1"]) == 2


def test_bench_serve_sends_the_datasets_prompts_in_turn():
    from talon_sd.serve.loadtest import LoadSettings

    prompts = LoadSettings(url="http://127.0.0.1:1", datasets="gsm8k,qa").prompts()
    assert len(prompts) >= 2 and len(set(prompts)) == len(prompts)
    assert prompts[0] != prompts[1]  # one of each dataset in turn


# ---------------------------------------------------------------------------------------------- guarded server
def test_api_key_is_required_when_set(guarded):
    body = chat_body(max_tokens=2)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(f"{guarded.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert response.status_code == 401, headers
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{guarded.url}/v1/models", timeout=10).status_code == 401
    reply = client_for(guarded, API_KEY).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "w3"}], max_tokens=2, temperature=0)
    assert reply.usage.completion_tokens >= 1
    assert httpx.get(f"{guarded.url}/health", timeout=10).status_code == 200  # health and metrics stay open


def test_full_queue_answers_429_and_a_client_leaving_the_queue_frees_its_place(guarded):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = f"{guarded.url}/v1/chat/completions"
    before = guarded.metrics()

    def wait_for(condition, what: str) -> dict:
        deadline = time.monotonic() + 30
        while not condition(samples := guarded.metrics()):
            assert time.monotonic() < deadline, what
            time.sleep(0.05)
        return samples

    with httpx.Client(headers=headers, timeout=60) as client:
        long_body = chat_body(max_tokens=LONG, stream=True, talon={"ignore_eos": True})
        with client.stream("POST", url, json=long_body) as running:
            assert running.status_code == 200
            running_lines = open_stream(running)  # on the worker, and kept open while we hold the lines
            queued = {}

            def queued_request() -> None:  # waits in the queue, then gives up (closes its connection)
                try:
                    queued["status"] = httpx.post(url, json=chat_body(max_tokens=4), headers=headers, timeout=1.5).status_code
                except httpx.TimeoutException:
                    queued["status"] = "timed out"

            waiter = threading.Thread(target=queued_request, daemon=True)
            waiter.start()
            wait_for(lambda samples: samples["talon_queue_length"] >= 1, "the second request never queued")
            refused = client.post(url, json=chat_body(max_tokens=4))
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "queue_full" and refused.json()["error"]["type"]
            waiter.join(timeout=30)
            assert queued == {"status": "timed out"}
            samples = wait_for(lambda samples: samples["talon_queue_length"] == 0, "the leaving client kept its place")
            assert samples["talon_running_requests"] == 1  # the long stream is still being generated
            assert samples["talon_requests_cancelled_total"] == before["talon_requests_cancelled_total"] + 1
            del running_lines
        # the long stream is closed too: it is cancelled and the worker is free again
        wait_for(lambda samples: samples["talon_requests_cancelled_total"] == before["talon_requests_cancelled_total"] + 2,
                 "the closed stream was never cancelled")
        assert client.post(url, json=chat_body(max_tokens=4)).status_code == 200
    samples = guarded.metrics()
    assert samples['talon_requests_total{code="429",endpoint="/v1/chat/completions"}'] == 1
    assert samples['talon_requests_total{code="499",endpoint="/v1/chat/completions"}'] == 1  # the one that left


def test_sigterm_stops_the_worker_and_the_process(guarded):
    """Runs last on the guarded server: SIGTERM during a stream ends the process within the grace period."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = chat_body(max_tokens=LONG, stream=True, talon={"ignore_eos": True})
    with httpx.stream("POST", f"{guarded.url}/v1/chat/completions", json=body, headers=headers, timeout=60) as response:
        lines = open_stream(response)
        guarded.process.send_signal(signal.SIGTERM)
        guarded.process.wait(timeout=30)
        del lines
    assert guarded.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it is done    assert "worker stopped" in guarded.log_text()
    assert "Traceback" not in guarded.log_text()


def test_an_auto_budget_server_continues_what_the_last_one_learned(folders, tmp_path):
    """At shutdown the server saves its budget controller; the next server on the same machine and models
    starts from it (its steps go on counting) unless --fresh-controller."""
    import json

    steps = []
    for run, extra in enumerate(([], [], ["--fresh-controller"])):
        server = spawn_server(folders, tmp_path, f"auto{run}", "--budget", "auto", *extra).wait_ready()
        try:
            reply = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL_NAME, "prompt": "w3 w4 w5 w3 w4",
                                                                     "max_tokens": 24, "temperature": 0}, timeout=60)
            assert reply.status_code == 200, reply.text
        finally:
            server.stop()
        assert server.process.returncode in (0, -signal.SIGINT, 130), server.log_text()[-2000:]
        files = list((tmp_path / "cache" / "controllers").glob("*.json"))
        assert len(files) == 1, server.log_text()[-2000:]
        [row] = [row for row in json.loads(files[0].read_text())["controllers"] if not row["sampled"]]
        steps.append(row["state"]["costs"][0]["adds"])
        assert ("saved what the budget controller learned" in server.log_text()) == (not extra)
    assert steps[1] > steps[0]  # the second server went on from the first one's steps
    assert steps[2] == steps[1]  # --fresh-controller neither read nor wrote the memory


# ---------------------------------------------------------------------------------------------- no server
class _ScriptedEngine:
    """A fake engine: each generation yields "a", " b" once the test sets ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[str] = []

    def start(self, request: GenerationRequest) -> Generation:
        self.started.append(request.prompt)
        stream = TextStream(chunks=iter(()))

        def words():
            for word in ("a", " b"):
                self.release.wait(10)
                yield word
            stream.result = GenerationResult(text="a b", token_ids=[5, 6], stats=DecodeStats(), finish_reason="length")

        stream.chunks = words()
        return Generation(prompt_tokens=1, max_new_tokens=2, stream=stream)


def _request(prompt: str) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_new_tokens=2, sampling=SamplingConfig())


def test_scheduler_is_fifo_refuses_past_max_queue_and_drops_cancelled_waiters():
    engine = _ScriptedEngine()

    async def scenario() -> dict:
        scheduler = FifoScheduler(engine, max_queue=2)
        scheduler.start()
        first = scheduler.submit(_request("first"))
        first_events = aiter(first)
        assert isinstance(await anext(first_events), Started)  # on the worker, waiting for release
        second, third = scheduler.submit(_request("second")), scheduler.submit(_request("third"))
        with pytest.raises(QueueFull):
            scheduler.submit(_request("fourth"))
        second.cancel()
        assert scheduler.waiting == 1  # the cancelled one left the queue at once
        scheduler.submit(_request("fifth"))  # so there is room again
        engine.release.set()
        events = {"first": [type(event) async for event in first_events],
                  "second": [type(event) async for event in second],
                  "third": [type(event) async for event in third]}
        assert scheduler.stop()
        return events

    events = asyncio.run(scenario())
    assert events["first"] == [Chunk, Chunk, Finished]
    assert events["second"] == [Cancelled]
    assert events["third"] == [Started, Chunk, Chunk, Finished]
    assert engine.started[:2] == ["first", "third"]  # FIFO; the cancelled one never reached the engine
    assert "second" not in engine.started


def test_serve_table_script_runs_the_set_ups_and_resumes(folders, tmp_path):
    """scripts/serve_table.py on the tiny pair: a server per set-up, a cell per client count, a table, a plot; run
    again, it keeps the finished cells and starts no server."""
    script = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "serve_table.py"
    flags = f"--target {folders['target']} --draft {folders['draft']} --dtype float32 --device cpu --threads 1"
    command = [sys.executable, str(script), "--setups", "b,d", "--clients", "1,2", "--max-tokens", "6",
               "--requests-per-client", "1", "--datasets", "mt_bench", "--server-flags", flags, "--out", str(tmp_path)]
    env = {**os.environ, "TALON_SD_CACHE": str(tmp_path / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    cells = json.loads((tmp_path / "results.json").read_text())["cells"]
    assert sorted(cells) == ["b/1", "b/2", "d/1", "d/2"]
    assert all(cell["errors"] == 0 and cell["requests"] == int(key[-1]) for key, cell in cells.items())
    assert cells["b/1"]["rows_per_request_step"] == 1.0  # plain decoding verifies one row a step
    assert "| (d) shared auto | 2 |" in first.stdout and (tmp_path / "rows_per_request.png").stat().st_size > 0
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "clients, run" not in again.stdout  # nothing run again
    assert json.loads((tmp_path / "results.json").read_text())["cells"] == cells


class _FailingBatchEngine:
    """A fake batched engine whose first step fails; each later step ends every request with "a"."""

    max_batch = 4

    def __init__(self) -> None:
        self.running, self.steps, self.resets = [], 0, 0

    def join(self, request: GenerationRequest):
        from types import SimpleNamespace

        running = SimpleNamespace(prompt_tokens=1, max_new_tokens=2)
        self.running.append(running)
        return running

    def step(self):
        self.steps += 1
        if self.steps == 1:
            raise RuntimeError("the step failed")
        result = GenerationResult(text="a", token_ids=[5], stats=DecodeStats(), finish_reason="length")
        updates, self.running = [(running, "a", result) for running in self.running], []
        return updates

    def drop(self, running) -> None:
        pass

    def reset(self) -> None:
        self.resets += 1
        self.running = []


def test_a_failed_batch_step_fails_its_requests_and_the_next_ones_run():
    engine = _FailingBatchEngine()

    async def scenario() -> tuple[list, list]:
        scheduler = BatchScheduler(engine, max_queue=4)
        scheduler.start()
        failed = [type(event) async for event in scheduler.submit(_request("first"))]
        served = [type(event) async for event in scheduler.submit(_request("second"))]
        assert scheduler.stop()
        return failed, served

    failed, served = asyncio.run(scenario())
    assert failed == [Started, Failed] and engine.resets == 1
    assert served == [Started, Chunk, Finished]


def test_engine_never_imports_the_server():
    package = pathlib.Path(__file__).resolve().parents[1] / "src" / "talon_sd"
    for path in package.rglob("*.py"):
        relative = path.relative_to(package)
        if relative.parts[0] == "serve" or relative == pathlib.Path("cli.py"):
            continue  # the server itself, and the command line that registers it
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            assert not any(name == "serve" or name.startswith(("serve.", "talon_sd.serve")) or
                           name in ("fastapi", "uvicorn") for name in names), f"{relative} imports {names}"
