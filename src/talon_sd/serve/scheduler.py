"""A FIFO queue served by one worker thread that owns the engine: one request at a time
(:class:`FifoScheduler`), or up to ``max_batch`` together with continuous batching (:class:`BatchScheduler`).

The interface the HTTP layer sees, the same for both::

    ticket = scheduler.submit(request)    # on the event loop; raises QueueFull when the queue is full
    async for event in ticket: ...        # Started, then Chunk..., then Finished | Failed | Cancelled
    ticket.cancel()                       # any time, from the event loop; idempotent

Threads: the event loop only appends to the queue and reads events; every engine call (tokenizing,
forwards) runs on the worker thread, which hands events back with ``loop.call_soon_threadsafe``.
The event loop therefore never waits on a forward.

Cancellation: a cancelled ticket still in the queue is removed from it at once; a running one is
stopped by the worker, which checks the flag after every text chunk (at most one verify step of
work) and then releases its caches. ``max_queue`` counts the requests waiting, not the running ones.

Continuous batching: between two verify steps of the batch the worker takes at most one waiting request
into it (its prefill is the only pause the running requests see: prefills are bounded to one a step),
drops the cancelled ones, then runs the step and hands every request its new text.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

from ..generator import GenerationResult
from .engine import BatchedEngine, BatchOneEngine, GenerationRequest, Running

if TYPE_CHECKING:
    from .metrics import ServerMetrics

LOG = logging.getLogger("talon_sd.serve")


class QueueFull(Exception):
    """The queue already holds ``max_queue`` waiting requests."""


class ShuttingDown(Exception):
    """The server is stopping; the request was not run (or not finished)."""


@dataclass(frozen=True)
class Started:
    """The request left the queue and its prompt was accepted."""

    prompt_tokens: int
    max_new_tokens: int


@dataclass(frozen=True)
class Chunk:
    text: str


@dataclass(frozen=True)
class Finished:
    result: GenerationResult  # text, token ids, finish_reason, stats


@dataclass(frozen=True)
class Failed:
    error: Exception  # TalonError: a bad request; ShuttingDown; anything else: an engine failure


@dataclass(frozen=True)
class Cancelled:
    pass


Event = Started | Chunk | Finished | Failed | Cancelled
FINAL_EVENTS = (Finished, Failed, Cancelled)


class Ticket:
    """One submitted request: an async iterator of its events, and :meth:`cancel`."""

    def __init__(self, number: int, request: GenerationRequest, scheduler: "FifoScheduler") -> None:
        self.number = number
        self.request = request
        self.submitted = time.perf_counter()
        self._scheduler = scheduler
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue = asyncio.Queue()
        self._cancelled = threading.Event()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, FINAL_EVENTS):
                return

    def cancel(self) -> None:
        """Stop this request: dropped from the queue, or stopped by the worker after its next chunk."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._scheduler._withdraw(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def emit(self, event: Event) -> None:
        """Hand ``event`` to the event loop (callable from any thread)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class FifoScheduler:
    """First in, first out, one request at a time on ``engine`` (see the module docstring)."""

    def __init__(self, engine: BatchOneEngine, max_queue: int, metrics: "ServerMetrics | None" = None) -> None:
        if isinstance(max_queue, bool) or not isinstance(max_queue, int) or max_queue < 1:
            raise ValueError(f"max_queue: got {max_queue!r}, expected an integer >= 1")
        self.engine = engine
        self.max_queue = max_queue
        self.metrics = metrics
        self._waiting: deque[Ticket] = deque()
        self._condition = threading.Condition()
        self._stopping = False
        self._running: list[Ticket] = []
        self._numbers = itertools.count(1)
        self._thread = threading.Thread(target=self._work, name="talon-worker", daemon=True)

    # ------------------------------------------------------------------ event-loop side
    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Ticket:
        """Queue ``request`` (call from the event loop). Raises :class:`QueueFull` or :class:`ShuttingDown`."""
        with self._condition:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"the queue is full ({self.max_queue} requests waiting); retry later")
            ticket = Ticket(next(self._numbers), request, self)
            self._waiting.append(ticket)
            self._report_queue()
            self._condition.notify()
        return ticket

    def stop(self, timeout: float = 10.0) -> bool:
        """Refuse new requests, fail the waiting ones, stop the running one after its current
        chunk, and join the worker. True when the worker has exited."""
        with self._condition:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            running = list(self._running)
            self._report_queue()
            self._condition.notify_all()
        for ticket in waiting:
            ticket.emit(Failed(ShuttingDown("the server is shutting down")))
        for ticket in running:
            ticket.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def _withdraw(self, ticket: Ticket) -> None:
        with self._condition:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return  # running or done: the worker sees the flag
            self._report_queue()
        self._end_cancelled(ticket)

    def _end_cancelled(self, ticket: Ticket) -> None:
        ticket.emit(Failed(ShuttingDown("the server is shutting down")) if self._stopping else Cancelled())
        if self.metrics is not None:
            self.metrics.observe_cancelled()

    def _report_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.observe_queue(len(self._waiting), len(self._running))

    # ------------------------------------------------------------------ worker side
    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._waiting and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    return
                ticket = self._waiting.popleft()
                self._running = [ticket]
                self._report_queue()
            try:
                self._serve(ticket)
            except Exception as error:  # noqa: BLE001 - reported to the client as a server error
                LOG.exception("request %d failed", ticket.number)
                ticket.emit(Failed(error))
            finally:
                with self._condition:
                    self._running = []
                    self._report_queue()

    def _serve(self, ticket: Ticket) -> None:
        """Run one request, emitting its events; stops early when the ticket is cancelled."""
        if ticket.cancelled:
            self._end_cancelled(ticket)
            return
        try:
            generation = self.engine.start(ticket.request)
        except ValueError as error:  # TalonError and friends: the client's mistake
            ticket.emit(Failed(error))
            return
        ticket.emit(Started(generation.prompt_tokens, generation.max_new_tokens))
        first_chunk = None
        try:
            for text in generation.stream:
                if first_chunk is None:
                    first_chunk = time.perf_counter()
                ticket.emit(Chunk(text))
                if ticket.cancelled:
                    break
        finally:
            generation.stream.close()
        result = generation.stream.result
        if ticket.cancelled or result is None:
            self._end_cancelled(ticket)
            return
        self._finish(ticket, result, first_chunk)

    def _finish(self, ticket: Ticket, result: GenerationResult, first_chunk: float | None) -> None:
        finished = time.perf_counter()
        ticket.emit(Finished(result))
        if self.metrics is not None:
            self.metrics.observe_finished(result, queued_at=ticket.submitted, first_chunk_at=first_chunk,
                                          finished_at=finished)


class BatchScheduler(FifoScheduler):
    """First in, first out into a batch of up to ``engine.max_batch`` requests (continuous batching, see the
    module docstring); the event-loop side is :class:`FifoScheduler`'s."""

    engine: BatchedEngine

    def __init__(self, engine: BatchedEngine, max_queue: int, metrics: "ServerMetrics | None" = None) -> None:
        super().__init__(engine, max_queue, metrics)
        self._batch: dict[Ticket, Running] = {}  # worker side: the tickets in the batch
        self._first_chunk: dict[Ticket, float] = {}

    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._waiting and not self._batch and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    break
                ticket = None
                if self._waiting and len(self._batch) < self.engine.max_batch:
                    ticket = self._waiting.popleft()
                    self._running.append(ticket)
                    self._report_queue()
            try:
                if ticket is not None:
                    self._join(ticket)
                self._drop_cancelled()
                if self._batch:
                    self._step()
            except Exception as error:  # noqa: BLE001 - outside the engine's own calls: fail the batch, go on
                LOG.exception("the batch worker failed")
                self._fail_all(error)
        for ticket in list(self._batch):  # shutting down: the running requests end as cancelled ones do
            self._leave(ticket)
            self._end_cancelled(ticket)

    def _join(self, ticket: Ticket) -> None:
        if ticket.cancelled:
            self._leave(ticket)
            self._end_cancelled(ticket)
            return
        try:
            self._batch[ticket] = self.engine.join(ticket.request)
        except ValueError as error:  # TalonError and friends: the client's mistake
            self._leave(ticket)
            ticket.emit(Failed(error))
            return
        except Exception as error:  # noqa: BLE001 - reported to the client as a server error
            LOG.exception("request %d failed", ticket.number)
            self._fail_all(error, ticket)
            return
        running = self._batch[ticket]
        ticket.emit(Started(running.prompt_tokens, running.max_new_tokens))

    def _drop_cancelled(self) -> None:
        for ticket in [ticket for ticket in self._batch if ticket.cancelled]:
            self._leave(ticket)
            self._end_cancelled(ticket)

    def _step(self) -> None:
        tickets = {id(running): ticket for ticket, running in self._batch.items()}
        try:
            updates = self.engine.step()
        except Exception as error:  # noqa: BLE001 - every request of the batch fails with it
            LOG.exception("a batched step failed")
            self._fail_all(error)
            return
        now = time.perf_counter()
        for running, text, result in updates:
            ticket = tickets[id(running)]
            if text:
                self._first_chunk.setdefault(ticket, now)
                ticket.emit(Chunk(text))
            if result is not None:
                first_chunk = self._first_chunk.get(ticket)
                self._leave(ticket)
                self._finish(ticket, result, first_chunk)

    def _leave(self, ticket: Ticket) -> None:
        """Take ``ticket`` out of the batch (its caches released) and out of the running list."""
        running = self._batch.pop(ticket, None)
        if running is not None:
            self.engine.drop(running)
        self._first_chunk.pop(ticket, None)
        with self._condition:
            if ticket in self._running:
                self._running.remove(ticket)
            self._report_queue()

    def _fail_all(self, error: Exception, *more: Ticket) -> None:
        """An engine failure: every request in the batch (and ``more``) fails with it; the batch starts afresh."""
        for ticket in list(self._batch) + list(more):
            self._batch.pop(ticket, None)
            self._first_chunk.pop(ticket, None)
            with self._condition:
                if ticket in self._running:
                    self._running.remove(ticket)
            ticket.emit(Failed(error))
        try:
            self.engine.reset()
        except Exception:  # noqa: BLE001 - the next join finds the batch as it is
            LOG.exception("the batch could not be reset")
        with self._condition:
            self._report_queue()
