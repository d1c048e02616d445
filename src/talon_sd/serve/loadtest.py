"""``talon bench-serve``: N concurrent streaming clients against a local ``talon serve`` for a fixed time.

Each client sends one streaming chat completion after another (greedy, ``max_tokens`` each) until the
duration is up (no new request starts after it; the ones in flight finish) or ``max_requests`` have
been sent in all. The prompt is ``prompt``, or with ``datasets`` the packaged benchmark prompts in turn
(first turns, one request each, the clients taking the next one as they go). Only 127.0.0.1 / localhost /
::1 URLs are accepted: this is a load test of your own server. Reported:

    requests_per_s         completed requests / wall seconds
    ttft_p50_s, ttft_p95_s, ttft_p99_s
                           time from sending a request to its first text (queue time included)
    tpot_p50_s, tpot_p95_s per-token latency after the first: (last text - first text) / (tokens - 1)
    request_tokens_per_s_p50  one request's completion tokens / (its last text - its sending)
    output_tokens_per_s    completion tokens (from the usage chunk) / wall seconds
    rows_per_request_step  tree nodes verified per request per verify step, from the server's metrics
                           (1: plain decoding; counts the requests completed during the test)
    errors                 non-200 answers, error events, broken streams
    rss_before_bytes, rss_after_bytes  the server's resident memory from /metrics
                           (``process_resident_memory_bytes``), before the first and after the last request
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.parse
from dataclasses import asdict, dataclass, field

from ..errors import TalonError, bad_argument

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class LoadSettings:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    clients: int = 4
    duration: float = 30.0  # seconds during which new requests start
    max_tokens: int = 64
    max_requests: int | None = None  # stop starting requests after this many in all
    prompt: str = "Write a Python function that reverses a string."
    api_key: str | None = None
    ignore_eos: bool = False  # every completion exactly max_tokens long (talon extra)
    datasets: str | None = None  # e.g. "all" or "gsm8k,qa": the packaged prompts in turn instead of ``prompt``
    request_timeout: float = 600.0

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or parsed.hostname not in LOCAL_HOSTS:
            raise bad_argument("url", self.url, "http://127.0.0.1:PORT or http://localhost:PORT (local servers only)")
        for name, minimum in (("clients", 1), ("max_tokens", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise bad_argument(name, value, f"an integer >= {minimum}")
        if not isinstance(self.duration, (int, float)) or not 0 < self.duration <= 24 * 3600:
            raise bad_argument("duration", self.duration, "seconds in (0, 86400]")
        if self.max_requests is not None and (not isinstance(self.max_requests, int) or self.max_requests < 1):
            raise bad_argument("max_requests", self.max_requests, "an integer >= 1")
        if not self.prompt.strip():
            raise bad_argument("prompt", self.prompt, "a non-empty string")
        if self.datasets is not None:
            from ..bench.datasets import parse_dataset_names

            parse_dataset_names(self.datasets)

    def prompts(self) -> list[str]:
        """The prompts the clients take in turn."""
        if self.datasets is None:
            return [self.prompt]
        from ..bench.datasets import load_prompts, parse_dataset_names

        prompts = load_prompts(parse_dataset_names(self.datasets))
        by_dataset = {}
        for prompt in prompts:
            by_dataset.setdefault(prompt.dataset, []).append(prompt.turns[0])
        return [turn for group in zip(*by_dataset.values()) for turn in group]  # one of each dataset in turn


@dataclass
class RequestRecord:
    ok: bool
    ttft: float | None = None
    tpot: float | None = None
    tokens_per_s: float | None = None
    completion_tokens: int = 0
    error: str | None = None


@dataclass
class _Budget:
    """Shared by the clients: when to stop starting requests."""

    deadline: float
    remaining: int | None
    prompts: list[str]
    records: list[RequestRecord] = field(default_factory=list)
    sent: int = 0

    def take(self) -> str | None:
        """The next request's prompt, or None when no more requests start."""
        if time.perf_counter() >= self.deadline or self.remaining == 0:
            return None
        if self.remaining is not None:
            self.remaining -= 1
        self.sent += 1
        return self.prompts[(self.sent - 1) % len(self.prompts)]


def run_load_test(settings: LoadSettings) -> dict:
    """Run the load test; returns the report (see the module docstring)."""
    return asyncio.run(_run(settings))


async def _run(settings: LoadSettings) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    limits = httpx.Limits(max_connections=settings.clients + 2)
    timeout = httpx.Timeout(settings.request_timeout, connect=10.0)
    async with httpx.AsyncClient(base_url=settings.url.rstrip("/"), headers=headers, limits=limits,
                                 timeout=timeout, trust_env=False) as client:
        try:
            models = await client.get("/v1/models")
        except httpx.HTTPError as error:
            raise TalonError(f"url: cannot reach {settings.url} ({error!r})") from None
        if models.status_code != 200:
            raise TalonError(f"url: GET /v1/models answered {models.status_code}: {models.text[:200]}")
        model = models.json()["data"][0]["id"]
        prompts = settings.prompts()
        before = await _server_metrics(client)
        started = time.perf_counter()
        budget = _Budget(deadline=started + settings.duration, remaining=settings.max_requests, prompts=prompts)
        await asyncio.gather(*(_client(client, model, settings, budget) for _ in range(settings.clients)))
        elapsed = time.perf_counter() - started
        after = await _server_metrics(client)
    return _report(settings, model, budget.records, elapsed, before, after)


async def _client(client, model: str, settings: LoadSettings, budget: _Budget) -> None:
    while (prompt := budget.take()) is not None:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": settings.max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        if settings.ignore_eos:
            body["talon"] = {"ignore_eos": True}
        budget.records.append(await _one_request(client, body))


async def _one_request(client, body: dict) -> RequestRecord:
    import httpx

    sent = time.perf_counter()
    first = last = None
    completion_tokens = 0
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return RequestRecord(ok=False, error=f"HTTP {response.status_code}: {response.text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                payload = json.loads(data)
                if "error" in payload:
                    return RequestRecord(ok=False, error=str(payload["error"].get("message")))
                if payload.get("usage"):
                    completion_tokens = payload["usage"]["completion_tokens"]
                for choice in payload.get("choices", []):
                    if choice.get("delta", {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
            else:
                return RequestRecord(ok=False, error="the stream ended without data: [DONE]")
    except (httpx.HTTPError, ValueError) as error:
        return RequestRecord(ok=False, error=repr(error))
    ttft = None if first is None else first - sent
    tpot = (last - first) / (completion_tokens - 1) if first is not None and completion_tokens > 1 else None
    speed = completion_tokens / (last - sent) if last is not None and completion_tokens else None
    return RequestRecord(ok=True, ttft=ttft, tpot=tpot, tokens_per_s=speed, completion_tokens=completion_tokens)


SERVER_METRICS = ("process_resident_memory_bytes", "talon_verify_steps_total", "talon_verified_rows_total")


async def _server_metrics(client) -> dict[str, float]:
    """The server's samples named in SERVER_METRICS, from /metrics (absent where it has none)."""
    response = await client.get("/metrics")
    samples = {}
    for line in response.text.splitlines():
        name, _, value = line.partition(" ")
        if name in SERVER_METRICS:
            samples[name] = float(value)
    return samples


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in (0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _report(settings: LoadSettings, model: str, records: list[RequestRecord], elapsed: float,
            before: dict[str, float], after: dict[str, float]) -> dict:
    done = [record for record in records if record.ok]
    ttfts = [record.ttft for record in done if record.ttft is not None]
    tpots = [record.tpot for record in done if record.tpot is not None]
    speeds = [record.tokens_per_s for record in done if record.tokens_per_s is not None]
    steps = after.get("talon_verify_steps_total", 0) - before.get("talon_verify_steps_total", 0)
    rows = after.get("talon_verified_rows_total", 0) - before.get("talon_verified_rows_total", 0)
    rss_before, rss_after = before.get("process_resident_memory_bytes"), after.get("process_resident_memory_bytes")
    tokens = sum(record.completion_tokens for record in done)
    errors = [record.error for record in records if not record.ok]
    return {
        "url": settings.url, "model": model, "clients": settings.clients, "duration_s": round(elapsed, 3),
        "max_tokens": settings.max_tokens, "ignore_eos": settings.ignore_eos,
        "requests": len(done), "errors": len(errors), "error_examples": errors[:3],
        "requests_per_s": round(len(done) / elapsed, 4), "output_tokens_per_s": round(tokens / elapsed, 3),
        "completion_tokens": tokens,
        "ttft_p50_s": _round(percentile(ttfts, 0.5)), "ttft_p95_s": _round(percentile(ttfts, 0.95)),
        "ttft_p99_s": _round(percentile(ttfts, 0.99)),
        "tpot_p50_s": _round(percentile(tpots, 0.5)), "tpot_p95_s": _round(percentile(tpots, 0.95)),
        "request_tokens_per_s_p50": _round(percentile(speeds, 0.5)),
        "rows_per_request_step": round(rows / steps, 3) if steps else None,
        "rss_before_bytes": None if rss_before is None else int(rss_before),
        "rss_after_bytes": None if rss_after is None else int(rss_after),
        "settings": {key: value for key, value in asdict(settings).items() if key != "api_key"},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def format_report(report: dict) -> str:
    """The report as an aligned two-column table."""
    rows = [
        ("model", report["model"]), ("clients", report["clients"]), ("duration", f"{report['duration_s']:.1f} s"),
        ("max_tokens", report["max_tokens"]), ("requests", report["requests"]), ("errors", report["errors"]),
        ("requests/s", f"{report['requests_per_s']:.3f}"), ("output tokens/s", f"{report['output_tokens_per_s']:.1f}"),
        ("TTFT p50 / p95 / p99", f"{_milliseconds(report['ttft_p50_s'])} / {_milliseconds(report['ttft_p95_s'])} / "
                                 f"{_milliseconds(report['ttft_p99_s'])}"),
        ("per-token p50 / p95", f"{_milliseconds(report['tpot_p50_s'])} / {_milliseconds(report['tpot_p95_s'])}"),
        ("one request's tok/s p50", "n/a" if report["request_tokens_per_s_p50"] is None
         else f"{report['request_tokens_per_s_p50']:.2f}"),
        ("rows per request step", "n/a" if report["rows_per_request_step"] is None
         else f"{report['rows_per_request_step']:.2f}"),
        ("server RSS before / after", f"{_mebibytes(report['rss_before_bytes'])} / {_mebibytes(report['rss_after_bytes'])}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _milliseconds(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def _mebibytes(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:.1f} MiB"
