"""The agent loop: prompt, generate, parse, run a tool, show its result, repeat — for many episodes at once.

:meth:`Agent.run_batch` keeps many episodes in flight. The policy's turn stream generates for every
episode that is ready; each finished turn is parsed at once, its tool runs in a thread pool (under its own
timeout, on its episode's media only) while the others keep generating, and the observation is appended
as soon as it is in, which puts the episode back in the stream. A malformed call, an unknown tool, bad
arguments, a tool that raises or times out — each becomes an error observation the model reads on
its next turn; the episode goes on. Episodes end with an answer or a budget stop (turns, context
tokens); a visual-token budget turns further images into a text note instead.

``Agent.from_pretrained("Qwen/Qwen2.5-VL-7B-Instruct").run("question", video="clip.mp4")`` is the
Python entry point; the CLI and the demo call the same code.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from PIL import Image
from tqdm.auto import tqdm

from mmagent.choices import invalid_reason
from mmagent.media import EpisodeMedia, MediaError, too_thin
from mmagent.policy.base import Generation, Policy, Session, TurnStream
from mmagent.policy.render import MediaBudget, View
from mmagent.protocol import Answer, ProtocolError, ToolCall, describe_media, parse_turn, render_system_prompt
from mmagent.trajectory import Task, ToolCallRecord, Trajectory, Turn
from mmagent.toolbox.base import Observation, Tool, ToolError
from mmagent.toolbox.registry import resolve_tools

DEFAULT_TOOLS = ("resample_frames", "zoom")


@dataclass
class Budgets:
    """Limits of one episode."""

    #: policy turns (tool calls + the answer)
    max_turns: int = 6
    #: new tokens per policy turn
    max_new_tokens: int = 512
    #: prompt + all turns + all observations
    max_context_tokens: int = 32768
    #: visual tokens over the whole episode (first prompt included); images past it become a text note
    max_visual_tokens: int = 16384
    #: seconds per tool call; None uses each tool's own ``timeout_s``
    tool_timeout_s: float | None = None
    #: seconds to open an episode's media and encode its first prompt (in a worker thread) before the
    #: episode ends with an error
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_context_tokens", "max_visual_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.start_timeout_s > 0:
            raise ValueError("start_timeout_s must be positive")


@dataclass
class RunResult:
    """What :meth:`Agent.run` returns: the answer (None after a budget stop) and the whole trajectory."""

    answer: str | None
    trajectory: Trajectory

    @property
    def stop_reason(self) -> str:
        return self.trajectory.stop_reason

    def __str__(self) -> str:
        return format_trajectory(self.trajectory)


@dataclass
class _Episode:
    task: Task
    trajectory: Trajectory
    media: EpisodeMedia | None = None
    session: Session | None = None
    turns: int = 0
    done: bool = False
    started: float = field(default_factory=time.perf_counter)
    #: when a worker began opening its media (None: not yet)
    opening: float | None = None
    #: images shown so far (the user's and the tools'), against the policy's ``max_images``
    images: int = 0


@dataclass
class _ToolRun:
    """A tool call in the pool; its timeout counts from when a worker starts it (see ``_Run.write_off`` for
    what keeps queued calls from waiting behind stuck ones)."""

    ep: _Episode
    call: ToolCall
    timeout: float
    started: float | None = None
    finished: float | None = None


@dataclass
class _Run:
    """The moving parts of one ``run_batch``."""

    stream: TurnStream
    workers: int
    on_turn: Callable[[Turn], None] | None
    raise_media_errors: bool
    starting: dict[cf.Future, _Episode] = field(default_factory=dict)
    tools: dict[cf.Future, _ToolRun] = field(default_factory=dict)
    by_session: dict[int, _Episode] = field(default_factory=dict)
    pool: cf.ThreadPoolExecutor = field(init=False)
    jobs: dict[cf.Future, tuple[Callable[..., Any], tuple[Any, ...]]] = field(default_factory=dict)
    stuck: int = 0  # workers of the current pool held by calls that timed out

    def __post_init__(self) -> None:
        self.pool = cf.ThreadPoolExecutor(max_workers=self.workers)

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        future = self.pool.submit(fn, *args)
        self.jobs[future] = (fn, args)
        return future

    def done_with(self, future: cf.Future) -> None:
        self.jobs.pop(future, None)

    def write_off(self) -> None:
        """A call ran past its timeout; its thread cannot be stopped. Once every worker of the pool is held
        that way, a fresh pool takes over, and the jobs still queued in the old one move to it."""
        self.stuck += 1
        if self.stuck < self.workers:
            return
        old, self.pool, self.stuck = self.pool, cf.ThreadPoolExecutor(max_workers=self.workers), 0
        for future, (fn, args) in list(self.jobs.items()):
            if future.cancel():  # not started yet
                self.done_with(future)
                moved = self.submit(fn, *args)
                if future in self.starting:
                    self.starting[moved] = self.starting.pop(future)
                if future in self.tools:
                    self.tools[moved] = self.tools.pop(future)
        old.shutdown(wait=False)


class Agent:
    """A policy plus a toolbox plus budgets."""

    def __init__(self, policy: Policy, tools: Sequence[str | Tool] | None = None, budgets: Budgets | None = None,
                 system_prompt: str | None = None, max_workers: int = 8, max_open: int | None = None,
                 keep_model_inputs: bool = False) -> None:
        self.policy = policy
        self.tools = {t.name: t for t in resolve_tools(list(tools) if tools is not None else None,
                                                       default=lambda: list(DEFAULT_TOOLS))}
        self.budgets = budgets or Budgets()
        self.system_prompt = system_prompt or render_system_prompt([t.schema() for t in self.tools.values()])
        self.max_workers = max_workers
        if max_open is not None and max_open < 1:
            raise ValueError("max_open must be at least 1")
        #: episodes open at once in run_batch (None: all); when one ends the next waiting one starts
        self.max_open = max_open
        #: keep each finished episode's model inputs in ``Trajectory.model_inputs`` (RL trains on them instead
        #: of encoding the episode again; they hold its pixel tensors, so evaluation leaves this off)
        self.keep_model_inputs = keep_model_inputs

    @classmethod
    def from_pretrained(cls, model: str, tools: Sequence[str | Tool] | None = None, budgets: Budgets | None = None,
                        media_budget: MediaBudget | None = None, temperature: float = 0.0,
                        device: str | None = None, dtype: Any = None, **kwargs: Any) -> "Agent":
        """Load a transformers checkpoint (hub id or local folder) as the policy (device, dtype and pixel budget
        by :mod:`mmagent.policy.placement`'s rule unless given)."""
        from mmagent.policy.loading import load_policy
        from mmagent.policy.sampling import SamplingConfig

        policy = load_policy(model, "hf", device=device, dtype=dtype, media_budget=media_budget,
                             sampling=SamplingConfig(temperature=temperature))
        return cls(policy, tools=tools, budgets=budgets, **kwargs)

    # ----- public API -----------------------------------------------------------------------------
    def run(self, question: str, video: str | os.PathLike | None = None,
            image: str | os.PathLike | Image.Image | None = None, options: Sequence[str] | None = None,
            seed: int = 0, on_turn: Callable[[Turn], None] | None = None) -> RunResult:
        """Answer one question about a video and/or an image. Bad media raise :class:`MediaError`."""
        if video is None and image is None:
            raise ValueError("give a video=... or an image=... to ask about")
        img_ref = image if isinstance(image, (str, os.PathLike)) or image is None else "<in-memory image>"
        task = Task(question=question, video=str(video) if video is not None else None,
                    image=str(img_ref) if img_ref is not None else None, options=list(options) if options else None)
        traj = self.run_batch([task], images={0: image} if isinstance(image, Image.Image) else None,
                              seed=seed, on_turn=on_turn, progress=False, raise_media_errors=True)[0]
        return RunResult(traj.answer, traj)

    def run_batch(self, tasks: Sequence[Task], seed: int | Sequence[int] = 0, progress: bool = True,
                  on_turn: Callable[[Turn], None] | None = None, raise_media_errors: bool = False,
                  images: dict[int, Image.Image] | None = None, max_open: int | None = None) -> list[Trajectory]:
        """Run many episodes at once; returns one trajectory per task, in order (see :meth:`run_stream`)."""
        trajs: list[Trajectory | None] = [None] * len(tasks)
        for k, traj in self.run_stream(tasks, seed=seed, progress=progress, on_turn=on_turn,
                                       raise_media_errors=raise_media_errors, images=images, max_open=max_open):
            trajs[k] = traj
        return trajs  # type: ignore[return-value]

    def run_stream(self, tasks: Sequence[Task], seed: int | Sequence[int] = 0, progress: bool = True,
                   on_turn: Callable[[Turn], None] | None = None, raise_media_errors: bool = False,
                   images: dict[int, Image.Image] | None = None, max_open: int | None = None
                   ) -> Iterator[tuple[int, Trajectory]]:
        """Run many episodes at once, yielding ``(index in tasks, trajectory)`` as each one ends.

        An episode whose media cannot be opened ends with ``stop_reason == "error"`` (and the reason in
        ``info["error"]``) unless ``raise_media_errors``. ``seed`` is the first episode's seed (the k-th
        gets ``seed + k``) or one seed per task, so that an episode's seed need not depend on its batch.
        With ``max_open`` (default: the agent's), at most that many episodes are open at once (memory stays
        bounded); each one that ends lets the next waiting one start. Nothing is kept once yielded, so a
        caller that writes each result out can stream any number of tasks.

        Nothing waits for the slowest episode: media are opened and tools run in a thread pool while the
        policy's :class:`~mmagent.policy.base.TurnStream` keeps generating for the episodes that are
        ready, and an episode rejoins it as soon as its tool result is in (with the transformers backend,
        between two decoded tokens). ``on_turn`` is called from this thread, in each episode's order.
        """
        seeds = [seed + k for k in range(len(tasks))] if isinstance(seed, int) else [int(s) for s in seed]
        if len(seeds) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
        if max_open is not None and max_open < 1:
            raise ValueError("max_open must be at least 1")
        cap = max_open or self.max_open or len(tasks)
        bar = tqdm(total=len(tasks), desc="episodes", unit="ep", disable=not progress or len(tasks) < 2)
        run = _Run(stream=self.policy.stream(self.budgets.max_new_tokens), workers=self.max_workers,
                   on_turn=on_turn, raise_media_errors=raise_media_errors)
        waiting = list(range(len(tasks)))
        opened: list[tuple[int, _Episode]] = []
        try:
            while waiting or opened:
                while waiting and len(opened) < cap:
                    k = waiting.pop(0)
                    ep = _Episode(tasks[k], Trajectory(task=tasks[k], system_prompt=self.system_prompt))
                    opened.append((k, ep))
                    self._open(run, ep, (images or {}).get(k), seeds[k])
                # An episode can only join the stream when its start or tool call is done: wait for one of
                # those when the stream is empty, or for all of them when the stream cannot take late joiners.
                self._collect(run, block=len(run.stream) == 0, wait_all=not run.stream.joins_running)
                if len(run.stream):
                    for session, gen in run.stream.step():
                        self._on_generation(run, run.by_session.pop(id(session)), gen)
                ended = [(k, ep) for k, ep in opened if ep.done]
                if ended:
                    opened = [(k, ep) for k, ep in opened if not ep.done]
                    bar.update(len(ended))
                    for k, ep in ended:
                        yield k, ep.trajectory
        finally:
            # A tool thread stuck past its timeout is not waited for (its result was already dropped).
            run.pool.shutdown(wait=False, cancel_futures=True)
            run.stream.close()
            bar.close()
            for _, ep in opened:
                if not ep.done:
                    self._finish(ep, "error", error="interrupted")

    # ----- the loop -------------------------------------------------------------------------------
    def _open(self, run: "_Run", ep: _Episode, image: Image.Image | None, seed: int) -> None:
        """Start ``ep`` (in the pool when the policy allows it); it joins the stream once its prompt is in."""
        if self.policy.thread_safe_start:
            run.starting[run.submit(self._start, ep, image, seed)] = ep
            return
        try:
            self._start(ep, image, seed)
        except (MediaError, ToolError, OSError, ValueError) as exc:
            self._start_failed(run, ep, exc)
            return
        self._join(run, ep)

    def _start_failed(self, run: "_Run", ep: _Episode, exc: BaseException, close: bool = True) -> None:
        if run.raise_media_errors:
            raise MediaError(str(exc)) from exc
        if not close:
            ep.media, ep.session = None, None  # still in use by the stuck thread
        self._finish(ep, "error", error=str(exc))

    def _join(self, run: "_Run", ep: _Episode) -> None:
        """Hand ``ep`` to the stream for its next turn."""
        run.by_session[id(ep.session)] = ep
        run.stream.add(ep.session)

    def _start(self, ep: _Episode, image: Image.Image | None, seed: int) -> None:
        ep.opening = time.perf_counter()
        task = ep.task
        ep.media = EpisodeMedia(video=task.video, image=image if image is not None else task.image)
        video = ep.media.video
        duration = video.duration if video is not None else None
        user = " ".join(p for p in (describe_media(duration, None), task.question) if p)
        if task.options:
            user += "\nOptions:\n" + "\n".join(task.options)
        t0 = time.perf_counter()
        view = self.policy.renderer.prompt(self.system_prompt, user, ep.media)
        ep.session = self.policy.start(view, seed=seed, task=task)
        self._shown(ep, view)
        traj = ep.trajectory
        traj.initial_frame_times = view.frame_times
        if "image" in view.view_sizes:
            traj.info["image_view_size"] = list(view.view_sizes["image"])
        traj.user_prompt = user
        traj.timings["prompt_s"] = time.perf_counter() - t0

    @staticmethod
    def _shown(ep: _Episode, view: View) -> None:
        """Record what ``view`` showed: the sizes tools read boxes in, and what it cost."""
        for handle, size in view.view_sizes.items():
            ep.media.set_view_size(handle, size)
        ep.trajectory.visual_tokens += view.visual_tokens
        ep.images += len(view.images)
        if view.notes:
            ep.trajectory.info.setdefault("view_notes", []).extend(view.notes)

    def _collect(self, run: "_Run", block: bool, wait_all: bool) -> None:
        """Take in finished starts and tool calls (and tool calls past their timeout)."""
        while run.starting or run.tools:
            pending = list(run.starting) + list(run.tools)
            if block or wait_all:
                # Poll: a tool's timeout only starts when a worker picks it up.
                cf.wait(pending, timeout=0.05, return_when=cf.FIRST_COMPLETED)
            progressed = False
            now = time.perf_counter()
            limit = self.budgets.start_timeout_s
            for future, ep in list(run.starting.items()):
                if future not in run.starting:  # moved to a fresh pool by write_off
                    continue
                if not future.done():
                    if ep.opening is not None and now - ep.opening > limit:
                        # A decoder stuck on a pathological file: the episode ends, its thread is written off
                        # (the media are not closed under it; the thread still holds them).
                        del run.starting[future]
                        run.done_with(future)
                        run.write_off()
                        progressed = True
                        self._start_failed(run, ep, MediaError(
                            f"opening {ep.task.video or ep.task.image} took longer than {limit:g} s"), close=False)
                    continue
                ep = run.starting.pop(future)
                run.done_with(future)
                progressed = True
                exc = future.exception()
                if exc is None:
                    self._join(run, ep)
                elif isinstance(exc, (MediaError, ToolError, OSError, ValueError)):
                    self._start_failed(run, ep, exc)
                else:
                    raise exc
            for future, call in list(run.tools.items()):
                if future not in run.tools:  # moved to a fresh pool by write_off below
                    continue
                if future.done():
                    obs = future.result()
                    run.done_with(future)
                elif call.started is not None and now - call.started > call.timeout:
                    # The thread cannot be killed; its result is dropped when it finishes.
                    obs = Observation.error(f"{call.call.name} took longer than {call.timeout:g} s and was stopped")
                    obs.data["timeout"] = True
                    run.done_with(future)
                    run.write_off()
                else:
                    continue
                del run.tools[future]
                progressed = True
                started = call.started if call.started is not None else now
                ended = call.finished if call.finished is not None else now
                self._observe(run, call.ep, obs, tool_name=call.call.name, seconds=max(0.0, ended - started))
            if not wait_all and (progressed or not block):
                return

    def _on_generation(self, run: "_Run", ep: _Episode, gen: Generation) -> None:
        """Record a finished policy turn and act on it: answer, budget stop, tool call or error."""
        ep.turns += 1
        parsed = parse_turn(gen.text, list(self.tools), truncated=gen.truncated)
        action = parsed.action
        turn = Turn(role="assistant", text=gen.text, num_tokens=gen.num_tokens,
                    prefill_tokens=gen.prefill_tokens, seconds=gen.seconds)
        ep.trajectory.turns.append(turn)
        if isinstance(action, ToolCall):
            turn.tool_call = ToolCallRecord(action.name, action.arguments)
        elif isinstance(action, ProtocolError):
            turn.error = action.kind
        _notify(run.on_turn, turn)
        if isinstance(action, Answer):
            ep.trajectory.answer = action.text
            if reason := invalid_reason(action.text, ep.task.options):
                ep.trajectory.info["invalid_answer"] = reason
            self._finish(ep, "answer")
        elif ep.turns >= self.budgets.max_turns:
            self._finish(ep, "max_turns")
        elif isinstance(action, ToolCall):
            tool = self.tools[action.name]
            timeout = self.budgets.tool_timeout_s if self.budgets.tool_timeout_s is not None else tool.timeout_s
            call = _ToolRun(ep, action, timeout)
            run.tools[run.submit(self._call_tool, call)] = call
        else:
            self._observe(run, ep, Observation.error(action.message), tool_name=None)

    def _observe(self, run: "_Run", ep: _Episode, obs: Observation, tool_name: str | None,
                 seconds: float = 0.0) -> None:
        self._show(ep, obs, run.on_turn, tool_name=tool_name, seconds=seconds)
        if not ep.done:
            self._join(run, ep)

    def _call_tool(self, run: "_ToolRun") -> Observation:
        run.started = time.perf_counter()
        try:
            return self._tool_observation(run)
        finally:
            run.finished = time.perf_counter()

    def _tool_observation(self, run: "_ToolRun") -> Observation:
        call, tool = run.call, self.tools[run.call.name]
        try:
            obs = tool(call.arguments, run.ep.media)
        except ToolError as exc:
            return Observation.error(str(exc))
        except (Exception, SystemExit) as exc:  # a tool bug (even a library's sys.exit) must not end the run
            return Observation.error(f"{call.name} failed: {type(exc).__name__}: {exc}")
        # What the policy cannot encode would fail the whole batch in _show: refuse it here, for this call only.
        if not isinstance(obs, Observation):
            return Observation.error(f"{call.name} failed: it returned a {type(obs).__name__}, not an Observation")
        bad = [f"{im.width}x{im.height}" if isinstance(im, Image.Image) else type(im).__name__ for im in obs.images
               if not isinstance(im, Image.Image) or min(im.size) < 1 or too_thin(*im.size)]
        if bad:
            return Observation.error(f"{call.name} failed: it returned images that cannot be shown ({', '.join(bad)})")
        return obs

    def _show(self, ep: _Episode, obs: Observation, on_turn: Callable[[Turn], None] | None,
              tool_name: str | None, seconds: float = 0.0) -> None:
        """Append an observation to the episode, within the visual, image and context budgets."""
        b = self.budgets
        renderer = self.policy.renderer
        if obs.images:
            cost = renderer.visual_tokens(obs.images)
            room = None if self.policy.max_images is None else max(0, self.policy.max_images - ep.images)
            if ep.trajectory.visual_tokens + cost > b.max_visual_tokens:
                obs = Observation(text=obs.text + f"\n(The {len(obs.images)} image(s) were not shown: the episode's "
                                  f"visual budget of {b.max_visual_tokens} tokens is used up. Answer now.)",
                                  is_error=obs.is_error, data={**obs.data, "images_dropped": len(obs.images)})
            elif room is not None and len(obs.images) > room:
                dropped = len(obs.images) - room
                obs = Observation(text=obs.text + f"\n({dropped} image(s) not shown: an episode holds at most "
                                  f"{self.policy.max_images} images here.)", images=obs.images[:room],
                                  image_labels=obs.image_labels[:room], is_error=obs.is_error,
                                  data={**obs.data, "images_dropped": dropped})
            if obs.images:
                obs.handles = ep.media.add_observation_images(obs.images)
        if ep.turns == b.max_turns - 1:
            obs.text += "\n(This is your last turn: give your answer.)"
        error = ("timeout" if obs.data.get("timeout") else "tool_error") if obs.is_error else None
        turn = Turn(role="tool", text=obs.text, observation=obs, error=error, seconds=seconds)
        if tool_name:
            turn.tool_call = ToolCallRecord(tool_name, {})
        view = renderer.observation(obs)
        session = ep.session
        turn.num_tokens = self.policy.observe(session, view)
        self._shown(ep, view)
        ep.trajectory.turns.append(turn)
        _notify(on_turn, turn)
        if session.num_tokens + b.max_new_tokens > b.max_context_tokens:
            self._finish(ep, "max_tokens")

    def _finish(self, ep: _Episode, reason: str, error: str | None = None) -> None:
        traj = ep.trajectory
        traj.stop_reason = reason
        if error:
            traj.info["error"] = error
        s = ep.session
        if s is not None:
            traj.token_ids, traj.loss_mask, traj.logprobs = list(s.token_ids), list(s.loss_mask), list(s.logprobs)
            traj.prompt_length = s.prompt_length
            if self.keep_model_inputs:
                traj.model_inputs = self.policy.model_inputs(s)
            self.policy.end(s)
        if ep.media is not None:
            ep.media.close()
        traj.timings["episode_s"] = time.perf_counter() - ep.started
        ep.done = True


def _notify(on_turn: Callable[[Turn], None] | None, turn: Turn) -> None:
    if on_turn is not None:
        on_turn(turn)


def format_trajectory(traj: Trajectory) -> str:
    """A readable transcript of an episode (what ``mmagent run`` prints)."""
    lines = [f"Question: {traj.task.question}"]
    for turn in traj.turns:
        lines.append(format_turn(turn))
    lines.append(f"Answer: {answer_line(traj)}   [stop: {traj.stop_reason}, "
                 f"{sum(t.role == 'assistant' for t in traj.turns)} turns, {len(traj.token_ids)} tokens, "
                 f"{traj.visual_tokens} visual]")
    if traj.info.get("error"):
        lines.append(f"Error: {traj.info['error']}")
    return "\n".join(lines)


def answer_line(traj: Trajectory) -> str:
    """The answer as printed: ``(none)`` after a budget stop, and an invalid one marked as such."""
    if traj.answer is None:
        return "(none)"
    reason = traj.info.get("invalid_answer")
    return f"{traj.answer} (invalid: {reason})" if reason else traj.answer


def format_turn(turn: Turn) -> str:
    if turn.role == "assistant":
        head = f"[assistant] ({turn.num_tokens} tokens, {turn.prefill_tokens} prefilled, {turn.seconds:.2f}s)"
        note = f"\n  !! {turn.error}" if turn.error else ""
        return f"{head}\n  {turn.text.strip()}{note}"
    obs = turn.observation
    name = turn.tool_call.name if turn.tool_call else "error"
    images = f" [{len(obs.images)} image(s): {', '.join(obs.handles)}]" if obs is not None and obs.images else ""
    return f"[tool:{name}]{images}\n  {turn.text.strip()}"
