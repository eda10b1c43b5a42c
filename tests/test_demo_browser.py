"""The demo in a real browser: headless Chromium, driven by Playwright, against the app served on loopback.

It uploads a toy-world video, asks, waits for the answer and checks that the tool's frames and the
trajectory download appear; then a broken upload must show its message and leave the app working, and an
OpenCV ``mp4v`` upload must play through its H.264 copy (no "Video not playable") while the agent reads it.
The built-in model answers, exactly what `mmagent demo` serves. Screenshots go to
``$MMAGENT_TEST_ARTIFACTS`` (default: ``test-artifacts/`` in the repository).

Needs a Chromium (Debian's ``chromium`` package, or ``$MMAGENT_CHROMIUM``) and the ``playwright`` package.
Without them the test is skipped, unless ``MMAGENT_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a
failure.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("MMAGENT_TEST_ARTIFACTS", REPO / "test-artifacts"))
TIMEOUT_MS = 120_000


def _chromium() -> str | None:
    for candidate in (os.environ.get("MMAGENT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and (path := shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)):
            return path
    return None


def _missing() -> str | None:
    try:
        import gradio  # noqa: F401
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"needs gradio and playwright ({exc})"
    if _chromium() is None:
        return "no Chromium found (apt-get install chromium, or set MMAGENT_CHROMIUM)"
    return None


if (_reason := _missing()) is not None:
    if os.environ.get("MMAGENT_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"the browser test must run here but cannot: {_reason}")
    pytest.skip(_reason, allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_demo(tmp_path_factory):
    from mmagent.demo.app import DemoRunner, build_app, launch
    from mmagent.demo.examples import toy_examples
    from mmagent.default_model import LABEL, default_model_path, default_model_info
    from mmagent.policy.hf import HFPolicy

    work = tmp_path_factory.mktemp("demo")
    examples = toy_examples(work / "examples")
    policy = HFPolicy.from_pretrained(str(default_model_path()), device="cpu")
    runner = DemoRunner(policy, default_model_info()["tools"], work, model_label=LABEL)
    app = build_app(runner, examples)
    port = _free_port()
    launch(app, port=port, allowed_paths=[str(work)], block=False, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", examples
    finally:
        app.close()


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=_chromium(), headless=True, args=["--no-sandbox"])
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1600})
            pg.set_default_timeout(TIMEOUT_MS)
            yield pg
        finally:
            browser.close()


def _wait_status(page, prefix: str) -> str:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "p => { const el = document.querySelector('#mm-status'); return el && el.innerText.trim().startsWith(p); }",
            arg=prefix, timeout=TIMEOUT_MS)
    except PlaywrightTimeout:
        raise AssertionError(f"the status never began with {prefix!r}; it says: "
                             f"{page.inner_text('#mm-status').strip()!r}") from None
    return page.inner_text("#mm-status").strip()


def _upload(page, box: str, path: str, arrived: str, tries: int = 3) -> None:
    """Put ``path`` in the file input of ``box`` and wait until the page shows it (the JS predicate ``arrived``).
    A page still hydrating may replace the input under a file set too early (seen once under load: the name never
    appeared), so the upload is made again, up to ``tries`` times, before the test fails."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        page.locator(f"{box} input[type=file]").set_input_files(path)
        try:
            page.wait_for_function(arrived, timeout=40_000)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


def test_upload_ask_and_watch_the_episode_in_chromium(served_demo, page):
    url, examples = served_demo
    video_qa = next(e for e in examples if e.family == "video_qa")
    page.goto(url)
    page.wait_for_selector("#mm-question textarea")
    assert "built-in tiny model" in page.inner_text("body")
    # the upload reached the server and the player
    _upload(page, "#mm-video", video_qa.video, "() => document.querySelector('#mm-player video') !== null")
    page.fill("#mm-question textarea", video_qa.question)
    page.fill("#mm-options textarea", video_qa.options)
    page.click("#mm-ask")
    status = _wait_status(page, "✅")
    assert "tool call" in status
    answer = page.input_value("#mm-answer textarea")
    assert answer in {"A", "B", "C", "D"}, answer
    chat = page.inner_text("#mm-chat")
    assert video_qa.question in chat and "calls resample_frames" in chat and f"Answer: {answer}" in chat
    assert '"num_frames"' in chat  # the call's arguments are on the page, not folded away
    # the gallery holds the prompt's frames and the frames the tool returned, drawn as images
    # (every one loaded and decoded: a broken image has naturalWidth 0 once complete)
    page.wait_for_function("() => { const ims = [...document.querySelectorAll('#mm-gallery img')];"
                           " return ims.length >= 16 && ims.every(e => e.complete); }")
    widths = page.eval_on_selector_all("#mm-gallery img", "els => els.map(e => e.naturalWidth)")
    assert len(widths) >= 16 and all(w > 0 for w in widths), widths
    gallery_text = page.inner_text("#mm-gallery")
    assert "prompt frame" in gallery_text and "resample_frames · obs:1" in gallery_text
    assert "not playable" not in page.inner_text("body")  # the example video is H.264: the player shows it
    links = dict(page.eval_on_selector_all("#mm-download a", "els => els.map(e => [e.download, e.href])"))
    assert sorted(links) == ["trajectory.json", "trajectory.zip"]
    saved = page.request.get(links["trajectory.json"]).json()  # what the download link serves
    assert saved["answer"] == answer and saved["task"]["question"] == video_qa.question
    assert [t["tool_call"]["name"] for t in saved["turns"] if t["role"] == "assistant" and t["tool_call"]]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo_episode.png"), full_page=True)


def test_a_broken_upload_shows_a_message_and_the_app_keeps_working(served_demo, page, tmp_path):
    url, examples = served_demo
    page.goto(url)
    page.wait_for_selector("#mm-question textarea")
    fake = tmp_path / "holiday.mp4"
    fake.write_bytes(b"definitely not an mp4 file" * 100)
    _upload(page, "#mm-video", str(fake), "() => document.querySelector('#mm-video').innerText.includes('holiday.mp4')")
    page.fill("#mm-question textarea", "What happens?")
    page.click("#mm-ask")
    status = _wait_status(page, "❌")
    assert "holiday.mp4: cannot be read as a video" in status
    assert "/tmp" not in status and "\n" not in status  # the user's file, in one line
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo_bad_upload.png"), full_page=True)
    # an image question on the same page still runs
    page.click("#mm-clear")
    # Clear goes through the app's queue: under load its reply can come after a new upload and empty it again,
    # so the next upload waits until the page is cleared
    _wait_status(page, "Upload a video or an image")
    page.wait_for_function("() => !document.querySelector('#mm-video').innerText.includes('holiday.mp4')")
    image_qa = next(e for e in examples if e.family == "image_qa")
    _upload(page, "#mm-image", image_qa.image, "() => document.querySelector('#mm-image img') !== null")
    page.fill("#mm-question textarea", image_qa.question)
    page.fill("#mm-options textarea", image_qa.options)
    page.click("#mm-ask")
    assert _wait_status(page, "✅")
    assert page.input_value("#mm-answer textarea") in {"A", "B", "C", "D"}


def test_an_mp4v_upload_plays_through_an_h264_copy_and_the_agent_reads_the_upload(served_demo, page, tmp_path):
    from mmagent.tiny import write_synthetic_video

    url, _ = served_demo
    clip = write_synthetic_video(tmp_path / "phone clip.mp4", seconds=2.0, fps=8, size=(96, 64))  # OpenCV mp4v
    page.goto(url)
    page.wait_for_selector("#mm-question textarea")
    page.locator("#mm-video input[type=file]").set_input_files(str(clip))
    status = _wait_status(page, "ℹ️")
    assert "phone clip.mp4 is in a format browsers cannot play" in status
    page.wait_for_function("() => { const v = document.querySelector('#mm-player video');"
                           " return v && v.readyState >= 1 && v.videoWidth > 0; }")  # the copy plays
    assert "not playable" not in page.inner_text("body")
    page.fill("#mm-question textarea", "What colour is the screen?")
    page.click("#mm-ask")
    _wait_status(page, "✅")
    saved = page.request.get(dict(page.eval_on_selector_all(
        "#mm-download a", "els => els.map(e => [e.download, e.href])"))["trajectory.json"]).json()
    assert saved["task"]["video"].endswith("phone clip.mp4")  # the agent read the upload, not the copy
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo_mp4v_upload.png"), full_page=True)
