"""Test helpers that turn a hang into a failure: a call with a deadline, and a child process killed on cue."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it takes longer than ``seconds``."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B036 - handed back to the test thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


def sigkill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str, log: Path,
                 timeout_s: float = 300) -> None:
    """SIGKILL ``proc`` as soon as ``ready()``; fail if it ends or stalls first (showing the end of ``log``)."""
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the process ended or stalled before {what}: {log.read_text()[-3000:]}")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
