"""The Gradio app: upload a video or an image, ask, and watch the episode stream turn by turn.

``mmagent demo`` builds it with :func:`build_app` and serves it on 127.0.0.1:7860. One question runs one
episode of the real agent (the same :class:`~mmagent.agent.Agent` the CLI and eval use) in a worker
thread; each turn it reports is drawn at once by :class:`mmagent.demo.episode_view.EpisodeView`: thoughts, each
tool call with its arguments, what the tool said, and the frames, crops and maps it returned in a
captioned gallery beside the frames the first prompt showed. The finished trajectory can be downloaded
as JSON (and as a zip with its images).

One model serves every visitor, so episodes run one at a time (Gradio queues the rest and shows their
place). Uploads are checked before anything runs (:mod:`mmagent.demo.uploads`). A bad file, a tool that fails
and a model that raises all end up as a one-line message in the page that names the user's file
(:mod:`mmagent.demo.errors`); the app keeps serving. A video browsers cannot play is shown through an H.264
copy (:mod:`mmagent.demo.display`); the agent still reads the file that was uploaded.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from mmagent.agent import Agent, Budgets
from mmagent.media import MediaError, load_image, open_video
from mmagent.policy.base import Policy
from mmagent.toolbox.registry import resolve_tools
from mmagent.demo.display import browser_playable, gallery_file, playable_copy
from mmagent.demo.episode_view import EpisodeView, GalleryItem, export_trajectory, prompt_items, question_message
from mmagent.demo.errors import user_message
from mmagent.demo.examples import Example
from mmagent.demo.uploads import IMAGE_TYPES, VIDEO_TYPES, UploadError, UploadLimits, check_image, check_video

log = logging.getLogger("mmagent.demo")

#: Gradio's default theme loads Google fonts; the demo must work with no network, so it names local ones
FONTS = ("ui-sans-serif", "system-ui", "sans-serif")
MONO_FONTS = ("ui-monospace", "Consolas", "monospace")


class EpisodeStopped(Exception):
    """Raised inside the agent's turn callback when the visitor left or pressed Stop."""


@dataclass
class Update:
    """One refresh of the page's outputs."""

    status: str
    messages: list[dict[str, Any]]
    #: (PNG path, caption) per image: see :func:`mmagent.demo.display.gallery_file`
    gallery: list[tuple[str, str]]
    answer: str
    files: list[str] | None = None

    def values(self) -> tuple[Any, ...]:
        return self.status, self.messages, self.gallery, self.answer, self.files


class DemoRunner:
    """Runs the demo's episodes on one shared policy, one at a time, streaming :class:`Update` s."""

    def __init__(self, policy: Policy, tools: Sequence[str], work_dir: str | Path,
                 limits: UploadLimits | None = None, max_new_tokens: int = 512, model_label: str = "") -> None:
        self.policy = policy
        self._tools = {t.name: t for t in resolve_tools(list(tools), default=list)}  # built once, shared
        self.tools = list(self._tools)
        self.work_dir = Path(work_dir)
        self.limits = limits or UploadLimits()
        self.max_new_tokens = max_new_tokens
        self.model_label = model_label
        self._lock = threading.Lock()  # the policy's sessions and caches are not thread-safe

    # ----- inputs ---------------------------------------------------------------------------------
    def display_video(self, video: str | None) -> tuple[str | None, str | None]:
        """What the page's player shows for an uploaded ``video``: the file itself when browsers play it, else an
        H.264 copy (the agent still reads the upload); and a status line when it is a copy."""
        if not video or browser_playable(video):
            return video, None
        try:
            copy = playable_copy(video, self.work_dir / "display", uuid.uuid4().hex[:12])
        except Exception as exc:  # a file no decoder reads: the upload check says so when asked about it
            log.info("no display copy of %s: %s", video, exc)
            return None, None
        return str(copy), (f"ℹ️ {Path(video).name} is in a format browsers cannot play: the player shows a copy; "
                           "the agent reads your file.")

    def _checked_inputs(self, video: str | None, image: str | None, question: str | None,
                        options: str | None, tools: Sequence[str] | None) -> tuple[str, list[str] | None, list[str]]:
        question = (question or "").strip()
        if not video and not image:
            raise UploadError("Upload a video or an image first (or click one of the examples).")
        if not question:
            raise UploadError("Type a question about the video or the image.")
        if video:
            check_video(video, self.limits)
        if image:
            check_image(image, self.limits)
        opts = [line.strip() for line in (options or "").splitlines() if line.strip()] or None
        chosen = [t for t in (tools if tools is not None else self.tools) if t in self.tools]
        return question, opts, chosen

    def _prompt_frames(self, video: str | None, image: str | None) -> list[GalleryItem]:
        """What the first prompt shows: the image and the frames the renderer samples for the policy (the same
        times; shown here at full size)."""
        frames: list[tuple[Any, float]] = []
        if video:
            reader = open_video(video)
            try:
                frames = [(f.image, f.timestamp) for f in self.policy.renderer.sample_video(reader)]
            finally:
                reader.close()
        return prompt_items(frames, load_image(image) if image else None)

    # ----- one episode ----------------------------------------------------------------------------
    def stream(self, video: str | None, image: str | None, question: str | None, options: str | None = None,
               tools: Sequence[str] | None = None, max_turns: int = 6, seed: int = 0) -> Iterator[Update]:
        """Run one episode and yield the page after each turn; the last update carries the downloads."""
        try:
            question, opts, chosen = self._checked_inputs(video, image, question, options, tools)
            shown = self._prompt_frames(video, image)
        except (UploadError, MediaError) as exc:
            yield Update(f"❌ {user_message(exc, [video, image])}", [], [], "")
            return
        view = EpisodeView(messages=[question_message(question, opts)])
        agent = Agent(self.policy, tools=[self._tools[name] for name in chosen],
                      budgets=Budgets(max_turns=int(max_turns), max_new_tokens=self.max_new_tokens))
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        stop = threading.Event()

        def on_turn(turn: Any) -> None:
            if stop.is_set():
                raise EpisodeStopped()
            events.put(("turn", turn))

        def work() -> None:
            with self._lock:
                try:
                    if stop.is_set():
                        raise EpisodeStopped()
                    result = agent.run(question, video=video or None, image=image or None, options=opts,
                                       seed=int(seed), on_turn=on_turn)
                    events.put(("done", result.trajectory))
                except EpisodeStopped:
                    events.put(("stopped", None))
                except MediaError as exc:
                    log.info("episode media failed: %s", exc)
                    events.put(("failed", f"could not read the media: {user_message(exc, [video, image])}"))
                except Exception as exc:  # a model or backend failure: report it, keep serving
                    log.exception("episode failed")
                    events.put(("failed", "the model failed: "
                                          + user_message(f"{type(exc).__name__}: {exc}", [video, image])))

        threading.Thread(target=work, name="mmagent-demo-episode", daemon=True).start()
        t0 = time.perf_counter()
        written: dict[int, str] = {}

        def gallery() -> list[tuple[str, str]]:  # each image a file, written the first time it is shown
            items = shown + view.gallery
            for im, _ in items:
                if id(im) not in written:
                    written[id(im)] = gallery_file(im, self.work_dir / "gallery")
            return [(written[id(im)], caption) for im, caption in items]

        try:
            yield Update("⏳ Waiting for the model…", list(view.messages), gallery(), "")
            while True:
                kind, value = events.get()
                if kind == "turn":
                    view.add(value)
                    doing = f"running {view.last_call}" if value.role == "assistant" and value.tool_call else "thinking"
                    yield Update(f"⏳ Turn {view.policy_turns}: {doing}… ({time.perf_counter() - t0:.1f} s)",
                                 list(view.messages), gallery(), view.answer or "")
                    continue
                if kind == "done":
                    files = self._export(value)
                    yield Update(self._summary(value, time.perf_counter() - t0), list(view.messages),
                                 gallery(), value.answer if value.answer is not None else "", files)
                elif kind == "stopped":
                    yield Update("⏹ Stopped.", list(view.messages), gallery(), view.answer or "")
                else:
                    yield Update(f"❌ Error: {value}", list(view.messages), gallery(), view.answer or "")
                return
        finally:
            stop.set()  # the visitor left, pressed Stop, or the episode ended: the worker stops at its next turn

    def _export(self, traj: Any) -> list[str] | None:
        folder = self.work_dir / "trajectories" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
        try:
            return [str(p) for p in export_trajectory(traj, folder)]
        except OSError as exc:
            log.warning("could not write the trajectory to %s: %s", folder, exc)
            return None

    @staticmethod
    def _summary(traj: Any, seconds: float) -> str:
        calls = len(traj.tool_calls)
        turns = sum(t.role == "assistant" for t in traj.turns)
        stop = {"answer": "answered", "max_turns": "stopped: turn limit reached",
                "max_tokens": "stopped: context limit reached"}.get(traj.stop_reason, f"stopped: {traj.stop_reason}")
        note = f" — {user_message(traj.info['error'], [traj.task.video, traj.task.image])}" \
            if traj.info.get("error") else ""
        if traj.info.get("invalid_answer"):
            note += f" — invalid answer: {traj.info['invalid_answer']}"
        icon = "✅" if traj.stop_reason == "answer" else "⚠️"
        return (f"{icon} {stop}{note} · {turns} turn{'s' * (turns != 1)}, {calls} tool call{'s' * (calls != 1)}, "
                f"{seconds:.1f} s")


def build_app(runner: DemoRunner, examples: Sequence[Example] = (), title: str = "mmagent demo") -> Any:
    """The Gradio Blocks app around ``runner`` (launch it with :func:`launch`)."""
    import gradio as gr

    with gr.Blocks(title=title, analytics_enabled=False) as app:
        gr.Markdown(f"# {title}\nAsk about a video or an image; the agent thinks, calls tools, looks at what "
                    f"they return and answers.\n\n**Model:** {runner.model_label or 'custom'}")
        with gr.Row():
            with gr.Column(scale=2):
                # The upload is a file box, not a player: a browser asked to play a codec it lacks shows an error
                # toast, so the player below gets the file itself only when browsers play it, else a copy.
                video = gr.File(label=f"Video ({', '.join(VIDEO_TYPES)}; up to {runner.limits.max_video_s:g} s, "
                                      f"{runner.limits.max_video_mb:g} MB)", file_types=list(VIDEO_TYPES),
                                file_count="single", type="filepath", elem_id="mm-video")
                player = gr.Video(label="The video, as your browser plays it", interactive=False, format=None,
                                  include_audio=True, elem_id="mm-player")
                image = gr.Image(label=f"Image ({', '.join(IMAGE_TYPES)}; up to {runner.limits.max_image_mb:g} MB)",
                                 type="filepath", sources=["upload"], elem_id="mm-image")
                question = gr.Textbox(label="Question", lines=2, placeholder="What happens after the red circle appears?",
                                      elem_id="mm-question")
                options = gr.Textbox(label="Answer options (optional, one per line)", lines=3,
                                     placeholder="A. a square\nB. a triangle", elem_id="mm-options")
                with gr.Accordion("Agent settings", open=False):
                    tools = gr.CheckboxGroup(runner.tools, value=runner.tools, label="Tools", elem_id="mm-tools")
                    max_turns = gr.Slider(1, 12, value=6, step=1, label="Max turns")
                    seed = gr.Number(value=0, precision=0, label="Seed")
                with gr.Row():
                    ask = gr.Button("Ask", variant="primary", elem_id="mm-ask")
                    stop = gr.Button("Stop", elem_id="mm-stop")
                    clear = gr.Button("Clear", elem_id="mm-clear")
                if examples:
                    gr.Examples([e.row() for e in examples], inputs=[video, image, question, options],
                                example_labels=[f"toy world: {e.family}" for e in examples],
                                label="Toy-world examples (what the built-in model was trained on)")
            with gr.Column(scale=3):
                status = gr.Markdown("Upload a video or an image, type a question and press **Ask**.",
                                     elem_id="mm-status")
                chat = gr.Chatbot(label="Episode", height=460, elem_id="mm-chat")
                answer = gr.Textbox(label="Answer", interactive=False, elem_id="mm-answer")
                gallery = gr.Gallery(label="What the model saw: prompt frames and tool results", columns=4,
                                     height=320, object_fit="contain", elem_id="mm-gallery")
                files = gr.File(label="Trajectory (JSON, and a zip with its images)", file_count="multiple",
                                interactive=False, elem_id="mm-download")

        def shown(v: str | None) -> tuple[str | None, Any]:
            path, note = runner.display_video(v)
            return path, (note if note else gr.update())

        video.change(shown, [video], [player, status], concurrency_limit=2)

        def run(v: str | None, im: str | None, q: str, o: str, t: list[str], n: float, s: float) -> Iterator[tuple]:
            # closing(): a cancelled event closes this generator, and with it the episode's (which stops the worker)
            with contextlib.closing(runner.stream(v, im, q, o, tools=t, max_turns=int(n), seed=int(s or 0))) as ups:
                for update in ups:
                    yield update.values()

        outputs = [status, chat, gallery, answer, files]
        inputs = [video, image, question, options, tools, max_turns, seed]
        event = ask.click(run, inputs, outputs, concurrency_limit=1)
        submitted = question.submit(run, inputs, outputs, concurrency_limit=1)
        stop.click(None, cancels=[event, submitted])
        clear.click(lambda: (None, None, None, "", "", "Upload a video or an image, type a question and press **Ask**.",
                             [], [], "", None),
                    outputs=[video, player, image, question, options] + outputs, cancels=[event, submitted])
    return app


def launch(app: Any, host: str = "127.0.0.1", port: int = 7860, limits: UploadLimits | None = None,
           allowed_paths: Sequence[str] = (), block: bool = True, quiet: bool = False) -> Any:
    """Serve ``app``; with ``block=False`` return at once (the server keeps running in the background)."""
    import gradio as gr

    limits = limits or UploadLimits()
    theme = gr.themes.Default(font=list(FONTS), font_mono=list(MONO_FONTS))
    return app.queue(default_concurrency_limit=1).launch(
        server_name=host, server_port=port, max_file_size=f"{limits.max_file_mb:g}mb", show_error=True,
        allowed_paths=list(allowed_paths), prevent_thread_lock=not block, quiet=quiet, ssr_mode=False,
        theme=theme)


def default_work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="mmagent-demo-"))
