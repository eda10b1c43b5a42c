"""The server's engine: one thread owns the model; requests wait in a bounded queue and generate together.

:meth:`ChatEngine.submit` puts a checked request in line, or refuses it at once with :class:`~mmagent.serve.
request.ServerBusy` (HTTP 503 with ``Retry-After``) when ``max_queue`` requests are already waiting, so a
burst is answered, never dropped. The engine's thread takes requests in the order they came, up to
``max_batch`` at a time: it encodes each one's messages (:class:`~mmagent.serve.conversations.
Conversations`, which picks up the episode's kept KV cache) and adds it to the same continuous-batching
stream the agent's episodes run through (:class:`~mmagent.policy.batching.DecodeStream`): new requests
prefill together and join the running decode batch between two tokens, each with its own ``max_tokens``
and sampling. A finished turn leaves the batch at once, its session kept for the episode's next turn
within the store's count, byte budget and idle time.

A request hears back through the ``emit`` callback it was submitted with, called from the engine's thread
with, in order: :class:`Started` (encoded and in the batch), :class:`Text` (streaming requests: the turn's
text so far, after each step that changed it), then :class:`Finished` or :class:`Failed`; a request
refused at encoding gets :class:`Failed` alone.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from mmagent.policy.batching import DecodeStream
from mmagent.policy.sampling import SamplingConfig
from mmagent.serve.conversations import Conversations
from mmagent.serve.metrics import Metrics
from mmagent.serve.request import DEFAULT_MAX_TOKENS, ChatRequest, RequestError, ServerBusy
from mmagent.serve.response import Completion, apply_stops
from mmagent.serve.store import SessionStore

log = logging.getLogger(__name__)


def release_freed_memory() -> None:
    """Hand memory freed by the burst just served back to the system (glibc keeps it in its heaps otherwise,
    so resident memory would stay at the burst's peak); a no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

#: how often idle kept sessions are looked for (seconds)
SWEEP_S = 1.0


@dataclass
class EngineConfig:
    """How much the server takes on at once and how much it keeps."""

    #: requests generated together (one decode batch)
    max_batch: int = 16
    #: requests that may wait for a place in the batch; past that, new ones get 503 with Retry-After
    max_queue: int = 64
    #: episodes whose KV cache is kept between turns
    max_sessions: int = 64
    #: bytes the kept sessions may hold together (KV caches and the ids they keep)
    cache_bytes: int = 1 << 30
    #: seconds a kept session may sit idle before it is ended
    session_ttl_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 0:
            raise ValueError("max_batch must be at least 1 and max_queue at least 0")


@dataclass
class Started:
    prompt_tokens: int


@dataclass
class Text:
    #: the turn's text so far (decoded, special tokens left out)
    text: str


@dataclass
class Finished:
    completion: Completion


@dataclass
class Failed:
    error: RequestError


Event = Started | Text | Finished | Failed


class Job:
    """One request in the engine: what was asked, where its events go, and its place in line."""

    def __init__(self, request: ChatRequest, emit: Callable[[Event], None], seq: int) -> None:
        self.request = request
        self.messages = request.message_dicts()
        self.seq = seq
        self._emit = emit
        self.cancelled = False

    def cancel(self) -> None:
        """The client has gone: drop the request if it is still waiting (a running turn finishes)."""
        self.cancelled = True

    def send(self, event: Event) -> None:
        try:
            self._emit(event)
        except Exception:  # the receiving side is gone (e.g. the server's loop closed): nothing to tell
            log.debug("dropped an event for request %d", self.seq, exc_info=True)


@dataclass
class _Running:
    job: Job
    session: Any
    prompt_tokens: int
    t0: float
    text: str = ""


class ChatEngine:
    """Chat-completion requests over an ``HFPolicy``: a bounded queue in front of one batched decode stream."""

    def __init__(self, policy: Any, model_name: str, config: EngineConfig | None = None) -> None:
        self.policy = policy
        self.model_name = model_name
        self.config = config or EngineConfig()
        c = self.config
        self.store = SessionStore(policy.end, getattr(policy, "session_nbytes", lambda s: 0),
                                  max_sessions=c.max_sessions, max_bytes=c.cache_bytes, ttl_s=c.session_ttl_s)
        self.conversations = Conversations(policy, model_name, self.store)
        self.metrics = Metrics()
        self._stream = DecodeStream(policy, DEFAULT_MAX_TOKENS)
        self._waiting: deque[Job] = deque()
        self._running: dict[int, _Running] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._paused = self._stopping = False
        self._seq = 0
        self._service_s = 1.0  # running mean of a request's time in the batch, for Retry-After

    # ----- the outside --------------------------------------------------------------------------------
    def start(self) -> "ChatEngine":
        """Start the engine's thread (:meth:`submit` does it when needed)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mmagent-serve-engine", daemon=True)
                self._thread.start()
        return self

    def submit(self, request: ChatRequest, emit: Callable[[Event], None]) -> Job:
        """Put ``request`` in line; its events go to ``emit`` (called from the engine's thread). Raises
        :class:`ServerBusy` when the queue is full or the engine is stopping."""
        self.start()
        with self._cond:
            if self._stopping:
                raise ServerBusy("the server is shutting down", 5)
            if len(self._waiting) >= self.config.max_queue:
                self.metrics.add("rejected_busy")
                wait = self.retry_after_s()
                raise ServerBusy(f"the server is busy: {len(self._waiting)} requests are waiting (the queue holds "
                                 f"{self.config.max_queue}); retry after {wait} s", wait)
            self._seq += 1
            job = Job(request, emit, self._seq)
            self._waiting.append(job)
            self.metrics.add("requests")
            self._cond.notify_all()
        return job

    def retry_after_s(self) -> int:
        """Seconds until a place in the queue is likely free (from how long requests have been taking)."""
        rounds = len(self._waiting) / self.config.max_batch + 1
        return int(min(60, max(1, math.ceil(self._service_s * rounds))))

    def pause(self) -> None:
        """Stop taking requests out of the queue (running turns finish); they wait until :meth:`resume`."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, Any]:
        """Counters and gauges (what ``/health`` and ``/metrics`` show)."""
        return self.metrics.snapshot(
            queue_depth=len(self._waiting), queue_limit=self.config.max_queue, running=len(self._running),
            cache_sessions=len(self.store), cache_bytes=self.store.nbytes, cache_budget_bytes=self.store.max_bytes,
            cache_evicted=self.store.evicted, cache_expired=self.store.expired)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop: requests still waiting or running get 503, kept sessions are ended."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        if thread is None or not thread.is_alive():
            self._drain()

    # ----- the engine's thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        last_sweep, busy = time.monotonic(), False
        while True:
            with self._cond:
                idle = not self._running and (self._paused or not self._waiting)
                if idle and not busy and not self._stopping:
                    self._cond.wait(timeout=SWEEP_S)
                if self._stopping:
                    break
                admit = []
                while not self._paused and self._waiting and len(self._running) + len(admit) < self.config.max_batch:
                    job = self._waiting.popleft()
                    if job.cancelled:
                        self.metrics.add("cancelled")
                    else:
                        admit.append(job)
            if idle and busy:  # a burst just ended
                release_freed_memory()
            busy = bool(self._running or admit)
            if time.monotonic() - last_sweep >= SWEEP_S:
                self.store.expire()
                last_sweep = time.monotonic()
            for job in admit:
                self._admit(job)
            if self._running:
                self._step()

    def _fail(self, job: Job, error: RequestError) -> None:
        self.metrics.add("failed")
        job.send(Failed(error))

    def _admit(self, job: Job) -> None:
        req = job.request
        try:
            session, hit = self.conversations.prepare(job.messages, req.seed or 0, req.fps)
        except RequestError as exc:
            self._fail(job, exc)
            return
        except Exception as exc:  # a bug or a processor failure: the client gets a 500, the log the traceback
            log.error("request %d failed while encoding:\n%s", job.seq, traceback.format_exc())
            self._fail(job, RequestError(f"{type(exc).__name__}: {exc}", 500, "server_error"))
            return
        try:
            session.sampling = SamplingConfig(temperature=1.0 if req.temperature is None else req.temperature,
                                              top_p=1.0 if req.top_p is None else req.top_p)
        except ValueError as exc:
            self.policy.end(session)
            self._fail(job, RequestError(str(exc)))
            return
        self.metrics.add("session_hits" if hit else "session_misses")
        self._stream.add(session, req.new_tokens)
        run = _Running(job, session, len(session.token_ids), time.perf_counter())
        self._running[id(session)] = run
        job.send(Started(run.prompt_tokens))

    def _step(self) -> None:
        try:
            finished = self._stream.step()
        except Exception as exc:  # the model failed: every request in the batch gets a 500, the engine goes on
            log.error("generation failed:\n%s", traceback.format_exc())
            for run in self._running.values():
                self.policy.end(run.session)
                self._fail(run.job, RequestError(f"generation failed: {type(exc).__name__}: {exc}", 500,
                                                 "server_error"))
            self._running.clear()
            self._stream.close()
            self._stream = DecodeStream(self.policy, DEFAULT_MAX_TOKENS)
            return
        for session, gen in finished:
            self._finish(self._running.pop(id(session)), gen)
        if any(run.job.request.stream for run in self._running.values()):
            for session, ids in self._stream.partial():
                run = self._running.get(id(session))
                if run is None or not run.job.request.stream or run.job.cancelled:
                    continue
                text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
                if text != run.text:
                    run.text = text
                    run.job.send(Text(text))

    def _finish(self, run: _Running, gen: Any) -> None:
        req, job = run.job.request, run.job
        content, stop_reason = apply_stops(gen.text, req.stops)
        finish = "stop" if stop_reason is not None or not gen.truncated else "length"
        if content + (stop_reason or "") == gen.text:
            # Kept for the next turn under the reply with its stop string put back, as mmagent's client and
            # vLLM's include_stop_str_in_output send it; a reply sent back any other way is re-encoded.
            self.conversations.keep(job.messages, gen.text, req.fps, run.session)
        else:  # generation ran past a caller's own stop string: the session holds more than the reply
            self.policy.end(run.session)
        completion = Completion(content=content, finish_reason=finish, stop_reason=stop_reason,
                                prompt_tokens=run.prompt_tokens, completion_tokens=len(gen.token_ids),
                                cached_tokens=max(0, run.prompt_tokens - gen.prefill_tokens))
        self.metrics.add("completed")
        self.metrics.add("prompt_tokens", run.prompt_tokens)
        self.metrics.generated(len(gen.token_ids))
        self._service_s = 0.8 * self._service_s + 0.2 * (time.perf_counter() - run.t0)
        if job.cancelled:
            self.metrics.add("cancelled")
        job.send(Finished(completion))

    def _drain(self) -> None:
        """After the thread stopped: everything still waiting or running gets 503; kept sessions end."""
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
        busy = ServerBusy("the server is shutting down", 5)
        for job in waiting:
            job.send(Failed(busy))
        for run in self._running.values():
            self.policy.end(run.session)
            run.job.send(Failed(busy))
        self._running.clear()
        self._stream.close()
        self.store.clear()
