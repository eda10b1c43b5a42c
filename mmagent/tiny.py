"""Tiny random Qwen2.5-VL and Qwen3-VL checkpoints built entirely in code, for tests, CI and offline demos.

:func:`build_tiny` (``family="qwen2_5_vl"`` or ``"qwen3_vl"``) writes a directory that ``from_pretrained`` loads
exactly like ``Qwen/Qwen2.5-VL-7B-Instruct`` or ``Qwen/Qwen3-VL-8B-Instruct``: the real model class (a few layers, 64-wide), a byte-level BPE
tokenizer trained here with the ``tokenizers`` library on the agent's own vocabulary (so prompts stay
short), Qwen's special tokens, the real image/video processors and a ChatML chat template of the same
shape as the family's hub template (:mod:`mmagent.policy.families`). Nothing is downloaded.

:func:`imprint` optionally fine-tunes such a model for a few seconds on one scripted episode so that
greedy decoding calls ``resample_frames`` and then answers: enough to watch the whole loop run
end to end (``mmagent make-tiny DIR --imprint``) on a machine without the hub.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from mmagent.policy.families import QWEN2_5_VL, get_family
from mmagent.protocol import format_tool_call, render_system_prompt

# Qwen2.5-VL's special tokens, in Qwen's order, plus the agent's tags as added (non-special) tokens.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
AGENT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
                "<answer>", "</answer>"]

#: tools whose schemas the tiny tokenizer learns its merges from
TOKENIZER_TOOLS = ("resample_frames", "zoom", "depth", "segment", "web_search")

#: the Qwen2.5-VL chat template (kept here for callers of the first tiny builder)
CHAT_TEMPLATE = QWEN2_5_VL.chat_template()


def _training_corpus() -> list[str]:
    """Text the tiny tokenizer learns merges from: the agent's prompts, tags, numbers and English."""
    from mmagent.toolbox import create_tool

    # A fixed list, not available_tools(): the vocabulary must not depend on what happens to be imported.
    schemas = [create_tool(n).schema() for n in TOKENIZER_TOOLS]
    corpus = [render_system_prompt(schemas)] * 4
    corpus += [json.dumps(s) for s in schemas]
    corpus += [format_tool_call("resample_frames", {"start": s, "end": s + 2.5, "num_frames": 4}) for s in range(40)]
    corpus += [f"Video clip from {a:.2f} to {a + 2:.2f} seconds: 4 frames at {a:.2f}s, {a + 0.5:.2f}s" for a in
               np.linspace(0, 30, 25)]
    corpus += ["The answer is (A) (B) (C) (D) yes no red green blue white black left right top bottom color "
               "what which when where how many object person moves appears first last happens before after"] * 8
    return corpus


def build_tokenizer(vocab_size: int = 800, family: str = "qwen2_5_vl"):
    """A Qwen2Tokenizer with a BPE vocabulary trained here (byte-level, so any text encodes), with ``family``'s
    chat template (both Qwen-VL families share Qwen2's tokenizer and special tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + AGENT_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=model["vocab"], merges=merges, eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in AGENT_TOKENS])
    tokenizer.chat_template = get_family(family).chat_template()
    return tokenizer


def build_processor(tokenizer, min_pixels: int = 28 * 28, max_pixels: int = 112 * 112, family: str = "qwen2_5_vl"):
    """``family``'s real processor (image + video processors) around ``tokenizer``."""
    return get_family(family).build_processor(tokenizer, min_pixels, max_pixels)


def tiny_config(tokenizer, hidden_size: int = 64, num_layers: int = 2, vision_width: int = 32, vision_depth: int = 2,
                family: str = "qwen2_5_vl"):
    """A config of ``family`` a few hundred KB in size, with its real M-RoPE and vision tower."""
    return get_family(family).tiny_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers,
                                          vision_width=vision_width, vision_depth=vision_depth)


def build_tiny(path: str | os.PathLike, family: str = "qwen2_5_vl", seed: int = 0, hidden_size: int = 64,
               num_layers: int = 2, vision_width: int = 32, vision_depth: int = 2) -> Path:
    """Write a tiny random checkpoint of ``family`` (``qwen2_5_vl`` or ``qwen3_vl``: model, tokenizer,
    processor) to ``path``."""
    import torch

    fam = get_family(family)
    torch.manual_seed(seed)
    tokenizer = build_tokenizer(family=fam.name)
    processor = fam.build_processor(tokenizer, 28 * 28, 112 * 112)
    config = fam.tiny_config(tokenizer, hidden_size=hidden_size, num_layers=num_layers, vision_width=vision_width,
                             vision_depth=vision_depth)
    model = fam.model_class()(config).eval()
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def build_tiny_qwen2_5_vl(path: str | os.PathLike, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                          vision_width: int = 32, vision_depth: int = 2) -> Path:
    """Write a tiny random Qwen2.5-VL checkpoint (model, tokenizer, processor) to ``path``."""
    return build_tiny(path, "qwen2_5_vl", seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                      vision_width=vision_width, vision_depth=vision_depth)


def build_tiny_qwen3_vl(path: str | os.PathLike, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                        vision_width: int = 32, vision_depth: int = 2) -> Path:
    """Write a tiny random Qwen3-VL checkpoint (dense; model, tokenizer, processor) to ``path``."""
    return build_tiny(path, "qwen3_vl", seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                      vision_width=vision_width, vision_depth=vision_depth)


def write_synthetic_video(path: str | os.PathLike, seconds: float = 4.0, fps: int = 8,
                          size: tuple[int, int] = (96, 64), colors: Sequence[tuple[int, int, int]] | None = None,
                          codec: str = "mp4v") -> Path:
    """An MP4 whose frames are solid colour segments (RGB) with a moving white square and a frame counter.

    Segment ``k`` of ``len(colors)`` equal parts has colour ``colors[k]``, so tests can ask which colour
    is shown at a time and check the frames that come back.
    """
    import cv2

    colors = list(colors or [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)])
    w, h = size
    n = max(1, int(round(seconds * fps)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*codec), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {codec!r} video to {path}")
    try:
        for i in range(n):
            r, g, b = colors[min(len(colors) - 1, i * len(colors) // n)]
            frame = np.empty((h, w, 3), np.uint8)
            frame[:] = (b, g, r)  # OpenCV wants BGR
            x = int((w - 12) * i / max(1, n - 1))
            frame[h // 2 - 6:h // 2 + 6, x:x + 12] = 255
            cv2.putText(frame, str(i), (2, h - 4), cv2.FONT_HERSHEY_SIMPLEX, 0.3, (0, 0, 0), 1)
            writer.write(frame)
    finally:
        writer.release()
    return path


#: the episode :func:`imprint` teaches: look again at the first two seconds, then answer
IMPRINT_TURNS = (
    "<think>Let me look at the start of the video more closely.</think>"
    + format_tool_call("resample_frames", {"start": 0.0, "end": 2.0, "num_frames": 4}),
    "<think>I have looked at the frames again.</think><answer>A</answer>",
)


def imprint(path: str | os.PathLike, steps: int = 500, lr: float = 3e-3, seed: int = 0, episodes_count: int = 18
            ) -> Path:
    """Fine-tune the tiny checkpoint at ``path`` in place so that greedy decoding plays IMPRINT_TURNS.

    The scripted episodes (synthetic videos of several sizes and lengths, varied questions)
    are encoded by forcing their text through the real policy, so the training tokens are exactly
    the agent's; the model is then trained on their policy tokens only (loss mask 1).
    """
    import torch

    from mmagent.media import EpisodeMedia
    from mmagent.policy.hf import HFPolicy
    from mmagent.policy.replay import ReplayChooser
    from mmagent.protocol import parse_turn
    from mmagent.toolbox import create_tool

    policy = HFPolicy.from_pretrained(str(path), device="cpu", chooser=ReplayChooser(list(IMPRINT_TURNS)))
    renderer = policy.renderer
    tool = create_tool("resample_frames")
    system = render_system_prompt([create_tool(n).schema() for n in ("resample_frames", "zoom")])
    rng = np.random.default_rng(seed)
    subjects = ("the screen", "the square", "the video", "the clip", "the first frame", "the last second",
                "the object", "the scene")
    asks = ("What colour is {}?", "What happens in {}?", "Which object moves in {}?", "Describe {}.",
            "Where is {} at the end?", "How many colours does {} show?", "What is {}?", "{}?",
            "Is there anything in {}?")
    episodes = [(asks[k % len(asks)].format(subjects[(3 * k) % len(subjects)]),
                 (int(rng.choice([64, 96, 128, 160])), int(rng.choice([64, 96, 128]))),
                 float(rng.choice([3.0, 4.0, 6.0, 8.0]))) for k in range(episodes_count)]
    torch.manual_seed(seed)
    batches = []
    tmp = tempfile.TemporaryDirectory()
    for k, (q, size, seconds) in enumerate(episodes):
        video = write_synthetic_video(Path(tmp.name) / f"clip{k}.mp4", seconds=seconds, size=size)
        media = EpisodeMedia(video=video)
        question = f"This is a video with duration {media.video.duration:.2f} seconds. {q}"
        session = policy.start(renderer.prompt(system, question, media))
        call = parse_turn(policy.generate([session], 256)[0].text).action
        policy.observe(session, renderer.observation(tool(call.arguments, media)))
        policy.generate([session], 256)
        inputs = policy.model_inputs(session)
        labels = torch.tensor(session.token_ids)
        labels[torch.tensor(session.loss_mask) == 0] = -100
        batches.append((inputs, labels[None]))
        media.close()
    tmp.cleanup()
    model = policy.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    # Linear decay to zero: the last passes settle the memorised turns instead of bouncing around them.
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / steps)
    losses: list[float] = []
    for step in range(steps):
        inputs, labels = batches[step % len(batches)]
        loss = model(**inputs, labels=labels).loss
        losses.append(float(loss.detach()))
        loss.backward()
        opt.step()
        schedule.step()
        opt.zero_grad()
    model.eval().save_pretrained(path)
    logging.getLogger(__name__).info("imprint: mean loss over the last pass %.4f", sum(losses[-len(batches):]) / len(batches))
    return Path(path)
