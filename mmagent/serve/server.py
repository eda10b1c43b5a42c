"""Running ``mmagent serve``: the app on uvicorn, in the foreground (the CLI) or in a background thread (tests,
notebooks), and the model loaded into an engine.

:class:`Server` binds its socket when it is made (so a taken port fails at once, and ``port=0`` is known
before serving), with uvicorn's deep listen backlog: a burst of connections waits to be accepted instead
of being reset. uvicorn's own ``limit_concurrency`` is a second guard above the engine's queue (it answers
503 itself past that many open connections). :meth:`Server.stop` and the end of :meth:`Server.run` shut
down cleanly: open connections get a few seconds to finish, then the engine stops and its sessions end.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from mmagent.serve.app import DEFAULT_MAX_REQUEST_BYTES, make_app
from mmagent.serve.engine import ChatEngine, EngineConfig

#: connections the kernel holds for accepting (the stdlib server's 5 dropped bursts)
BACKLOG = 2048


def bind(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host has a colon); ``port=0`` picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog)


class Server:
    """``engine`` served over HTTP on ``host:port`` by uvicorn."""

    def __init__(self, engine: ChatEngine, host: str = "127.0.0.1", port: int = 8000,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, verbose: bool = False,
                 graceful_s: int = 5) -> None:
        self.engine = engine
        self.host = host
        self.socket = bind(host, port)
        self.port: int = self.socket.getsockname()[1]
        limit = engine.config.max_queue + engine.config.max_batch + 64
        config = uvicorn.Config(make_app(engine, max_request_bytes), log_level="info" if verbose else "warning",
                                access_log=verbose, backlog=BACKLOG, limit_concurrency=limit, lifespan="off",
                                timeout_graceful_shutdown=graceful_s)
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The OpenAI base URL, ``http://HOST:PORT/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def run(self) -> None:
        """Serve in this thread until Ctrl-C (SIGINT) or SIGTERM."""
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.close()

    def start(self, timeout_s: float = 30.0) -> "Server":
        """Serve in a background thread; return once it accepts requests."""
        self._thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.socket]},
                                        name="mmagent-serve-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server on {self.url} did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop a server started with :meth:`start` (connections get ``graceful_s`` to finish)."""
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.close()

    def close(self) -> None:
        self.engine.close()
        self.socket.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def load_engine(model: str, device: str | None = None, served_name: str | None = None,
                config: EngineConfig | None = None, media_budget: Any = None) -> ChatEngine:
    """Load ``model`` with the transformers backend (:mod:`mmagent.policy.loading`: its saved pixel budget,
    float32 on CPU) into an engine."""
    from mmagent.policy.loading import load_policy

    policy = load_policy(model, "hf", device=device, media_budget=media_budget)
    return ChatEngine(policy, served_name or model, config)
