"""The OpenAI-compatible HTTP backend against `mmagent serve` (a real local server over the tiny model), and
the messages it gives for a closed port, an HTTP error and a reply that is not a chat completion."""

from __future__ import annotations

import collections
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmagent.eval.benchmarks import synth
from mmagent.cli import main
from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import MediaBudget
from mmagent.policy.segments import concat_segments
from mmagent.policy.openai_http import HTTPSession, OpenAIBackendError, OpenAIPolicy, restore_stop
from mmagent.protocol import format_tool_call
from mmagent.serve import Conversations, SessionStore
from mmagent.toolbox import Observation

CALL = "<think>look closer</think>" + format_tool_call("zoom", {"image": "image", "box": [0, 0, 32, 32]})


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("toy-http")
    synth.build(root, per_family=1, seed=1, progress=False)
    return root


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """`mmagent serve` on a free port in a subprocess; yields its /v1 URL."""
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mmagent", "serve", "--model", str(tiny_model_dir),
                                 "--port", "0", "--device", "cpu"], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line)
        if not found:
            proc.kill()
            pytest.fail(f"mmagent serve did not start: {line!r} {log.read_text()}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _run(out: Path) -> tuple[list[dict], list[dict]]:
    # predictions.jsonl lists items in the order they finished
    recs = sorted((json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()), key=lambda r: r["id"])
    trajs = [json.loads((out / "trajectories" / r["trajectory"]).read_text()) for r in recs]
    return recs, trajs


def test_eval_over_http_gives_the_hf_backends_episodes(server, toy, tiny_model_dir, tmp_path):
    common = ["eval", "--bench", "synth", "--data-dir", str(toy), "--max-turns", "3", "--max-new-tokens", "12",
              "--batch-size", "4", "--quiet"]
    assert main([*common, "--model", str(tiny_model_dir), "--out", str(tmp_path / "hf")]) == 0
    before = _get(server.replace("/v1", "/health"))
    # no --model: the client asks the server which model it serves
    assert main([*common, "--backend", "openai", "--base-url", server, "--out", str(tmp_path / "http")]) == 0

    (hf_recs, hf_trajs), (http_recs, http_trajs) = _run(tmp_path / "hf"), _run(tmp_path / "http")
    assert [(r["id"], r["answer"], r["stop_reason"], r["score"]) for r in http_recs] == \
           [(r["id"], r["answer"], r["stop_reason"], r["score"]) for r in hf_recs]
    for a, b in zip(hf_trajs, http_trajs):
        assert [t["text"] for t in b["turns"]] == [t["text"] for t in a["turns"]]
        # the server kept each episode's KV cache: every later turn prefilled exactly what the in-process run
        # did; first turns share the system prompt's cache in both (the server's lives as long as the server)
        assert [t["prefill_tokens"] for t in b["turns"][1:]] == [t["prefill_tokens"] for t in a["turns"][1:]]
        assert b["turns"][0]["prefill_tokens"] <= a["prompt_length"]
        assert [t["num_tokens"] for t in b["turns"] if t["role"] == "assistant"] == \
               [t["num_tokens"] for t in a["turns"] if t["role"] == "assistant"]
        assert b["visual_tokens"] == a["visual_tokens"] > 0 and b["token_ids"] == []
    firsts = [t["turns"][0]["prefill_tokens"] for t in http_trajs]
    assert sum(firsts) < sum(t["prompt_length"] for t in hf_trajs)  # the shared head was computed once at most
    after = _get(server.replace("/v1", "/health"))
    turns = sum(r["turns"] for r in http_recs)
    assert after["requests"] - before["requests"] == turns
    assert after["session_hits"] - before["session_hits"] == turns - len(http_recs)
    run = json.loads((tmp_path / "http" / "run.json").read_text())
    assert run["identity"]["backend"] == "openai" and run["identity"]["model"] == str(tiny_model_dir)


def test_the_server_rebuilds_the_in_process_tokens_from_messages(tiny_model_dir, video_path):
    """Video, image, an assistant turn and an observation with two images, sent as messages to a server that
    has never seen the episode: it re-encodes them to the same ids, positions and pixels as HFPolicy."""
    budget = MediaBudget(video_frames=4, video_max_pixels=56 * 84, image_max_pixels=56 * 56,
                         observation_max_pixels=56 * 56)
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=budget)
    image = Image.new("RGB", (120, 90), (200, 30, 30))
    obs = Observation(text="2 crops", images=[Image.new("RGB", (60, 40), (0, 200, 0)), Image.new("RGB", (33, 70))],
                      image_labels=["box [0, 0, 32, 32]", "box [1, 1, 9, 9]"], handles=["obs:1", "obs:2"])

    prompt = policy.renderer.prompt("You are a test.", "What is red?", EpisodeMedia(video=video_path, image=image))
    ref = policy.start(prompt)
    policy.append_turn(ref, policy.tokenizer.encode(CALL, add_special_tokens=False))
    policy.observe(ref, policy.renderer.observation(obs))

    client = OpenAIPolicy("http://127.0.0.1:9/v1", model="tiny", media_budget=budget)
    sent = client.start(client.renderer.prompt("You are a test.", "What is red?",
                                               EpisodeMedia(video=video_path, image=image)))
    sent.messages.append({"role": "assistant", "content": CALL})
    client.observe(sent, client.renderer.observation(obs))

    conversations = Conversations(policy, "tiny", SessionStore(policy.end, policy.session_nbytes))
    rebuilt, hit = conversations.prepare(json.loads(json.dumps(sent.messages)), seed=0, fps=sent.fps)
    assert not hit
    assert rebuilt.token_ids == ref.token_ids and rebuilt.loss_mask == ref.loss_mask
    a, b = concat_segments(ref.segments), concat_segments(rebuilt.segments)
    assert set(a) == set(b) and "pixel_values" in a and "pixel_values_videos" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_a_closed_port_says_to_start_a_server(toy, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", retries=1, backoff_s=0.01)
    with pytest.raises(OpenAIBackendError, match=r"connection refused\): is the server running.*mmagent serve"):
        policy.resolve_model()
    rc = main(["eval", "--bench", "synth", "--data-dir", str(toy), "--backend", "openai", "--base-url",
               f"http://127.0.0.1:{port}", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "connection refused" in err[0] and "Traceback" not in err[0]


class _Fake(BaseHTTPRequestHandler):
    """/<mode>/v1/chat/completions answers as <mode> says."""

    counts: collections.Counter = collections.Counter()
    OK = {"choices": [{"message": {"role": "assistant", "content": "<answer>B"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 40, "completion_tokens": 3}}

    def do_POST(self):  # noqa: N802
        mode = self.path.split("/")[1]
        self.counts[mode] += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        status, body = {
            "boom": (500, {"error": {"message": "the GPU caught fire"}}),
            "garbage": (200, "<html>hello</html>"),
            "shape": (200, {"object": "chat.completion", "choices": []}),
            "bad": (400, {"error": {"message": "messages are too long"}}),
            "flaky": (503, "busy") if self.counts[mode] == 1 else (200, self.OK),
        }[mode]
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_http_errors_and_replies_that_are_not_chat_completions():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def generate(mode: str):
            policy = OpenAIPolicy(f"http://127.0.0.1:{server.server_port}/{mode}/v1", model="m", retries=1,
                                  backoff_s=0.01)
            session = HTTPSession(messages=[{"role": "user", "content": "hi"}])
            return policy.generate([session], 8)[0], session

        with pytest.raises(OpenAIBackendError, match=r"answered HTTP 500: the GPU caught fire \(tried 2 times\)"):
            generate("boom")
        with pytest.raises(OpenAIBackendError, match="not JSON: '<html>hello</html>'"):
            generate("garbage")
        with pytest.raises(OpenAIBackendError, match="not a chat completion"):
            generate("shape")
        with pytest.raises(OpenAIBackendError, match=r"answered HTTP 400: messages are too long$"):
            generate("bad")
        assert (_Fake.counts["boom"], _Fake.counts["garbage"], _Fake.counts["bad"]) == (2, 1, 1)  # 4xx: no retry
        t0 = time.monotonic()
        gen, session = generate("flaky")  # a 503 is retried, after the Retry-After the server asked for
        assert time.monotonic() - t0 >= 1.0
        assert gen.text == "<answer>B</answer>" and gen.num_tokens == 3 and session.num_tokens == 43
        assert session.messages[-1] == {"role": "assistant", "content": "<answer>B</answer>"}
    finally:
        server.shutdown()
        server.server_close()


def test_the_server_refuses_what_it_cannot_serve(server):
    url = server + "/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    status, body = _post(url, json.dumps({"messages": hi, "n": 2}).encode())
    assert status == 400 and "only n=1" in body["error"]["message"]
    status, body = _post(url, json.dumps({"model": "gpt-9", "messages": hi}).encode())
    assert status == 404 and "is not served here" in body["error"]["message"]
    remote = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}},
                                           {"type": "text", "text": "what?"}]}]
    status, body = _post(url, json.dumps({"messages": remote, "max_tokens": 2}).encode())
    assert status == 400 and "data: URL" in body["error"]["message"]
    status, body = _post(url, b"{nope")
    assert status == 400 and "not JSON" in body["error"]["message"]
    status, body = _post(url, json.dumps({"messages": hi, "max_tokens": 3, "temperature": 0}).encode())
    assert status == 200 and body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 3
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert _get(server + "/models")["data"][0]["id"]


def test_stop_strings_left_out_by_the_server_are_put_back():
    assert restore_stop("<answer>B", "stop", "</answer>") == "<answer>B</answer>"
    assert restore_stop('<tool_call>{"name": "zoom"}', "stop") == '<tool_call>{"name": "zoom"}</tool_call>'
    assert restore_stop("<answer>B</answer>", "stop") == "<answer>B</answer>"
    assert restore_stop("<answer>B", "length") == "<answer>B"  # cut by the token limit: not an answer
    assert restore_stop("plain text", "stop") == "plain text"
