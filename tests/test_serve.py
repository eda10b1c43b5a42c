"""`mmagent serve` on uvicorn, over the tiny model: the official `openai` client (streaming and not), a burst of
requests with malformed ones among them, the full queue's 503, the order requests are served in, the kept
sessions' byte budget and idle time, and the error shapes. Servers run in a background thread on a free
loopback port; every wait has a deadline."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import http.client
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from typing import Any, Iterator

import openai
import pytest
from PIL import Image

from deadlines import within
from mmagent.policy.hf import HFPolicy
from mmagent.serve import ChatEngine, EngineConfig, Server, SessionStore, parse_request
from mmagent.serve.engine import Failed, Finished, Started
from mmagent.serve.response import StreamedText

MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="module")
def policy(tiny_model_dir) -> HFPolicy:
    return HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu")


@contextmanager
def serving(policy: HFPolicy, **config: Any) -> Iterator[Server]:
    """A server over ``policy`` in a background thread (one at a time: they share the model)."""
    server = Server(ChatEngine(policy, "tiny", EngineConfig(**config)), port=0, max_request_bytes=MAX_REQUEST_BYTES)
    within(60, server.start)
    try:
        yield server
    finally:
        within(60, server.stop)


def _image_url(color: tuple[int, int, int], size: tuple[int, int] = (56, 56)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _ask(k: int) -> list[dict]:
    color = ((37 * k) % 256, (91 * k) % 256, (53 * k) % 256)
    return [{"role": "system", "content": "You are a test."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _image_url(color)}},
                                         {"type": "text", "text": f"What colour is image {k}?"}]}]


def _post(url: str, body: bytes, timeout: float = 120) -> tuple[int, dict, Any]:
    """(status, JSON body, headers) of a POST on a new connection."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_openai_client_streaming_and_not(policy):
    with serving(policy) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list()] == ["tiny"]
        ask = dict(model="tiny", messages=_ask(1), max_tokens=8, temperature=0, seed=3)
        whole = client.chat.completions.create(**ask)
        reply = whole.choices[0].message.content
        assert whole.object == "chat.completion" and whole.choices[0].finish_reason in ("stop", "length")
        assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens > 0

        chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
        assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply  # greedy: same turn
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finals == [whole.choices[0].finish_reason] and chunks[-2].choices[0].finish_reason == finals[0]
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens

        # a caller's stop string is never streamed, not even its first characters
        stop = reply[len(reply) // 2:len(reply) // 2 + 3]
        if stop.strip():
            cut = client.chat.completions.create(**ask, stream=True, stop=[stop])
            events = list(cut)
            assert "".join(c.choices[0].delta.content or "" for c in events if c.choices) == reply[:reply.find(stop)]
            assert events[-1].choices[0].finish_reason == "stop"

        with pytest.raises(openai.BadRequestError, match="temperature"):
            client.chat.completions.create(**{**ask, "temperature": 5}, stream=True)  # refused before streaming
        with pytest.raises(openai.NotFoundError, match="is not served here"):
            client.chat.completions.create(**{**ask, "model": "gpt-9"})
        left = client.chat.completions.create(**{**ask, "max_tokens": 32}, stream=True)
        next(iter(left))
        left.close()  # a client that leaves mid-stream: its turn ends, the server goes on
        assert client.chat.completions.create(**ask).choices[0].message.content == reply
        deadline = time.monotonic() + 30
        while (health := _get(server.url.replace("/v1", "/health")))["running"]:
            assert time.monotonic() < deadline, "the abandoned turn never ended"
            time.sleep(0.05)
        assert health["status"] == "ok" and health["completed"] >= 4 and health["queue_depth"] == 0


MALFORMED = [
    b"{nope",
    json.dumps({"messages": _ask(0), "temperature": 9}).encode(),
    json.dumps({"messages": []}).encode(),
    json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(),
    json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                             "image_url": {"url": "http://example.com/a.png"}}]}]}).encode(),
    json.dumps({"messages": _ask(0), "n": 2}).encode(),
    json.dumps({"messages": _ask(0), "max_tokens": "5"}).encode(),
    json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                             "image_url": {"url": "data:image/png;base64,!!"}}]}]}).encode(),
    json.dumps({"model": "gpt-9", "messages": _ask(0)}).encode(),
]


def test_a_burst_is_answered_without_a_dropped_connection(policy):
    """200 requests, 32 at a time, each on its own connection, every fifth one malformed: every good one is
    answered, every malformed one gets a 4xx, no connection is reset, and the kept caches stay in budget."""
    budget = 256 * 1024
    with serving(policy, max_batch=8, max_queue=64, cache_bytes=budget) as server:
        url = server.url + "/chat/completions"

        def one(k: int) -> tuple[int, str]:
            if k % 5 == 4:
                body = MALFORMED[(k // 5) % len(MALFORMED)]
            else:
                body = json.dumps({"model": "tiny", "messages": _ask(k), "max_tokens": 4, "temperature": 0}).encode()
            try:
                status, out, _ = _post(url, body)
            except (urllib.error.URLError, ConnectionError, http.client.HTTPException, socket.timeout) as exc:
                return -1, f"{type(exc).__name__}: {exc}"
            return status, out["choices"][0]["message"]["content"] if status == 200 else out["error"]["message"]

        def burst() -> list[tuple[int, str]]:
            with cf.ThreadPoolExecutor(32) as pool:
                return list(pool.map(one, range(200)))

        results = within(240, burst)
        good = [r for k, r in enumerate(results) if k % 5 != 4]
        bad = [r for k, r in enumerate(results) if k % 5 == 4]
        dropped = [r for r in results if r[0] == -1]
        assert not dropped
        assert [s for s, _ in good] == [200] * 160, [r for r in good if r[0] != 200][:3]
        assert all(400 <= s < 500 for s, _ in bad), [r for r in bad if not 400 <= r[0] < 500][:3]
        assert sorted({s for s, _ in bad}) == [400, 404]
        stats = _get(server.url.replace("/v1", "/health"))
        assert stats["completed"] == 160 and stats["rejected_busy"] == 0 and stats["queue_depth"] == 0
        assert stats["invalid"] + stats["failed"] == 40  # refused when read, or when their media were decoded
        assert 0 < stats["cache_bytes"] <= budget and stats["cache_evicted"] > 0  # the byte budget, not the count
        metrics = urllib.request.urlopen(server.url.replace("/v1", "/metrics"), timeout=30).read().decode()
        for name in ("mmagent_requests_total", "mmagent_queue_depth", "mmagent_tokens_per_second",
                     "mmagent_cache_bytes"):
            assert f"\n{name} " in metrics


def test_a_full_queue_answers_503_with_retry_after_and_the_queue_is_served(policy):
    with serving(policy, max_batch=1, max_queue=2, session_ttl_s=0.5) as server:
        url, engine = server.url + "/chat/completions", server.engine
        body = json.dumps({"messages": _ask(7), "max_tokens": 3, "temperature": 0}).encode()
        engine.pause()
        with cf.ThreadPoolExecutor(2) as pool:
            try:
                waiting = [pool.submit(_post, url, body, 60) for _ in range(2)]
                deadline = time.monotonic() + 30
                while engine.queue_depth < 2:
                    assert time.monotonic() < deadline, "the requests never reached the queue"
                    time.sleep(0.01)
                for _ in range(3):
                    status, out, headers = _post(url, body)
                    assert status == 503 and out["error"]["type"] == "server_busy" and "busy" in out["error"]["message"]
                    assert int(headers["Retry-After"]) >= 1
            finally:
                engine.resume()
            assert [f.result(timeout=60)[0] for f in waiting] == [200, 200]
        stats = _get(server.url.replace("/v1", "/health"))
        assert stats["rejected_busy"] == 3 and stats["completed"] == 2
        deadline = time.monotonic() + 30  # the idle session is ended after its half second
        while _get(server.url.replace("/v1", "/health"))["cache_sessions"]:
            assert time.monotonic() < deadline, "the idle session was never ended"
            time.sleep(0.1)
        assert _get(server.url.replace("/v1", "/health"))["cache_expired"] >= 1


def test_requests_are_served_in_the_order_they_came(policy):
    engine = ChatEngine(policy, "tiny", EngineConfig(max_batch=1, max_queue=8))
    events: list[tuple[int, str]] = []
    lock, done = threading.Lock(), threading.Event()

    def on(seq: int):
        def emit(ev):
            with lock:
                events.append((seq, type(ev).__name__))
                if isinstance(ev, (Finished, Failed)) and sum(e[1] in ("Finished", "Failed") for e in events) == 4:
                    done.set()
        return emit

    try:
        engine.pause()
        for k in range(4):
            engine.submit(parse_request({"messages": _ask(k), "max_tokens": 2, "temperature": 0}, "tiny"), on(k))
        assert engine.queue_depth == 4
        engine.resume()
        assert done.wait(60)
    finally:
        engine.close()
    assert events == [(k, name) for k in range(4) for name in (Started.__name__, Finished.__name__)]


def test_the_servers_errors_have_openais_shape(policy):
    with serving(policy) as server:
        base = server.url.replace("/v1", "")
        status, out, _ = _post(server.url + "/chat/completions", b"x" * (MAX_REQUEST_BYTES + 1))
        assert status == 413 and "over 1 MiB" in out["error"]["message"]
        status, out, _ = _post(base + "/v1/nothing", b"{}")
        assert status == 404 and out["error"]["type"] == "not_found"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/chat/completions", timeout=30)  # a GET
        assert err.value.code == 405 and json.loads(err.value.read())["error"]["code"] == 405
        status, out, _ = _post(server.url + "/chat/completions/",
                               json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode())
        assert status == 200 and out["usage"]["completion_tokens"] <= 2


def test_the_session_store_keeps_within_count_bytes_and_idle_time():
    now, ended = [0.0], []
    store = SessionStore(ended.append, sizeof=lambda s: s[1], max_sessions=3, max_bytes=100, ttl_s=10,
                         clock=lambda: now[0])
    for k in range(3):
        assert store.put(f"k{k}", (f"s{k}", 30))
    assert (len(store), store.nbytes, ended) == (3, 90, [])
    assert store.put("k3", ("s3", 40))  # 130 bytes: the oldest goes
    assert ended == [("s0", 30)] and store.nbytes == 100 and store.evicted == 1
    assert not store.put("huge", ("s4", 101)) and ended[-1] == ("s4", 101) and "huge" not in store
    assert store.pop("k1") == ("s1", 30) and store.nbytes == 70  # handed over: no longer counted, not ended
    now[0] = 5.0
    store.put("k5", ("s5", 10))
    now[0] = 12.0
    assert store.expire() == 2 and {s for s, _ in ended[-2:]} == {"s2", "s3"} and list(store._entries) == ["k5"]
    store.clear()
    assert len(store) == 0 and store.nbytes == 0 and ended[-1] == ("s5", 10)


def test_streamed_text_never_sends_a_stop_string_or_its_start():
    text = StreamedText(["</answer>", "STOP"])
    assert text.update("<answer>B</") == "<answer>B"
    assert text.update("<answer>B</ans") == ""
    assert text.update("<answer>B</answer> and more") == ""
    assert text.final("<answer>B") == ""
    other = StreamedText([])
    assert other.update("ab\ufffd") == "ab" and other.update("abc") == "c" and other.final("abcd") == "d"
    # a held back start that turns out not to be a stop goes out
    third = StreamedText(["STOP"])
    assert third.update("a ST") == "a " and third.update("a STAR") == "STAR"


def test_mmagent_serve_refuses_bad_settings_and_a_taken_port(tiny_model_dir, capsys):
    from mmagent.cli import main

    assert main(["serve", "--model", str(tiny_model_dir), "--max-queue", "-1"]) == 2
    assert "max_queue at least 0" in capsys.readouterr().err
    assert main(["serve", "--model", str(tiny_model_dir), "--max-cache-mb", "-5"]) == 2
    assert "--max-cache-mb" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(tiny_model_dir), "--device", "cpu", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"mmagent: error: cannot serve on 127.0.0.1:{port}") and "pick another --port" in err
