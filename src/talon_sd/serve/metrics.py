"""Prometheus metrics for one server, on its own :class:`CollectorRegistry` (no global registry, so
several apps can live in one process).

    talon_requests_total{endpoint, code}        HTTP responses by status code
    talon_requests_finished_total{finish_reason} completed generations (stop | length)
    talon_requests_cancelled_total              generations stopped because the client went away
    talon_queue_length                          requests waiting (the running one not counted)
    talon_running_requests                      requests being generated (in the batch)
    talon_time_to_first_token_seconds           arrival (queue time included) to the first text chunk
    talon_time_per_output_token_seconds         (last chunk - first chunk) / (completion tokens - 1)
    talon_prompt_tokens_total, talon_generated_tokens_total
    talon_verify_steps_total                    verify steps of completed requests (a batched forward counts once
                                                per request in it; the prefill not counted)
    talon_verified_rows_total                   tree nodes those steps verified (a plain step: 1)
    talon_draft_forwards_total
    talon_accepted_tokens_per_step              tokens committed per verify step, bonus token included
                                                (its mean is MAT)
    talon_draft_seconds_total, talon_verify_seconds_total
    process_resident_memory_bytes, ...          the process collector (Linux)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..generator import GenerationResult

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
STEP_BUCKETS = tuple(float(n) for n in range(1, 17))


class ServerMetrics:
    """Every collector of one server; the ``observe_*`` methods are safe to call from any thread."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        self.requests = Counter("talon_requests", "HTTP responses by endpoint and status code",
                                ["endpoint", "code"], registry=registry)
        self.finished = Counter("talon_requests_finished", "Completed generations by finish reason",
                                ["finish_reason"], registry=registry)
        self.cancelled = Counter("talon_requests_cancelled", "Generations stopped because the client went away",
                                 registry=registry)
        self.queue_length = Gauge("talon_queue_length", "Requests waiting in the FIFO queue", registry=registry)
        self.running = Gauge("talon_running_requests", "Requests being generated (in the batch)",
                             registry=registry)
        self.time_to_first_token = Histogram("talon_time_to_first_token_seconds",
                                             "Arrival (queue included) to the first text chunk",
                                             buckets=LATENCY_BUCKETS, registry=registry)
        self.time_per_output_token = Histogram("talon_time_per_output_token_seconds",
                                               "Seconds per completion token after the first",
                                               buckets=TOKEN_BUCKETS, registry=registry)
        self.prompt_tokens = Counter("talon_prompt_tokens", "Prompt tokens of completed requests", registry=registry)
        self.generated_tokens = Counter("talon_generated_tokens", "Completion tokens of completed requests",
                                        registry=registry)
        self.verify_steps = Counter("talon_verify_steps", "Target forwards over a draft tree", registry=registry)
        self.verified_rows = Counter("talon_verified_rows", "Tree nodes verified by those steps", registry=registry)
        self.draft_forwards = Counter("talon_draft_forwards", "Draft model forwards", registry=registry)
        self.accepted_per_step = Histogram("talon_accepted_tokens_per_step",
                                           "Tokens committed per verify step, bonus token included (mean = MAT)",
                                           buckets=STEP_BUCKETS, registry=registry)
        self.draft_seconds = Counter("talon_draft_seconds", "Seconds inside draft forwards", registry=registry)
        self.verify_seconds = Counter("talon_verify_seconds", "Seconds in target verification forwards",
                                      registry=registry)

    def observe_response(self, endpoint: str, code: int) -> None:
        self.requests.labels(endpoint=endpoint, code=str(code)).inc()

    def observe_queue(self, waiting: int, running: int) -> None:
        self.queue_length.set(waiting)
        self.running.set(running)

    def observe_cancelled(self) -> None:
        self.cancelled.inc()

    def observe_finished(self, result: GenerationResult, queued_at: float, first_chunk_at: float | None,
                         finished_at: float) -> None:
        """One completed generation; times are ``time.perf_counter()`` readings."""
        stats = result.stats.to_dict()
        self.finished.labels(finish_reason=result.finish_reason).inc()
        completion_tokens = len(result.token_ids)
        if first_chunk_at is not None:
            self.time_to_first_token.observe(first_chunk_at - queued_at)
            if completion_tokens > 1:
                self.time_per_output_token.observe((finished_at - first_chunk_at) / (completion_tokens - 1))
        self.prompt_tokens.inc(stats["prompt_tokens"])
        self.generated_tokens.inc(completion_tokens)
        self.verify_steps.inc(stats["target_forwards"])
        self.verified_rows.inc(sum(result.stats.tree_sizes))
        self.draft_forwards.inc(stats["draft_forwards"])
        for accepted, steps in stats["accepted_length_hist"].items():
            for _ in range(steps):
                self.accepted_per_step.observe(int(accepted) + 1)
        self.draft_seconds.inc(stats["seconds_draft"])
        self.verify_seconds.inc(stats["seconds_verify"])

    def render(self) -> bytes:
        """The Prometheus text exposition of every collector."""
        return generate_latest(self.registry)
