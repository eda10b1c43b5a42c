"""The transformers backend: Qwen2.5-VL (and same-family models) with a KV cache kept across turns.

Why not ``model.generate`` per turn: it would re-encode the whole conversation (every image again)
each turn, and it drops ``pixel_values`` after its first step, so observation images could not be
added to a running cache. Instead each episode keeps its own ``DynamicCache``. A turn forwards only
what is new since the last forward — the previous turn's last sampled token plus the observation
segment — with explicit M-RoPE positions, then decodes token by token. ``Generation.prefill_tokens``
records how many tokens each turn ran through the model, which is how the reuse is measured;
``reuse_cache=False`` gives the re-encode-everything baseline (same outputs, more compute).

Open episodes generate together (``batch_decode=True``, the default) through a continuous-batching
stream (:meth:`HFPolicy.stream`, used by the agent): the sessions that are ready prefill their new tokens
in one forward (each row's cache and new tokens left-padded, the padding masked), their caches join the
stacked, left-padded decode batch, and every decode step is one forward for all rows, each with its own
positions. A session whose turn stops leaves at once with its cache row; one whose tool result arrives
joins between two tokens, so no episode waits for another's turn or tool. The first prompts' shared head
(system prompt and tool schemas, up to the first image or video) is computed once per stream and copied
(:class:`SharedPrefixes`). Greedy results equal the one-at-a-time loop's token for token (the tests check
this).

Positions: Qwen2.5-VL's ``get_rope_index`` walks the sequence with a counter that text tokens
advance by one and a vision block advances by ``max(h, w) / merge``. Every segment ends with text, so
a segment's positions are its own ``get_rope_index`` shifted by the counter at its start; the test
suite checks this equals ``get_rope_index`` over the whole sequence.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch
from PIL import Image
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from mmagent.media import EpisodeMedia
from mmagent.policy.base import (Generation, MediaBudget, Policy, SamplingConfig, Session, TurnStream, fit_image,
                                 fitted_size, visual_token_count)
from mmagent.protocol import RESPONSE_CLOSE, RESPONSE_OPEN, STOP_STRINGS
from mmagent.toolbox.base import Observation

# ChatML as the Qwen family writes it; observation segments are built with these directly because
# Qwen2.5-VL's stock chat template drops images in tool-role turns.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
VISION_INPUTS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


@dataclass
class Segment:
    """A run of tokens with their M-RoPE positions and the vision inputs their placeholders need."""

    ids: torch.Tensor  # (L,)
    mm_types: torch.Tensor  # (L,) 0 text, 1 image, 2 video
    positions: torch.Tensor  # (3, L)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)

    def tail(self, start: int) -> "Segment":
        """The tokens from ``start`` on (with all the vision inputs: ``start`` must come before any)."""
        return Segment(self.ids[start:], self.mm_types[start:], self.positions[:, start:], self.vision)

    @property
    def end_counter(self) -> int:
        # Segments end in text, whose next position is the last one plus one.
        return int(self.positions[:, -1].max()) + 1


@dataclass
class HFSession(Session):
    segments: list[Segment] = field(default_factory=list)  # the whole conversation, in order
    forwarded: int = 0  # how many of ``segments`` (and tokens of the last one) are already in the cache
    pending: list[Segment] = field(default_factory=list)  # not yet run through the model
    cache: Any = None
    counter: int = 0  # M-RoPE position counter after everything in ``segments``
    last_token: int | None = None
    turn: int = 0
    rng: torch.Generator | None = None


class TokenChooser(Protocol):
    """Picks each next token. The default samples; tests and SFT data replay scripted text."""

    def begin_turn(self, session: HFSession, tokenizer: Any) -> None: ...

    def choose(self, logits: torch.Tensor, session: HFSession) -> int: ...


class Sampler:
    """Greedy or temperature/top-p/top-k sampling with a per-session seeded generator."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config

    def begin_turn(self, session: HFSession, tokenizer: Any) -> None:
        if session.rng is None:
            session.rng = torch.Generator().manual_seed(session.seed)

    def choose(self, logits: torch.Tensor, session: HFSession) -> int:
        cfg = self.config
        if cfg.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / cfg.temperature
        if cfg.top_k > 0:
            kth = torch.topk(logits, min(cfg.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if cfg.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            drop = torch.cumsum(sorted_p, 0) - sorted_p > cfg.top_p
            sorted_p[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=session.rng))


#: written next to a trained checkpoint: what the policy was trained with (pixel budget, tools)
POLICY_FILE = "mmagent.json"


def saved_policy_record(folder: str | os.PathLike) -> dict[str, Any]:
    """``folder/mmagent.json`` (pixel budget, tools, how it was trained), or {} (a hub id, a plain folder)."""
    path = Path(folder).expanduser() / POLICY_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def saved_media_budget(folder: str | os.PathLike) -> MediaBudget | None:
    """The pixel budget recorded in ``folder/mmagent.json``, or None."""
    record = saved_policy_record(folder)
    return MediaBudget(**record["media_budget"]) if "media_budget" in record else None


class HFPolicy(Policy):
    """A transformers image-text-to-text model as the agent's policy."""

    thread_safe_start = True

    def __init__(self, model: Any, processor: Any, media_budget: MediaBudget | None = None,
                 sampling: SamplingConfig | None = None, reuse_cache: bool = True,
                 chooser: TokenChooser | None = None, batch_decode: bool = True) -> None:
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.media_budget = media_budget or MediaBudget()
        self.sampling = sampling or SamplingConfig()
        self.reuse_cache = reuse_cache
        #: decode the open episodes together (one forward per token for all); False: one after another
        self.batch_decode = batch_decode
        self.chooser: TokenChooser = chooser or Sampler(self.sampling)
        tok = self.tokenizer
        self.image_token = getattr(processor, "image_token", "<|image_pad|>")
        vocab = tok.get_vocab()
        self.suppress_ids = torch.tensor([vocab[t] for t in VISION_TOKENS if t in vocab], dtype=torch.long)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.eos_ids = {i for i in eos + [tok.eos_token_id, vocab.get(IM_END)] if i is not None}
        self.im_end_id = vocab.get(IM_END)
        ip = processor.image_processor
        self.patch_factor = int(ip.patch_size) * int(ip.merge_size)

    # ----- construction ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str, device: str | None = None, dtype: str | torch.dtype = "auto",
                        **kwargs: Any) -> "HFPolicy":
        """Load ``name_or_path`` (a hub id such as ``Qwen/Qwen2.5-VL-7B-Instruct`` or a local folder).

        A folder written by mmagent's trainers holds ``mmagent.json`` with the pixel budget it was trained
        at; that budget is used unless ``media_budget`` is given.
        """
        from transformers import AutoModelForImageTextToText, AutoProcessor

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        looks_local = os.path.isabs(name_or_path) or name_or_path.startswith((".", "~")) or os.path.exists(name_or_path)
        if looks_local and not os.path.isdir(os.path.expanduser(name_or_path)):
            raise FileNotFoundError(f"no model folder at {name_or_path!r} (build one offline with "
                                    f"`mmagent make-tiny {name_or_path}`, or pass a hub id)")
        name_or_path = os.path.expanduser(name_or_path)
        try:
            processor = AutoProcessor.from_pretrained(name_or_path)
            model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype)
        except OSError as exc:
            raise OSError(f"could not load model {name_or_path!r}: {exc}\nPass a hub id you can download, or a "
                          "local folder saved with save_pretrained (try `mmagent make-tiny ./tiny-qwen`).") from exc
        if kwargs.get("media_budget") is None:
            kwargs["media_budget"] = saved_media_budget(name_or_path)
        return cls(model.to(device), processor, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ----- encoding -------------------------------------------------------------------------------
    def _fit_image(self, image: Image.Image, min_pixels: int, max_pixels: int) -> Image.Image:
        return fit_image(image, min_pixels, max_pixels, self.patch_factor)

    def visual_tokens(self, images: Sequence[Image.Image]) -> int:
        b = self.media_budget
        return visual_token_count(images, b.observation_min_pixels, b.observation_max_pixels, self.patch_factor)

    def _encode(self, session: HFSession, text: str, images: Sequence[Image.Image] = (),
                videos: Sequence[Any] = (), video_metadata: Sequence[dict] = ()) -> Segment:
        """Run the real processor over one segment and place it after what the session has."""
        kwargs: dict[str, Any] = {"return_tensors": "pt", "return_mm_token_type_ids": True}
        if images:
            kwargs["images"] = list(images)
        if videos:
            kwargs.update(videos=list(videos), video_metadata=list(video_metadata), do_sample_frames=False,
                          cap_pixels_per_frame=True)
        if images or videos:
            kwargs["do_resize"] = False  # already sized by qwen-vl-utils within the pixel budget
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
            positions = _text_positions(len(ids), session.counter)
        if int(mm_types[-1]) != 0:
            raise AssertionError("a segment must end with text")
        seg = Segment(ids=ids, mm_types=mm_types, positions=positions, vision=vision)
        session.visual_tokens += int((mm_types != 0).sum())
        return seg

    def _add(self, session: HFSession, seg: Segment, policy: bool, logprobs: Sequence[float] | None = None) -> None:
        session.segments.append(seg)
        session.pending.append(seg)
        session.counter = seg.end_counter
        session._append(seg.ids.tolist(), policy, logprobs)

    def _text_segment(self, ids: Sequence[int], start: int) -> Segment:
        t = torch.tensor(list(ids), dtype=torch.long)
        return Segment(ids=t, mm_types=torch.zeros_like(t), positions=_text_positions(len(t), start))

    # ----- episode API ----------------------------------------------------------------------------
    def _fit_frames(self, frames: Sequence[Image.Image], fps: float) -> tuple[Any, Any]:
        """Frames resized to one size within the per-frame budget, as the video processor takes them.

        qwen-vl-utils' ``fetch_video`` is not used for frame lists: it pre-resizes each frame with twice
        the patch factor, which rounds small frames to zero pixels (qwen-vl-utils 0.0.14).
        """
        import numpy as np
        from transformers.video_utils import VideoMetadata

        b = self.media_budget
        w, h = fitted_size(*frames[0].size, b.video_min_pixels, b.video_max_pixels, self.patch_factor)
        resized = [f.convert("RGB").resize((w, h), Image.BICUBIC) for f in frames]
        temporal = int(getattr(self.processor.video_processor, "temporal_patch_size", 2))
        resized += [resized[-1]] * (-len(resized) % temporal)  # whole temporal patches, as qwen-vl-utils pads
        video = np.stack([np.asarray(f) for f in resized])
        meta = VideoMetadata(total_num_frames=len(resized), fps=fps, frames_indices=list(range(len(resized))),
                             width=w, height=h)
        return video, meta

    def start(self, system_prompt: str, question: str, media: EpisodeMedia, seed: int = 0) -> HFSession:
        session = HFSession(media=media, seed=seed)
        b = self.media_budget
        content: list[dict[str, Any]] = []
        images, videos, metadata = [], [], []
        if media.video is not None:
            frames = media.video.sample_uniform(b.video_frames)
            session.initial_frame_times = [f.timestamp for f in frames]
            video, meta = self._fit_frames([f.image for f in frames], fps=len(frames) / media.video.duration)
            media.set_view_size("video", (int(video.shape[2]), int(video.shape[1])))
            videos.append(video)
            metadata.append(meta)
            content.append({"type": "video"})
        if media.image is not None:
            image = self._fit_image(media.image, b.image_min_pixels, b.image_max_pixels)
            media.set_view_size("image", image.size)
            images.append(image)
            content.append({"type": "image"})
        content.append({"type": "text", "text": question})
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": content}]
        prompt = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        seg = self._encode(session, prompt, images=images, videos=videos, video_metadata=metadata)
        self._add(session, seg, policy=False)
        session.prompt_length = len(session.token_ids)
        return session

    def observe(self, session: HFSession, observation: Observation) -> int:
        b = self.media_budget
        lines = [RESPONSE_OPEN, observation.text]
        images = []
        handles = observation.handles or [f"image {k + 1}" for k in range(len(observation.images))]
        labels = observation.image_labels or [""] * len(observation.images)
        for im, handle, label in zip(observation.images, handles, labels):
            fitted = self._fit_image(im, b.observation_min_pixels, b.observation_max_pixels)
            session.media.set_view_size(handle, fitted.size)
            images.append(fitted)
            name = f"{handle} ({label})" if label else handle
            lines.append(f"{name}: {VISION_START}{self.image_token}{VISION_END}")
        lines.append(RESPONSE_CLOSE)
        # Close the assistant turn unless the model already did.
        close = "" if session.last_token in self.eos_ids else IM_END
        text = f"{close}\n{IM_START}user\n" + "\n".join(lines) + f"{IM_END}\n{IM_START}assistant\n"
        seg = self._encode(session, text, images=images)
        self._add(session, seg, policy=False)
        return len(seg.ids)

    def end(self, session: HFSession) -> None:
        session.cache = None
        session.pending = []

    # ----- model calls ----------------------------------------------------------------------------
    def _forward(self, session: HFSession, segments: Sequence[Segment]) -> torch.Tensor:
        """Run ``segments`` through the model on top of the session's cache; return the last logits."""
        if session.cache is None:
            session.cache = DynamicCache(config=self.model.config)
        out = self.model(**self._on_device(concat_segments(segments)), cache=session.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[0, -1].float()

    def _on_device(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Model inputs on the model's device, pixels in its dtype."""
        dev = self.device
        out = {k: v.to(dev) for k, v in inputs.items()}
        for key in ("pixel_values", "pixel_values_videos"):
            if key in out:
                out[key] = out[key].to(self.model.dtype)
        return out

    def _to_prefill(self, session: HFSession, prefixes: "SharedPrefixes | None") -> tuple[list[Segment], int]:
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

    def _forward_many(self, sessions: Sequence[HFSession], work: Sequence[Sequence[Segment]]) -> torch.Tensor:
        """``work[i]`` run on top of ``sessions[i]``'s cache for every i in one forward; the last logits of each.

        The caches are stacked left-padded and each row's new tokens left-padded after them, so a row
        reads ``[pad, its cache, pad, its new tokens]`` with the padding masked out. Each session then
        gets its own cache back without the padding.
        """
        config, dev = self.model.config, self.device
        stacked = _StackedCache.of([s.cache for s in sessions], config, roomy=False)
        chunks = [concat_segments(segments) for segments in work]
        lengths = [c["input_ids"].shape[1] for c in chunks]
        rows, past, width = len(chunks), stacked.width, max(lengths)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((rows, width), pad, dtype=torch.long)
        types = torch.zeros((rows, width), dtype=torch.long)
        positions = torch.zeros((3, rows, width), dtype=torch.long)
        mask = torch.zeros((rows, past + width), dtype=torch.long)
        for r, (chunk, n) in enumerate(zip(chunks, lengths)):
            ids[r, width - n:] = chunk["input_ids"][0]
            types[r, width - n:] = chunk["mm_token_type_ids"][0]
            positions[:, r, width - n:] = chunk["position_ids"][:, 0]
            mask[r, past - stacked.lengths[r]:past] = 1
            mask[r, past + width - n:] = 1
        inputs = {key: torch.cat([c[key] for c in chunks if key in c])
                  for key in VISION_INPUTS if any(key in c for c in chunks)}
        inputs.update(input_ids=ids, position_ids=positions, attention_mask=mask, mm_token_type_ids=types)
        out = self.model(**self._on_device(inputs), cache=stacked.cache, use_cache=True, logits_to_keep=1)
        for r, session in enumerate(sessions):
            real = mask[r].nonzero().squeeze(1).to(dev)
            session.cache = DynamicCache(config=config, ddp_cache_data=[
                (layer.keys[r:r + 1].index_select(2, real), layer.values[r:r + 1].index_select(2, real))
                for layer in stacked.cache.layers])
        return out.logits[:, -1].float()

    def _is_stop(self, generated: list[int]) -> bool:
        tail = self.tokenizer.decode(generated[-16:], skip_special_tokens=False)
        return any(s in tail for s in STOP_STRINGS)

    def _pick(self, turn: "_Turn", logits: torch.Tensor, max_new_tokens: int) -> None:
        """Choose ``turn``'s next token from ``logits``; mark the turn done at a stop or the token limit."""
        logits[self.suppress_ids.to(logits.device)] = float("-inf")
        token = self.chooser.choose(logits, turn.session)
        scale = self.sampling.temperature if self.sampling.temperature > 0 else 1.0
        turn.logprobs.append(float(torch.log_softmax(logits / scale, dim=-1)[token]))
        turn.generated.append(token)
        if token in self.eos_ids or self._is_stop(turn.generated):
            turn.done = True
        elif len(turn.generated) >= max_new_tokens:
            turn.done = turn.truncated = True

    def _begin(self, session: HFSession, prefixes: "SharedPrefixes | None" = None) -> "_Turn":
        return self._begin_many([session], prefixes)[0]

    def _finish_turn(self, turn: "_Turn", seconds: float) -> Generation:
        self.append_turn(turn.session, turn.generated, turn.logprobs)
        text = self.tokenizer.decode(turn.generated, skip_special_tokens=True)
        return Generation(text=text, token_ids=turn.generated, logprobs=turn.logprobs, truncated=turn.truncated,
                          prefill_tokens=turn.prefilled, seconds=seconds)

    @torch.inference_mode()
    def _generate_one(self, session: HFSession, max_new_tokens: int) -> Generation:
        turn = self._begin(session)
        while True:
            self._pick(turn, turn.logits, max_new_tokens)
            if turn.done:
                break
            turn.logits = self._forward(session, [self._text_segment([turn.generated[-1]],
                                                                     turn.start + len(turn.generated) - 1)])
        return self._finish_turn(turn, time.perf_counter() - turn.t0)

    def append_turn(self, session: HFSession, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Append a policy turn's tokens to the session as generation does (also how training re-encodes
        an episode without generating). The last token is not in the cache yet: it goes in with the next
        segment."""
        seg = self._text_segment(ids, session.counter)
        self._add(session, seg, policy=True, logprobs=logprobs)
        session.pending = [Segment(seg.ids[-1:], seg.mm_types[-1:], seg.positions[:, -1:])]
        session.last_token = int(ids[-1])
        session.turn += 1

    def _begin_many(self, sessions: Sequence[HFSession], prefixes: "SharedPrefixes | None" = None) -> list["_Turn"]:
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
            rows = self._forward_many([s for s, _ in together], [segments for _, segments in together])
            logits = {id(s): rows[r] for r, (s, _) in enumerate(together)}
        turns = []
        for s, segments, computed in work:
            turn = _Turn(s, start=s.counter, prefilled=sum(len(g.ids) for g in segments) + computed, t0=t0)
            turn.logits = logits[id(s)] if id(s) in logits else self._forward(s, segments)
            s.pending = []
            turns.append(turn)
        return turns

    def generate(self, sessions: Sequence[HFSession], max_new_tokens: int) -> list[Generation]:
        if not (self.batch_decode and self.reuse_cache and len(sessions) > 1):
            return [self._generate_one(s, max_new_tokens) for s in sessions]
        stream = _DecodeStream(self, max_new_tokens)
        for s in sessions:
            stream.add(s)
        done: dict[int, Generation] = {}
        while len(stream):
            done.update((id(s), gen) for s, gen in stream.step())
        return [done[id(s)] for s in sessions]

    def stream(self, max_new_tokens: int) -> TurnStream:
        if self.batch_decode and self.reuse_cache:
            return _DecodeStream(self, max_new_tokens)
        return TurnStream(self, max_new_tokens)

    def full_sequence_inputs(self, session: HFSession) -> dict[str, torch.Tensor]:
        """The whole conversation as one model input (for training and for checking positions)."""
        return concat_segments(session.segments)


@dataclass
class _Turn:
    """A policy turn being generated."""

    session: HFSession
    start: int
    prefilled: int
    t0: float
    logits: Any = None
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    done: bool = False


class SharedPrefixes:
    """KV caches of first-prompt prefixes that several episodes share (the system prompt with the tool
    schemas, up to the first image or video), computed once and copied into each new episode's cache.

    Only the text before the first vision token is shared: its keys and values do not depend on what
    follows. A store lives for one stream (one ``run_batch``), so weights changed by training between
    rollouts never meet a stale prefix.
    """

    #: shorter shared text is not worth a lookup
    MIN_TOKENS = 16

    def __init__(self, max_entries: int = 4) -> None:
        self.max_entries = max_entries
        self.entries: dict[tuple[int, ...], Any] = {}
        #: tokens served from a stored prefix instead of being run through the model again
        self.reused_tokens = 0

    def cache_for(self, policy: HFPolicy, seg: Segment) -> tuple[Any, int, int]:
        """(a fresh cache holding ``seg``'s shared head, the head's length, tokens computed for it now)."""
        vision = (seg.mm_types != 0).nonzero()
        head = int(vision[0]) if len(vision) else len(seg.ids) - 1  # keep one token to forward for the logits
        if head < self.MIN_TOKENS:
            return None, 0, 0
        key = tuple(seg.ids[:head].tolist())
        stored, computed = self.entries.get(key), 0
        if stored is None:
            stored = DynamicCache(config=policy.model.config)
            dev = policy.device
            ids = seg.ids[:head][None].to(dev)
            policy.model(input_ids=ids, position_ids=seg.positions[:, None, :head].to(dev),
                         mm_token_type_ids=torch.zeros_like(ids), cache=stored, use_cache=True, logits_to_keep=1)
            if len(self.entries) >= self.max_entries:
                self.entries.pop(next(iter(self.entries)))
            self.entries[key] = stored
            computed = head
        else:
            self.reused_tokens += head
        data = [(layer.keys.clone(), layer.values.clone()) for layer in stored.layers]
        return DynamicCache(ddp_cache_data=data, config=policy.model.config), head, computed


class _DecodeStream(TurnStream):
    """Continuous batching over KV caches: sessions join and leave a running decode batch between tokens.

    Each :meth:`step` first prefills the sessions added since the last one (their new tokens on their own
    caches) and stacks their caches into the batch, then runs one decode forward for every row. A row whose
    turn stops leaves at once with its cache; a session whose tool result arrives joins at the next step,
    so no episode waits for another's turn or tool call.
    """

    joins_running = True

    def __init__(self, policy: HFPolicy, max_new_tokens: int) -> None:
        super().__init__(policy, max_new_tokens)
        self.policy: HFPolicy = policy
        self.active: list[_Turn] = []
        self.batch: _StackedCache | None = None
        self.prefixes = SharedPrefixes()
        #: the most memory the stacked caches took at any decode step (what the visual budget keeps bounded)
        self.peak_cache_bytes = 0

    def __len__(self) -> int:
        return len(self.waiting) + len(self.active)

    def sessions(self) -> list[Session]:
        return self.waiting + [t.session for t in self.active]

    @torch.inference_mode()
    def step(self) -> list[tuple[Session, Generation]]:
        p = self.policy
        ended: list[_Turn] = []
        if self.waiting:
            joining, self.waiting = self.waiting, []
            fresh = []
            for t in p._begin_many(joining, self.prefixes):
                p._pick(t, t.logits, self.max_new_tokens)
                (ended if t.done else fresh).append(t)
            if fresh:
                self._join(fresh)
        if self.active:
            ended += self._decode()
        now = time.perf_counter()
        return [(t.session, p._finish_turn(t, now - t.t0)) for t in ended]

    def _join(self, turns: list[_Turn]) -> None:
        caches = [t.session.cache for t in turns]
        config = self.policy.model.config
        if self.batch is None:
            self.batch = _StackedCache.of(caches, config)
        else:
            self.batch.extend(caches)
        for t in turns:
            t.session.cache = None  # the batch holds the only copy; the row comes back when the turn ends
        self.active += turns

    def _decode(self) -> list[_Turn]:
        p, batch, dev = self.policy, self.batch, self.policy.device
        ids = torch.tensor([[t.generated[-1]] for t in self.active], device=dev)
        positions = torch.stack([_text_positions(1, t.start + len(t.generated) - 1) for t in self.active], dim=1)
        out = p.model(input_ids=ids, position_ids=positions.to(dev), attention_mask=batch.next_mask().to(dev),
                      mm_token_type_ids=torch.zeros_like(ids), cache=batch.cache, use_cache=True, logits_to_keep=1)
        batch.grew()
        self.peak_cache_bytes = max(self.peak_cache_bytes, batch.nbytes())
        logits = out.logits[:, -1].float()
        for row, t in enumerate(self.active):
            p._pick(t, logits[row], self.max_new_tokens)
        ended = [t for t in self.active if t.done]
        if ended:
            config = p.model.config
            for row, t in enumerate(self.active):
                if t.done:
                    t.session.cache = batch.unstack(row, config)
            keep = [row for row, t in enumerate(self.active) if not t.done]
            self.active = [self.active[row] for row in keep]
            if keep:
                batch.select(keep)
            else:
                self.batch = None
        return ended


class _RoomyLayer(DynamicLayer):
    """A full-attention cache layer whose decoded tokens are written in place, into spare room at the end,
    instead of the whole cache being copied into a new tensor every step (``DynamicLayer``'s ``torch.cat``).

    ``keys`` / ``values`` are views of the first ``n`` columns. Code that replaces them (row selection,
    trimming) is fine: the next update sees they are no longer views of the buffer and re-buffers them.
    """

    SPARE = 64

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.device, self.is_initialized = keys.device, True
        self._rebuffer(keys, values, 0)

    def _rebuffer(self, keys: torch.Tensor, values: torch.Tensor, extra: int) -> None:
        n = keys.shape[-2]
        self._k = keys.new_zeros(*keys.shape[:-2], n + extra + self.SPARE, keys.shape[-1])
        self._v = values.new_zeros(*values.shape[:-2], n + extra + self.SPARE, values.shape[-1])
        self._k[..., :n, :] = keys
        self._v[..., :n, :] = values
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        n, new = self.keys.shape[-2], key_states.shape[-2]
        mine = self.keys.data_ptr() == self._k.data_ptr() and self.keys.shape[:-2] == self._k.shape[:-2]
        if not mine or n + new > self._k.shape[-2]:
            self._rebuffer(self.keys, self.values, new)
        self._k[..., n:n + new, :] = key_states
        self._v[..., n:n + new, :] = value_states
        self.keys, self.values = self._k[..., :n + new, :], self._v[..., :n + new, :]
        return self.keys, self.values


class _StackedCache:
    """Several sessions' KV caches as one batch, left-padded to the longest, with the attention mask."""

    def __init__(self, cache: Any, lengths: list[int]) -> None:
        self.cache = cache
        self.lengths = lengths  # real tokens per row
        self.width = max(lengths)

    @classmethod
    def of(cls, caches: Sequence[Any], config: Any, roomy: bool = True) -> "_StackedCache":
        """``caches`` stacked; ``roomy``: with spare room to decode into (not for a one-off prefill)."""
        lengths = [c.get_seq_length() for c in caches]
        width = max(lengths)
        stacked = DynamicCache(config=config)
        for i, layer in enumerate(stacked.layers):
            keys = _left_padded([c.layers[i].keys for c in caches], width)
            values = _left_padded([c.layers[i].values for c in caches], width)
            if roomy and type(layer) is DynamicLayer:  # full attention: decode in place
                stacked.layers[i] = _RoomyLayer(keys, values)
            else:
                layer.update(keys, values)
        return cls(stacked, lengths)

    def extend(self, caches: Sequence[Any]) -> None:
        """Add ``caches`` as new rows at the bottom (re-padding everything to the new width)."""
        lengths = [c.get_seq_length() for c in caches]
        width = max(self.width, *lengths)
        for i, layer in enumerate(self.cache.layers):
            layer.keys = _left_padded([layer.keys] + [c.layers[i].keys for c in caches], width)
            layer.values = _left_padded([layer.values] + [c.layers[i].values for c in caches], width)
        self.lengths += lengths
        self.width = width

    def nbytes(self) -> int:
        """Bytes allocated for keys and values (spare decoding room included)."""
        return sum(t.numel() * t.element_size() for layer in self.cache.layers
                   for t in (getattr(layer, "_k", layer.keys), getattr(layer, "_v", layer.values)))

    def next_mask(self) -> torch.Tensor:
        """The attention mask for one more token on every row: 0 on each row's left padding."""
        mask = torch.ones(len(self.lengths), self.width + 1, dtype=torch.long)
        for row, n in enumerate(self.lengths):
            mask[row, :self.width - n] = 0
        return mask

    def grew(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]
        self.width += 1

    def unstack(self, row: int, config: Any) -> Any:
        """Row ``row`` as a cache of its own, without the padding."""
        start = self.width - self.lengths[row]
        data = [(layer.keys[row:row + 1, :, start:].clone(), layer.values[row:row + 1, :, start:].clone())
                for layer in self.cache.layers]
        return DynamicCache(ddp_cache_data=data, config=config)

    def select(self, rows: list[int]) -> None:
        index = torch.tensor(rows, dtype=torch.long)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
            layer.values = layer.values.index_select(0, index.to(layer.values.device))
        self.lengths = [self.lengths[r] for r in rows]
        trim = self.width - max(self.lengths)  # columns that are padding on every remaining row
        if trim:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, trim:], layer.values[:, :, trim:]
            self.width -= trim


def _left_padded(tensors: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """(rows, heads, seq, dim) tensors left-padded with zeros to ``width`` on the sequence axis, stacked."""
    return torch.cat([torch.nn.functional.pad(t, (0, 0, width - t.shape[-2], 0)) for t in tensors])


def _text_positions(n: int, start: int) -> torch.Tensor:
    """M-RoPE positions of ``n`` text tokens from ``start``: the same index on all three axes."""
    return torch.arange(start, start + n).expand(3, -1)


def concat_segments(segments: Sequence[Segment]) -> dict[str, torch.Tensor]:
    """Model inputs (batch of one) for segments laid end to end."""
    inputs: dict[str, torch.Tensor] = {
        "input_ids": torch.cat([s.ids for s in segments])[None],
        "position_ids": torch.cat([s.positions for s in segments], dim=1)[:, None],
        "mm_token_type_ids": torch.cat([s.mm_types for s in segments])[None],
    }
    for key in VISION_INPUTS:
        parts = [s.vision[key] for s in segments if key in s.vision]
        if parts:
            inputs[key] = torch.cat(parts)
    return inputs
