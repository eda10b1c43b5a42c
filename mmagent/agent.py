"""The agent loop: prompt, generate, parse, run a tool, show its result, repeat — for many episodes at once.

One step of :meth:`Agent.run_batch` asks the policy for the next turn of every open episode, parses
each turn, runs the requested tools concurrently (each call under its own timeout, on its episode's
media only), and appends every observation to its episode. A malformed call, an unknown tool, bad
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
from typing import Any, Callable, Sequence

from PIL import Image
from tqdm.auto import tqdm

from mmagent.media import EpisodeMedia, MediaError
from mmagent.policy.base import MediaBudget, Policy, Session
from mmagent.protocol import Answer, ProtocolError, ToolCall, describe_media, parse_turn, render_system_prompt
from mmagent.trajectory import Task, ToolCallRecord, Trajectory, Turn
from toolbox.base import Observation, Tool, ToolError
from toolbox.registry import resolve_tools

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

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_context_tokens", "max_visual_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


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


class Agent:
    """A policy plus a toolbox plus budgets."""

    def __init__(self, policy: Policy, tools: Sequence[str | Tool] | None = None, budgets: Budgets | None = None,
                 system_prompt: str | None = None, max_workers: int = 8, max_open: int | None = None) -> None:
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

    @classmethod
    def from_pretrained(cls, model: str, tools: Sequence[str | Tool] | None = None, budgets: Budgets | None = None,
                        media_budget: MediaBudget | None = None, temperature: float = 0.0,
                        device: str | None = None, dtype: str = "auto", **kwargs: Any) -> "Agent":
        """Load a transformers checkpoint (hub id or local folder) as the policy."""
        from mmagent.policy.hf import HFPolicy, SamplingConfig

        policy = HFPolicy.from_pretrained(model, device=device, dtype=dtype, media_budget=media_budget,
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
                  images: dict[int, Image.Image] | None = None) -> list[Trajectory]:
        """Run many episodes at once; returns one trajectory per task, in order.

        An episode whose media cannot be opened ends with ``stop_reason == "error"`` (and the reason in
        ``info["error"]``) unless ``raise_media_errors``. ``seed`` is the first episode's seed (the k-th
        gets ``seed + k``) or one seed per task, so that an episode's seed need not depend on its batch.
        With ``max_open`` set, at most that many episodes are open at once (memory stays bounded); each
        one that ends lets the next waiting one start, so no slot waits for the slowest episode.
        """
        seeds = [seed + k for k in range(len(tasks))] if isinstance(seed, int) else [int(s) for s in seed]
        if len(seeds) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(seeds)} seeds")
        episodes = [_Episode(task, Trajectory(task=task, system_prompt=self.system_prompt)) for task in tasks]
        bar = tqdm(total=len(episodes), desc="episodes", unit="ep", disable=not progress or len(episodes) < 2)
        cap = self.max_open or len(episodes)
        waiting = list(range(len(episodes)))
        running: list[_Episode] = []

        def admit() -> None:
            # Start waiting episodes until ``cap`` are open; one whose media fails ends at once.
            while waiting and len(running) < cap:
                k = waiting.pop(0)
                ep = episodes[k]
                try:
                    self._start(ep, (images or {}).get(k), seeds[k])
                    running.append(ep)
                except (MediaError, ToolError, OSError, ValueError) as exc:
                    if raise_media_errors:
                        raise MediaError(str(exc)) from exc
                    self._finish(ep, "error", error=str(exc))
                    bar.update(1)

        try:
            with cf.ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                admit()
                while running:
                    self._step(running, pool, on_turn)
                    bar.update(sum(ep.done for ep in running))
                    running[:] = [ep for ep in running if not ep.done]
                    admit()
        finally:
            bar.close()
            for ep in episodes:
                if not ep.done:
                    self._finish(ep, "error", error="interrupted")
        return [ep.trajectory for ep in episodes]

    # ----- the loop -------------------------------------------------------------------------------
    def _start(self, ep: _Episode, image: Image.Image | None, seed: int) -> None:
        task = ep.task
        ep.media = EpisodeMedia(video=task.video, image=image if image is not None else task.image)
        video = ep.media.video
        duration = video.duration if video is not None else None
        user = " ".join(p for p in (describe_media(duration, None), task.question) if p)
        if task.options:
            user += "\nOptions:\n" + "\n".join(task.options)
        t0 = time.perf_counter()
        ep.session = self.policy.start(self.system_prompt, user, ep.media, seed=seed)
        ep.session.info["task_id"] = task.id
        if ep.media.image is not None:
            w, h = ep.media.view_size("image")
            ep.trajectory.info["image_view_size"] = [w, h]
        ep.trajectory.user_prompt = user
        ep.trajectory.timings["prompt_s"] = time.perf_counter() - t0

    def _step(self, episodes: list[_Episode], pool: cf.ThreadPoolExecutor,
              on_turn: Callable[[Turn], None] | None) -> None:
        b = self.budgets
        gens = self.policy.generate([ep.session for ep in episodes], b.max_new_tokens)
        calls: list[tuple[_Episode, ToolCall, cf.Future]] = []
        for ep, gen in zip(episodes, gens):
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
            _notify(on_turn, turn)
            if isinstance(action, Answer):
                ep.trajectory.answer = action.text
                self._finish(ep, "answer")
            elif ep.turns >= b.max_turns:
                self._finish(ep, "max_turns")
            elif isinstance(action, ToolCall):
                calls.append((ep, action, pool.submit(self._call_tool, action, ep.media)))
            else:
                self._show(ep, Observation.error(action.message), on_turn, tool_name=None)
        for ep, call, future in calls:
            tool = self.tools[call.name]
            timeout = b.tool_timeout_s if b.tool_timeout_s is not None else tool.timeout_s
            t0 = time.perf_counter()
            try:
                obs = future.result(timeout=timeout)
            except cf.TimeoutError:
                # The thread cannot be killed; its result is dropped when it finishes.
                obs = Observation.error(f"{call.name} took longer than {timeout:g} s and was stopped")
                obs.data["timeout"] = True
            self._show(ep, obs, on_turn, tool_name=call.name, seconds=time.perf_counter() - t0)

    def _call_tool(self, call: ToolCall, media: EpisodeMedia) -> Observation:
        tool = self.tools[call.name]
        try:
            return tool(call.arguments, media)
        except ToolError as exc:
            return Observation.error(str(exc))
        except Exception as exc:  # a tool bug must not end the episode; the model and the log see it
            return Observation.error(f"{call.name} failed: {type(exc).__name__}: {exc}")

    def _show(self, ep: _Episode, obs: Observation, on_turn: Callable[[Turn], None] | None,
              tool_name: str | None, seconds: float = 0.0) -> None:
        """Append an observation to the episode, within the visual and context budgets."""
        b = self.budgets
        session = ep.session
        if obs.images:
            cost = self.policy.visual_tokens(obs.images)
            if session.visual_tokens + cost > b.max_visual_tokens:
                obs = Observation(text=obs.text + f"\n(The {len(obs.images)} image(s) were not shown: the episode's "
                                  f"visual budget of {b.max_visual_tokens} tokens is used up. Answer now.)",
                                  is_error=obs.is_error, data={**obs.data, "images_dropped": len(obs.images)})
            else:
                obs.handles = ep.media.add_observation_images(obs.images)
        if ep.turns == b.max_turns - 1:
            obs.text += "\n(This is your last turn: give your answer.)"
        error = ("timeout" if obs.data.get("timeout") else "tool_error") if obs.is_error else None
        turn = Turn(role="tool", text=obs.text, observation=obs, error=error, seconds=seconds)
        if tool_name:
            turn.tool_call = ToolCallRecord(tool_name, {})
        turn.num_tokens = self.policy.observe(session, obs)
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
            traj.prompt_length, traj.visual_tokens = s.prompt_length, s.visual_tokens
            traj.initial_frame_times = list(s.initial_frame_times)
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
    lines.append(f"Answer: {traj.answer if traj.answer is not None else '(none)'}   [stop: {traj.stop_reason}, "
                 f"{sum(t.role == 'assistant' for t in traj.turns)} turns, {len(traj.token_ids)} tokens, "
                 f"{traj.visual_tokens} visual]")
    if traj.info.get("error"):
        lines.append(f"Error: {traj.info['error']}")
    return "\n".join(lines)


def format_turn(turn: Turn) -> str:
    if turn.role == "assistant":
        head = f"[assistant] ({turn.num_tokens} tokens, {turn.prefill_tokens} prefilled, {turn.seconds:.2f}s)"
        note = f"\n  !! {turn.error}" if turn.error else ""
        return f"{head}\n  {turn.text.strip()}{note}"
    obs = turn.observation
    name = turn.tool_call.name if turn.tool_call else "error"
    images = f" [{len(obs.images)} image(s): {', '.join(obs.handles)}]" if obs is not None and obs.images else ""
    return f"[tool:{name}]{images}\n  {turn.text.strip()}"
