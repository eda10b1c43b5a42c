"""Red team, faults: tools that raise, return junk or hang past their timeout; a search backend that is down,
slow or hostile; a tool model that will not load. The episode goes on and its observation says what failed.

The search backend is the real Serper client talking HTTP to servers on 127.0.0.1 that misbehave on purpose.
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time

import numpy as np
import pytest
from deadlines import within
from PIL import Image

from mmagent import Agent, Budgets
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.trajectory import Task
from mmagent.toolbox import Observation, Tool, ToolError, create_tool
from mmagent.toolbox.search_backends import MAX_RESPONSE_BYTES, SerperBackend
from mmagent.toolbox.web_search import WebSearch

ANSWER = "<answer>green</answer>"


def _agent(model_dir, script, tools, **budgets) -> Agent:
    policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", chooser=ReplayChooser(script))
    return Agent(policy, tools=tools, budgets=Budgets(**budgets))


# ----- tools that raise or return junk ---------------------------------------------------------------------------
class _Faulty(Tool):
    description = "misbehaves"
    parameters = {"type": "object", "properties": {}}

    def __init__(self, name: str, behaviour) -> None:
        self.name = name
        self.behaviour = behaviour

    def run(self, arguments, context):
        return self.behaviour()


def _raise(exc):
    def go():
        raise exc
    return go


def _recurse(n=0):
    return _recurse(n + 1)


FAULTS = {
    "raises_runtime_error": (_raise(RuntimeError("boom")), "raises_runtime_error failed: RuntimeError: boom"),
    "raises_key_error": (_raise(KeyError("missing")), "raises_key_error failed: KeyError: 'missing'"),
    "raises_memory_error": (_raise(MemoryError()), "raises_memory_error failed: MemoryError"),
    "raises_os_error": (_raise(OSError(28, "No space left on device")), "No space left on device"),
    "recurses_forever": (_recurse, "recurses_forever failed: RecursionError: maximum recursion depth exceeded"),
    "calls_sys_exit": (lambda: sys.exit(3), "calls_sys_exit failed: SystemExit: 3"),
    "raises_tool_error": (_raise(ToolError("the map server says no")), "Error: the map server says no"),
    "returns_none": (lambda: None, "returns_none failed: it returned a NoneType, not an Observation"),
    "returns_text": (lambda: "a plain string", "returns_text failed: it returned a str, not an Observation"),
    "returns_a_needle_image": (lambda: Observation(text="x", images=[Image.new("RGB", (3000, 1))]),
                               "returns_a_needle_image failed: it returned images that cannot be shown (3000x1)"),
    "returns_an_empty_image": (lambda: Observation(text="x", images=[Image.new("RGB", (0, 0))]),
                               "cannot be shown (0x0)"),
    "returns_an_array": (lambda: Observation(text="x", images=[np.zeros((8, 8, 3), np.uint8)]),
                         "cannot be shown (ndarray)"),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_failing_tool_is_an_error_observation_and_the_episode_goes_on(tiny_model_dir, video_path, name):
    behaviour, message = FAULTS[name]
    script = [format_tool_call(name, {}), format_tool_call("resample_frames", {"start": 1, "end": 2, "num_frames": 1}),
              ANSWER]
    agent = _agent(tiny_model_dir, script, [_Faulty(name, behaviour), "resample_frames"], max_turns=4)
    traj = within(60, lambda: agent.run("What colour?", video=video_path)).trajectory
    failed, worked = (t for t in traj.turns if t.role == "tool")
    assert failed.error == "tool_error" and failed.observation.is_error and message in failed.text, failed.text
    assert failed.tool_call.name == name and not failed.observation.images
    assert worked.error is None and len(worked.observation.images) == 1  # the next call works as before
    assert traj.stop_reason == "answer" and traj.answer == "green"


# ----- a tool that hangs ------------------------------------------------------------------------------------------
class _Hangs(Tool):
    name = "hangs"
    description = "never answers"
    parameters = {"type": "object", "properties": {}}
    timeout_s = 0.3

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    def run(self, arguments, context):
        self.started += 1
        self.release.wait(60)
        return Observation(text="too late")


def test_a_tool_that_hangs_past_its_timeout_is_stopped_and_the_episode_goes_on(tiny_model_dir, video_path):
    hangs = _Hangs()
    script = [format_tool_call("hangs", {}), format_tool_call("resample_frames", {"start": 1, "end": 2}), ANSWER]
    agent = _agent(tiny_model_dir, script, [hangs, "resample_frames"], max_turns=4)
    t0 = time.perf_counter()
    try:
        traj = within(30, lambda: agent.run("What colour?", video=video_path)).trajectory
        elapsed = time.perf_counter() - t0
    finally:
        hangs.release.set()
    stopped, worked = (t for t in traj.turns if t.role == "tool")
    assert stopped.error == "timeout" and stopped.text == "Error: hangs took longer than 0.3 s and was stopped"
    assert worked.error is None and traj.answer == "green"
    assert elapsed < 20  # nobody waited for the stuck thread, which is still blocked


def test_more_hung_calls_than_workers_still_time_out(tiny_model_dir, video_path):
    hangs = _Hangs()
    agent = _agent(tiny_model_dir, [format_tool_call("hangs", {}), ANSWER], [hangs], max_turns=3)
    agent.max_workers = 2
    tasks = [Task("What colour?", video=str(video_path), id=f"t{k}") for k in range(4)]
    done: list = []
    thread = threading.Thread(target=lambda: done.append(agent.run_batch(tasks, progress=False)), daemon=True)
    thread.start()
    thread.join(5)  # four 0.3 s timeouts, two at a time, plus the model's turns
    hangs.release.set()
    thread.join(60)
    assert done, "run_batch never came back"
    assert all(t.turns[1].error == "timeout" for t in done[0]), [t.turns[1].text for t in done[0]]


class _StuckOpening(HFPolicy):
    """The real policy, except that opening the media of the "stuck" episode never finishes (a decoder that
    spins on a pathological file)."""

    release: threading.Event

    def start(self, view, seed=0, task=None):
        if "stuck" in task.question:
            self.release.wait(60)
        return super().start(view, seed, task)


def test_media_that_never_finish_opening_end_their_episode_not_the_run(tiny_model_dir, video_path):
    policy = _StuckOpening.from_pretrained(str(tiny_model_dir), device="cpu", chooser=ReplayChooser([ANSWER]))
    policy.release = threading.Event()
    agent = Agent(policy, tools=[], budgets=Budgets(start_timeout_s=0.5), max_workers=1)
    tasks = [Task("stuck: what colour?", video=str(video_path), id="stuck"),
             Task("what colour?", video=str(video_path), id="fine")]
    try:
        stuck, fine = within(30, lambda: agent.run_batch(tasks, progress=False))
    finally:
        policy.release.set()
    assert stuck.stop_reason == "error" and stuck.info["error"] == f"opening {video_path} took longer than 0.5 s"
    assert fine.answer == "green"  # it started on a fresh worker: the only one was held by the stuck opening
    with pytest.raises(ValueError, match="start_timeout_s must be positive"):
        Budgets(start_timeout_s=0)


# ----- a search backend that is down, slow or hostile -------------------------------------------------------------
class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


def _serve(behaviour: str, stop: threading.Event) -> _Server:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if behaviour == "reset":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if behaviour == "hang":
                stop.wait(30)
                return
            if behaviour == "503":
                body = b"<html>Service Unavailable</html>"
                self.send_response(503, "Service Unavailable")
            else:
                self.send_response(200)
                body = {"garbage": b"\x00\xff not json at all",
                        "wrong_shape": b'["organic", 1, 2]',
                        "huge": b'{"organic": [' + b" " * (MAX_RESPONSE_BYTES + 10) + b"]}",
                        "drip": b'{"organic": []}'}[behaviour]
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if behaviour == "drip":  # one byte at a time, each just inside the socket timeout
                for b in body:
                    if stop.wait(0.4):
                        return
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
            else:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


DOWN = {
    "503": "web search failed: Serper answered HTTP 503 (Service Unavailable)",
    "closed_port": "web search failed: cannot reach Serper ([Errno 111] Connection refused)",
    "reset": "web search failed: RemoteDisconnected: Remote end closed connection without response",
    "hang": "web search timed out after 1 s",
    "drip": "web search timed out after 1 s",
    "garbage": "web search failed: Serper's response was not valid JSON",
    "wrong_shape": "web search failed: unexpected response from Serper",
    "huge": "web search failed: Serper's response was too large",
}


@pytest.mark.parametrize("behaviour", list(DOWN))
def test_a_search_backend_that_is_down_is_an_error_observation(tiny_model_dir, behaviour):
    stop = threading.Event()
    server = None if behaviour == "closed_port" else _serve(behaviour, stop)
    port = _closed_port() if server is None else server.server_address[1]
    backend = SerperBackend(api_key="test-key", timeout_s=1)
    backend.endpoint = f"http://127.0.0.1:{port}/search"
    script = [format_tool_call("web_search", {"query": "Eiffel Tower"}),
              format_tool_call("zoom", {"bbox": [0, 0, 32, 32]}), "<answer>Paris</answer>"]
    agent = _agent(tiny_model_dir, script, [WebSearch(backend), "zoom"], max_turns=4)
    t0 = time.perf_counter()
    try:
        traj = within(30, lambda: agent.run("Where is this?", image=Image.new("RGB", (64, 64)))).trajectory
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
    elapsed = time.perf_counter() - t0
    failed, worked = (t for t in traj.turns if t.role == "tool")
    assert failed.error == "tool_error" and failed.text == f"Error: {DOWN[behaviour]}", failed.text
    assert "test-key" not in failed.text
    assert worked.error is None and traj.answer == "Paris"
    assert elapsed < 5, elapsed  # the backend's own 1 s limit held: the call never waited for the tool timeout


# ----- a tool model that will not load ----------------------------------------------------------------------------
def test_a_tool_whose_model_folder_is_damaged_says_so_and_fails_fast(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "preprocessor_config.json").write_text("{}")
    depth = create_tool("depth", model_id=str(broken), device="cpu")
    segment = create_tool("segment", model_id=str(broken), device="cpu")
    script = [format_tool_call("depth", {}), format_tool_call("segment", {"box": [0, 0, 9, 9]}),
              format_tool_call("depth", {}), ANSWER]
    agent = _agent(tiny_model_dir, script, [depth, segment], max_turns=5)
    traj = within(60, lambda: agent.run("How far?", image=Image.new("RGB", (64, 64)))).trajectory
    first, seg, again = (t for t in traj.turns if t.role == "tool")
    assert first.error == seg.error == again.error == "tool_error"
    assert f"cannot load its local folder {str(broken)!r}" in first.text
    assert f"could not load the segmentation model {str(broken)!r}" in seg.text
    assert again.text == first.text and again.seconds < 0.5  # remembered: no second attempt at loading
    assert traj.answer == "green"


def test_the_serper_key_never_reaches_the_model_even_when_the_server_echoes_it(tiny_model_dir):
    stop = threading.Event()

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"message": f"bad key {self.headers['X-API-KEY']}"}).encode()
            self.send_response(401, f"Unauthorized key={self.headers['X-API-KEY']}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = _Server(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = SerperBackend(api_key="sk-very-secret", timeout_s=1)
        backend.endpoint = f"http://127.0.0.1:{server.server_address[1]}/search"
        with pytest.raises(ToolError) as info:
            WebSearch(backend)({"query": "Paris"}, None)
    finally:
        stop.set()
        server.shutdown()
    assert str(info.value) == "web search failed: Serper answered HTTP 401 (the API key was rejected)"
