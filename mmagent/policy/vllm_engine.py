"""The vLLM backend: the offline ``vllm.LLM`` engine, batched generation with prefix caching (GPU).

Install it on a GPU machine with ``pip install mmagent[vllm]``; vLLM is imported only when this backend is
built, so everything else works without it.

Each session keeps its prompt as text plus its media: every view the agent renders
(:mod:`mmagent.policy.render`) appends its ChatML text (:meth:`View.text`, the text the chat template
writes, each image or video one placeholder) and its fitted images and video. Every turn sends the whole
prompt with all its images (``multi_modal_data={"image": [...], "video": [...]}``) to ``LLM.generate``, one
request per open episode, so vLLM batches the episodes and its prefix cache (``enable_prefix_caching=True``)
skips recomputing what earlier turns already ran. The frames and images come sized by the renderer and
are passed with ``do_resize=False`` so the processor does not resize them. What goes with a video depends on the
model's family (:meth:`Family.vllm_video <mmagent.policy.families.Family.vllm_video>`):

* Qwen2.5-VL: the (T, H, W, 3) frames, and ``mm_processor_kwargs={"fps": ..., "do_resize": False}`` so the
  processor does not guess the frame rate (the M-RoPE time positions need it);
* Qwen3-VL: ``(frames, metadata)`` whose metadata carries the frames' real times (``frames_indices`` = the
  times, ``fps=1``), and ``mm_processor_kwargs={"do_sample_frames": False, "do_resize": False}``: vLLM's
  processor writes the ``<t seconds>`` text before each slab from it, as the transformers backend does.

The text is :meth:`View.text` for the family either way (Qwen3-VL: no default system turn; tool frames
preceded by ``<t seconds>``). The family is read from the engine's model config.

``limit_mm_per_prompt`` (vLLM refuses more images per prompt than it says, default 1) is set from
``max_images`` (default 32) and one video; the agent turns images past it into a text note
(:attr:`Policy.max_images`). By default token ids stay empty in the session (the engine tokenizes the text);
each turn's generated ids and the engine's prompt count are recorded, which is what the agent's budgets
need. An observation closes the assistant turn before it with ``<|im_end|>`` unless the turn's own ids
already end with it (``token_in_out``; text from the engine leaves special tokens out).

``token_in_out=True`` (RL rollouts, :mod:`mmagent.training.rl`) records the episode as the trainer needs it:
the prompt is sent as token ids — our tokenization of the text with one placeholder per image, which
vLLM expands itself (ids already expanded would be expanded again, silently wrong) — and each turn's
generated ids are appended to them verbatim, never re-tokenized. ``RequestOutput.prompt_token_ids``
comes back expanded, so the session's ``token_ids`` / ``loss_mask`` / ``logprobs`` are the expanded
conversation, 1 on generated tokens, with the sampled tokens' log-probabilities (``SamplingParams(
logprobs=0)``; start the engine with ``logprobs_mode="processed_logprobs"`` so they are taken after the
temperature, as the trainer's ratio needs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from PIL import Image

from mmagent.policy.base import Generation, Policy, Session
from mmagent.policy.families import DEFAULT_FAMILY, Family, family_of
from mmagent.policy.render import IM_END, MediaBudget, View
from mmagent.protocol import STOP_STRINGS
from mmagent.trajectory import Task

INSTALL_HINT = ("the vLLM backend needs the vllm package, which is not installed: on a machine with a CUDA GPU, "
                "run `pip install mmagent[vllm]` (or use --backend hf, or --backend openai against `vllm serve`)")


class VLLMUnavailable(ImportError):
    """vllm is not installed (or cannot be imported here)."""


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise VLLMUnavailable(f"{INSTALL_HINT} ({exc})") from None
    return vllm


@dataclass
class VLLMSession(Session):
    prompt: str = ""
    images: list[Image.Image] = field(default_factory=list)
    video: Any = None  # (T, H, W, 3) uint8 frames
    fps: float | None = None
    #: seconds of each of the video's (padded) frames
    video_times: list[float] = field(default_factory=list)
    context_tokens: int = 0
    turn: int = 0
    #: token_in_out: the conversation as ids with one placeholder per image/video (what vLLM is sent)
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.context_tokens


def _engine_family(llm: Any) -> Family:
    """The family of the model in a ``vllm.LLM`` (its HF config), or the default one when it cannot be read."""
    config = getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "hf_config", None)
    return family_of(config) if config is not None else DEFAULT_FAMILY


class VLLMPolicy(Policy):
    """A model in a ``vllm.LLM`` engine as the agent's policy."""

    thread_safe_start = True

    def __init__(self, llm: Any, media_budget: MediaBudget | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, max_images: int = 32, patch_factor: int | None = None,
                 token_in_out: bool = False, family: Family | None = None) -> None:
        self.llm = llm
        self.family = family or _engine_family(llm)
        self.token_in_out = token_in_out
        self.tokenizer = llm.get_tokenizer() if token_in_out else None
        self.im_end_id = self.tokenizer.convert_tokens_to_ids(IM_END) if token_in_out else None
        self.media_budget = media_budget or MediaBudget()
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        self.sampling = {"temperature": temperature, "top_p": top_p}
        self.max_images = max_images
        self.patch_factor = patch_factor

    @classmethod
    def from_pretrained(cls, model: str, media_budget: MediaBudget | None = None, temperature: float = 0.0,
                        top_p: float = 1.0, max_images: int = 32, max_model_len: int | None = 32768,
                        gpu_memory_utilization: float = 0.9, seed: int = 0, token_in_out: bool = False,
                        **engine_kwargs: Any) -> "VLLMPolicy":
        """Start an engine on ``model`` (hub id or folder); ``engine_kwargs`` go to ``vllm.LLM``."""
        vllm = import_vllm()
        kwargs: dict[str, Any] = {"model": model, "enable_prefix_caching": True, "seed": seed,
                                  "limit_mm_per_prompt": {"image": max_images, "video": 1},
                                  "gpu_memory_utilization": gpu_memory_utilization}
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(engine_kwargs)
        return cls(vllm.LLM(**kwargs), media_budget=media_budget, temperature=temperature, top_p=top_p,
                   max_images=max_images, token_in_out=token_in_out)

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ----- episode API ----------------------------------------------------------------------------
    def _append(self, session: VLLMSession, view: View, text: str) -> int:
        session.prompt += text
        if self.token_in_out:
            session.prompt_ids += self._tokens(text)
        session.images += view.images
        for clip in view.videos:
            session.video, session.fps, session.video_times = clip.array(), clip.fps, clip.padded_times()
        added = view.visual_tokens + math.ceil(len(text) / 3)
        session.context_tokens += added
        return added

    def start(self, view: View, seed: int = 0, task: Task | None = None) -> VLLMSession:
        session = VLLMSession(seed=seed, task=task)
        self._append(session, view, view.text())
        return session

    def _request(self, session: VLLMSession) -> dict[str, Any]:
        mm: dict[str, Any] = {}
        if session.images:
            mm["image"] = list(session.images)
        video_kwargs: dict[str, Any] = {}
        if session.video is not None:
            item, video_kwargs = self.family.vllm_video(session.video, session.video_times, session.fps)
            mm["video"] = [item]
        req: dict[str, Any] = ({"prompt_token_ids": list(session.prompt_ids)} if self.token_in_out
                               else {"prompt": session.prompt})
        if mm:
            req["multi_modal_data"] = mm
            req["mm_processor_kwargs"] = {"do_resize": False, **video_kwargs}
        return req

    def generate(self, sessions: Sequence[VLLMSession], max_new_tokens: int) -> list[Generation]:
        vllm = import_vllm()
        params = [vllm.SamplingParams(temperature=self.sampling["temperature"], top_p=self.sampling["top_p"],
                                      max_tokens=max_new_tokens, stop=list(STOP_STRINGS),
                                      include_stop_str_in_output=True, skip_special_tokens=True,
                                      seed=(s.seed * 1_000_003 + s.turn) % 2 ** 31,
                                      **({"logprobs": 0} if self.token_in_out else {}))
                  for s in sessions]
        t0 = time.perf_counter()
        outputs = self.llm.generate([self._request(s) for s in sessions], sampling_params=params, use_tqdm=False)
        seconds = (time.perf_counter() - t0) / max(1, len(sessions))
        gens = []
        for s, out in zip(sessions, outputs):
            done = out.outputs[0]
            ids = list(done.token_ids)
            prompt_len = len(out.prompt_token_ids or ())
            cached = getattr(out, "num_cached_tokens", None) or 0
            s.turn += 1
            s.prompt += done.text
            s.context_tokens = prompt_len + len(ids)
            logprobs = self._record(s, list(out.prompt_token_ids or ()), ids, done.logprobs) if self.token_in_out else []
            gens.append(Generation(text=done.text, token_ids=ids, logprobs=logprobs,
                                   truncated=done.finish_reason == "length",
                                   prefill_tokens=max(0, prompt_len - cached), seconds=seconds))
        return gens

    @staticmethod
    def _record(s: VLLMSession, expanded_prompt: list[int], ids: list[int], logprobs: Any) -> list[float]:
        """Grow the session's expanded ids by this turn's new prompt part (mask 0) and its generated ids (mask 1)."""
        if expanded_prompt[:len(s.token_ids)] != s.token_ids:
            raise RuntimeError(f"vLLM's prompt for turn {s.turn} does not extend the episode's earlier tokens: "
                               "the engine's tokenizer or processor differs from the one the episode began with")
        if not s.token_ids:
            s.prompt_length = len(expanded_prompt)
        if logprobs is None or len(logprobs) != len(ids):
            raise RuntimeError("vLLM returned no log-probabilities for the sampled tokens (token_in_out needs them)")
        lps = [float(step[tok].logprob) for step, tok in zip(logprobs, ids)]
        s._append(expanded_prompt[len(s.token_ids):], policy=False)
        s._append(ids, policy=True, logprobs=lps)
        s.prompt_ids += ids
        return lps

    def observe(self, session: VLLMSession, view: View) -> int:
        closed = bool(session.prompt_ids) and session.prompt_ids[-1] == self.im_end_id
        return self._append(session, view, view.text(close_turn=not closed))

    def end(self, session: VLLMSession) -> None:
        session.images, session.video = [], None
