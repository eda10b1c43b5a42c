"""The transformers backend: Qwen2.5-VL and Qwen3-VL (dense and MoE) with a KV cache kept across turns.

Each view the agent renders becomes a :class:`~mmagent.policy.segments.Segment`: the view's text and fitted
media through the model's real processor, with M-RoPE positions placed after what the session holds.

Why not ``model.generate`` per turn: it would re-encode the whole conversation (every image again)
each turn, and it drops ``pixel_values`` after its first step, so observation images could not be
added to a running cache. Instead each episode keeps its own ``DynamicCache``. A turn forwards only
what is new since the last forward — the previous turn's last sampled token plus the observation
segment — with explicit M-RoPE positions, then decodes token by token. ``Generation.prefill_tokens``
records how many tokens each turn ran through the model, which is how the reuse is measured;
``reuse_cache=False`` gives the re-encode-everything baseline (same outputs, more compute).

Open episodes generate together (``batch_decode=True``, the default) through the continuous-batching
stream of :mod:`mmagent.policy.batching`; one session alone decodes here, token by token. Tokens are picked
by a :class:`~mmagent.policy.sampling.TokenChooser` (sampling, or scripted turns in tests and SFT data).

The model's family (:func:`~mmagent.policy.families.family_of` its config) decides how views are rendered and
what video metadata the processor gets; nothing below branches on it. A checkpoint of another family is
refused with the list of supported ones.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from PIL import Image
from transformers import DynamicCache

from mmagent.policy.base import Generation, Policy, Session, TurnStream
from mmagent.policy.batching import DecodeStream, SharedPrefixes, TurnInProgress, forward_many
from mmagent.policy.families import Family, family_of
from mmagent.policy.placement import budget_for, is_local, placement
from mmagent.policy.render import (IM_END, IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START, MediaBudget, Message,
                                   Part, VideoClip, View)
from mmagent.policy.sampling import Sampler, SamplingConfig, TokenChooser
from mmagent.policy.segments import (VISION_INPUTS, Segment, concat_segments, on_device, text_positions,
                                     text_segment)
from mmagent.protocol import STOP_STRINGS
from mmagent.trajectory import Task

log = logging.getLogger(__name__)

#: tokens a policy must never generate: a vision placeholder the model wrote would need pixels it has not got
VISION_TOKENS = (VISION_START, VISION_END, "<|vision_pad|>", IMAGE_PAD, VIDEO_PAD)


@dataclass
class HFSession(Session):
    segments: list[Segment] = field(default_factory=list)  # the whole conversation, in order
    pending: list[Segment] = field(default_factory=list)  # not yet run through the model
    cache: Any = None
    counter: int = 0  # M-RoPE position counter after everything in ``segments``
    last_token: int | None = None
    turn: int = 0
    rng: torch.Generator | None = None


class HFPolicy(Policy):
    """A transformers image-text-to-text model as the agent's policy."""

    thread_safe_start = True

    def __init__(self, model: Any, processor: Any, media_budget: MediaBudget | None = None,
                 sampling: SamplingConfig | None = None, reuse_cache: bool = True,
                 chooser: TokenChooser | None = None, batch_decode: bool = True, family: Family | None = None) -> None:
        #: raises UnsupportedModel (naming the supported families) for a model of another family
        self.family = family or family_of(model.config)
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.media_budget = media_budget or MediaBudget()
        #: how sessions pick tokens unless they say otherwise (:attr:`Session.sampling`)
        self.sampling = sampling or SamplingConfig()
        self.reuse_cache = reuse_cache
        #: decode the open episodes together (one forward per token for all); False: one after another
        self.batch_decode = batch_decode
        self.chooser: TokenChooser = chooser or Sampler()
        tok = self.tokenizer
        vocab = tok.get_vocab()
        self.suppress_ids = torch.tensor([vocab[t] for t in VISION_TOKENS if t in vocab], dtype=torch.long)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = {i for i in eos + [tok.eos_token_id, vocab.get(IM_END)] if i is not None}
        ip = processor.image_processor
        self.patch_factor = int(ip.patch_size) * int(ip.merge_size)
        self._check_chat_template()

    # ----- construction ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str, device: str | None = None, dtype: Any = None,
                        media_budget: MediaBudget | None = None, **kwargs: Any) -> "HFPolicy":
        """Load ``name_or_path`` (a hub id such as ``Qwen/Qwen2.5-VL-7B-Instruct`` or
        ``Qwen/Qwen3-VL-8B-Instruct``, or a local folder) on ``device`` in ``dtype`` (defaults: :func:`~mmagent.policy.placement.placement`).

        A folder written by mmagent's trainers holds ``mmagent.json`` with the pixel budget it was trained
        at; that budget is used unless ``media_budget`` is given.
        """
        from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

        device, dtype = placement(device, dtype)
        if is_local(name_or_path) and not os.path.isdir(os.path.expanduser(name_or_path)):
            raise FileNotFoundError(f"no model folder at {name_or_path!r} (build one offline with "
                                    f"`mmagent make-tiny {name_or_path}`, or pass a hub id)")
        name_or_path = os.path.expanduser(name_or_path)
        try:
            family_of(AutoConfig.from_pretrained(name_or_path))  # before any weights: name the supported families
            processor = AutoProcessor.from_pretrained(name_or_path)
            model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype)
        except OSError as exc:
            raise OSError(f"could not load model {name_or_path!r}: {exc}\nPass a hub id you can download, or a "
                          "local folder saved with save_pretrained (try `mmagent make-tiny ./tiny-qwen`).") from exc
        return cls(model.to(device), processor, media_budget=budget_for(name_or_path, media_budget), **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _check_chat_template(self) -> None:
        """Warn when the model's own chat template writes a prompt other than the renderer's (views are
        rendered for the model's family; a model trained on another format would read them wrong)."""
        if not getattr(self.processor, "chat_template", None):
            return
        probe = View([Message("system", [Part(text="S")]),
                      Message("user", [Part(video=VideoClip([Image.new("RGB", (28, 28))], [0.0], 1.0)),
                                       Part(image=Image.new("RGB", (28, 28))), Part(text="Q")])], continues=False,
                     family=self.family)
        templated = self.processor.apply_chat_template(
            [{"role": "system", "content": "S"},
             {"role": "user", "content": [{"type": "video"}, {"type": "image"}, {"type": "text", "text": "Q"}]}],
            tokenize=False, add_generation_prompt=True)
        if templated != probe.text():
            log.warning("this model's chat template writes %r where mmagent renders %r: prompts follow %s's chat "
                        "format, which this model may not read as it was trained", templated, probe.text(),
                        self.family.label)

    # ----- encoding -------------------------------------------------------------------------------
    def _encode(self, session: HFSession, view: View) -> Segment:
        """Run the real processor over ``view`` and place the segment after what the session holds."""
        text = view.text(close_turn=session.last_token not in self.eos_ids)
        kwargs: dict[str, Any] = {"return_tensors": "pt", "return_mm_token_type_ids": True}
        if view.images:
            kwargs["images"] = view.images
        if view.videos:
            from transformers.video_utils import VideoMetadata

            arrays = [clip.array() for clip in view.videos]
            meta = [VideoMetadata(total_num_frames=len(a), width=clip.size[0], height=clip.size[1],
                                  **self.family.video_metadata(clip.padded_times(), clip.fps))
                    for a, clip in zip(arrays, view.videos)]
            kwargs.update(videos=arrays, video_metadata=meta, do_sample_frames=False, cap_pixels_per_frame=True)
        if view.images or view.videos:
            kwargs["do_resize"] = False  # the renderer sized them within the pixel budget
        enc = self.processor(text=[text], **kwargs)
        ids = enc["input_ids"][0]
        mm_types = enc.get("mm_token_type_ids", torch.zeros_like(enc["input_ids"]))[0]
        vision = {k: enc[k] for k in VISION_INPUTS if k in enc and enc[k] is not None}
        if "second_per_grid_ts" in vision and not torch.is_tensor(vision["second_per_grid_ts"]):
            vision["second_per_grid_ts"] = torch.tensor(vision["second_per_grid_ts"], dtype=torch.float)
        if mm_types.any():
            pos, _ = self.model.model.get_rope_index(
                ids[None], mm_types[None], image_grid_thw=vision.get("image_grid_thw"),
                video_grid_thw=vision.get("video_grid_thw"), second_per_grid_ts=vision.get("second_per_grid_ts"))
            positions = pos[:, 0] + session.counter
        else:
            positions = text_positions(len(ids), session.counter)
        if int(mm_types[-1]) != 0:
            raise AssertionError("a segment must end with text")
        return Segment(ids=ids, mm_types=mm_types, positions=positions, vision=vision)

    def _add(self, session: HFSession, seg: Segment, policy: bool, logprobs: Sequence[float] | None = None) -> None:
        session.segments.append(seg)
        session.pending.append(seg)
        session.counter = seg.end_counter
        session._append(seg.ids.tolist(), policy, logprobs)

    # ----- episode API ----------------------------------------------------------------------------
    def start(self, view: View, seed: int = 0, task: Task | None = None) -> HFSession:
        session = HFSession(seed=seed, task=task, sampling=self.sampling)
        self._add(session, self._encode(session, view), policy=False)
        session.prompt_length = len(session.token_ids)
        return session

    def observe(self, session: HFSession, view: View) -> int:
        seg = self._encode(session, view)
        self._add(session, seg, policy=False)
        return len(seg.ids)

    def append_turn(self, session: HFSession, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Append a policy turn that was not generated here, as prompt the next turn runs through the model:
        how training re-encodes an episode, and how the server takes an assistant turn a client sends."""
        self._add(session, text_segment(ids, session.counter), policy=True, logprobs=logprobs)
        session.last_token = int(ids[-1])
        session.turn += 1

    def end(self, session: HFSession) -> None:
        session.cache = None
        session.pending = []

    def compact(self, session: HFSession) -> None:
        """Drop the encoded inputs (pixel values above all) that are already in the session's KV cache: a
        session that only goes on generating (``mmagent serve`` keeps many) then holds its cache and ids. Its
        :meth:`model_inputs` are gone afterwards. Without cache reuse every turn re-runs the inputs: no-op."""
        if not self.reuse_cache:
            return
        keep = {id(seg) for seg in session.pending}
        session.segments = [seg for k, seg in enumerate(session.segments)
                            if id(seg) in keep or k == len(session.segments) - 1]

    def session_nbytes(self, session: HFSession) -> int:
        """Bytes of tensors the session holds: its KV cache and the encoded inputs it keeps."""
        total = 0
        if session.cache is not None:
            for layer in session.cache.layers:
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                    if torch.is_tensor(t):
                        total += t.numel() * t.element_size()
        seen: set[int] = set()
        for seg in [*session.segments, *session.pending]:
            for t in (seg.ids, seg.mm_types, seg.positions, *seg.vision.values()):
                if torch.is_tensor(t) and id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
        return total + 8 * len(session.token_ids)

    def model_inputs(self, session: HFSession) -> dict[str, torch.Tensor]:
        """The whole conversation as one forward's inputs (what training computes its loss on)."""
        return concat_segments(session.segments)

    def generate(self, sessions: Sequence[HFSession], max_new_tokens: int) -> list[Generation]:
        if not (self.batch_decode and self.reuse_cache and len(sessions) > 1):
            return [self._generate_one(s, max_new_tokens) for s in sessions]
        stream = DecodeStream(self, max_new_tokens)
        for s in sessions:
            stream.add(s)
        done: dict[int, Generation] = {}
        while len(stream):
            done.update((id(s), gen) for s, gen in stream.step())
        return [done[id(s)] for s in sessions]

    def stream(self, max_new_tokens: int) -> TurnStream:
        if self.batch_decode and self.reuse_cache:
            return DecodeStream(self, max_new_tokens)
        return TurnStream(self, max_new_tokens)

    # ----- turns (also driven by the decode stream) -----------------------------------------------
    def _forward(self, session: HFSession, segments: Sequence[Segment]) -> torch.Tensor:
        """Run ``segments`` through the model on top of the session's cache; return the last logits."""
        if session.cache is None:
            session.cache = DynamicCache(config=self.model.config)
        out = self.model(**on_device(self.model, concat_segments(segments)), cache=session.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[0, -1].float()

    def _to_prefill(self, session: HFSession, prefixes: SharedPrefixes | None) -> tuple[list[Segment], int]:
        """The segments this turn must run through the model, and the tokens spent now on a shared prefix."""
        if not self.reuse_cache:
            session.cache = None
            return list(session.segments), 0
        segments, computed = list(session.pending), 0
        if prefixes is not None and session.cache is None and len(segments) == 1:
            session.cache, head, computed = prefixes.cache_for(self, segments[0])
            if head:
                segments = [segments[0].tail(head)]
        return segments, computed

    def begin_turns(self, sessions: Sequence[HFSession], prefixes: SharedPrefixes | None = None
                    ) -> list[TurnInProgress]:
        """Start a turn for each session, prefilling all of their new tokens in one forward where they can
        (every session that already has a cache: an earlier turn or a shared prefix); the rest one by one.
        The turn's first logits are in ``turn.logits``."""
        t0 = time.perf_counter()
        work = []
        for s in sessions:
            self.chooser.begin_turn(s, self.tokenizer)
            work.append((s, *self._to_prefill(s, prefixes)))
        together = [(s, segments) for s, segments, _ in work if s.cache is not None and s.cache.get_seq_length()]
        logits: dict[int, torch.Tensor] = {}
        if len(together) > 1:
            rows = forward_many(self, [s for s, _ in together], [segments for _, segments in together])
            logits = {id(s): rows[r] for r, (s, _) in enumerate(together)}
        turns = []
        for s, segments, computed in work:
            turn = TurnInProgress(s, start=s.counter, prefilled=sum(len(g.ids) for g in segments) + computed, t0=t0)
            turn.logits = logits[id(s)] if id(s) in logits else self._forward(s, segments)
            s.pending = []
            turns.append(turn)
        return turns

    def _is_stop(self, generated: list[int]) -> bool:
        tail = self.tokenizer.decode(generated[-16:], skip_special_tokens=False)
        return any(s in tail for s in STOP_STRINGS)

    def pick(self, turn: TurnInProgress, logits: torch.Tensor, max_new_tokens: int) -> None:
        """Choose ``turn``'s next token from ``logits``; mark the turn done at a stop or the token limit."""
        logits[self.suppress_ids.to(logits.device)] = float("-inf")
        session = turn.session
        token = self.chooser.choose(logits, session)
        scale = session.sampling.temperature if session.sampling.temperature > 0 else 1.0
        turn.logprobs.append(float(torch.log_softmax(logits / scale, dim=-1)[token]))
        turn.generated.append(token)
        if token in self.eos_ids or self._is_stop(turn.generated):
            turn.done = True
        elif len(turn.generated) >= max_new_tokens:
            turn.done = turn.truncated = True

    def finish_turn(self, turn: TurnInProgress, seconds: float) -> Generation:
        """Append the finished turn to its session and report it. Its tokens but the last went through the
        model as they were decoded: the last goes in with the next segment."""
        session = turn.session
        self.append_turn(session, turn.generated, turn.logprobs)
        last = session.segments[-1]
        session.pending = [Segment(last.ids[-1:], last.mm_types[-1:], last.positions[:, -1:])]
        text = self.tokenizer.decode(turn.generated, skip_special_tokens=True)
        return Generation(text=text, token_ids=turn.generated, logprobs=turn.logprobs, truncated=turn.truncated,
                          prefill_tokens=turn.prefilled, seconds=seconds)

    @torch.inference_mode()
    def _generate_one(self, session: HFSession, max_new_tokens: int) -> Generation:
        turn = self.begin_turns([session])[0]
        while True:
            self.pick(turn, turn.logits, max_new_tokens)
            if turn.done:
                break
            turn.logits = self._forward(session, [text_segment([turn.generated[-1]],
                                                               turn.start + len(turn.generated) - 1)])
        return self.finish_turn(turn, time.perf_counter() - turn.t0)
