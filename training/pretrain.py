"""Pre-training on drills: what a real VLM brings to agent training, given to a tiny random one.

A tiny random Qwen2.5-VL can neither see nor copy. SFT on a few hundred agent episodes supervises what
the model saw with one to three tokens per episode, far too little for a vision tower to learn from.
This stage trains on drills instead (:mod:`mmagent.eval.synth.drills`): fresh rounds every step, drawn
by the toy world's own renderers, so nothing can be memorised and the evaluation items are never seen.

Each step is a batch of ``rounds_per_step`` short conversations, one drill round each after a short
system prompt, rendered by the agent's renderer and encoded by the real processor (tool observations
as the agent shows them, the first look at its own pixel budget); loss only on what the policy writes. Phases, in
order (each a share of ``steps``):

1. ``language``: text drills only (copy windows, lengths, coordinates, option letters), whole model;
2. ``vision``: perception drills; with ``vision_only`` only the vision tower and its merger train (as a
   real VLM's first stage aligns a vision encoder to a trained language model), by default the whole
   model does: the tiny language model has not learned much yet, and training both together taught
   colours in about 120 steps;
3. ``all``: every drill, the whole model.

:func:`drill_accuracy` scores a model on fresh rounds (greedy, exact match of the answer), per drill:
the numbers that say whether the stage worked.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from mmagent.eval.synth.drills import KINDS, PERCEPTION, Round, make_round
from mmagent.eval.synth.families import SynthConfig
from mmagent.eval.synth.oracle import SYNTH_TOOLS
from mmagent.policy.hf import HFPolicy, HFSession
from mmagent.policy.render import IM_END, Message, Part, View
from mmagent.protocol import render_system_prompt
from mmagent.toolbox.registry import resolve_tools
from mmagent.training.common import load_policy, parameter_groups, save_final
from mmagent.policy.segments import on_device
from mmagent.training.encode import EncodedEpisode
from mmagent.training.losses import sft_loss

#: how often each drill is drawn in the perception and whole-model phases
DEFAULT_MIX = {"flash": 3.0, "screen": 2.0, "tag": 3.0, "sign": 2.0, "where": 3.0, "window": 1.0, "whole": 0.5,
               "search": 1.0, "option": 1.5, "video_answer": 3.0}


@dataclass
class PretrainConfig:
    #: folder of the starting checkpoint (a tiny random model from ``mmagent make-tiny``)
    model: str = ""
    #: where the pre-trained model goes (a plain transformers folder plus ``mmagent.json``)
    output_dir: str = "runs/pretrain"
    steps: int = 1000
    #: drill rounds (each its own short conversation) in one step's batch
    rounds_per_step: int = 16
    lr: float = 2e-3
    #: learning rate of the vision tower and merger (None: ``lr``); a tiny vision transformer needs a lower one
    vision_lr: float | None = 3e-4
    #: shares of the steps spent on the language phase and the vision-only phase (the rest: everything)
    language_share: float = 0.15
    vision_share: float = 0.15
    #: in the vision phase, train only the vision tower and merger (else the whole model)
    vision_only: bool = False
    #: relative frequency of each drill (KINDS)
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    seed: int = 0
    device: str = "cpu"
    #: padded tokens in one forward pass: a step's rounds go through the model in groups of similar length
    #: (:func:`length_groups`), so one long search round does not pad fifteen short ones to its length
    micro_batch_tokens: int = 4096


#: the system prompt of a drill conversation: short, since the agent's (about 750 tokens of tool schemas)
#: would cost more than the rounds themselves
DRILL_SYSTEM = "You are a helpful assistant. Answer what each message asks."


def system_prompt(tools: bool = False) -> str:
    """The drills' system prompt, or (``tools=True``) the one the toy world's agent gives."""
    if not tools:
        return DRILL_SYSTEM
    return render_system_prompt([t.schema() for t in resolve_tools(list(SYNTH_TOOLS), default=list)])


def round_view(policy: HFPolicy, r: Round) -> View:
    """What the policy is shown before it writes ``r.answer``, rendered as in an episode."""
    renderer = policy.renderer
    if r.observation is not None and r.call:  # a later turn: the question, then each call and what it returned
        asked = renderer.request([Message("user", [Part(text=r.text)])], continues=True)
        messages, visual_tokens = list(asked.messages), asked.visual_tokens
        for call, observation in [*r.history, (r.call, r.observation)]:
            shown = renderer.observation(observation)
            messages += [Message("assistant", [Part(text=call)])] + list(shown.messages)
            visual_tokens += shown.visual_tokens
        return View(messages, True, visual_tokens, r.observation, policy.family)
    if r.observation is not None:
        return renderer.observation(r.observation)
    parts = [Part(image=r.view, handle="image", source_size=r.view.size)] if r.view is not None else []
    return renderer.request([Message("user", parts + [Part(text=r.text)])], continues=True)


def start_session(policy: HFPolicy, system: str, first: Round) -> HFSession:
    """A conversation whose first message is ``system`` and whose first user turn shows round ``first``."""
    shown = round_view(policy, first)
    messages = [Message("system", [Part(text=system)])] + list(shown.messages)
    return policy.start(View(messages, False, shown.visual_tokens, None, policy.family))


def encode_round(policy: HFPolicy, r: Round, system: str) -> EncodedEpisode:
    """One round as its own short conversation's teacher-forced inputs; the loss mask covers the answer
    and its end of turn (a drill's answer has no stop string to end it)."""
    session = start_session(policy, system, r)
    try:
        ids = policy.tokenizer.encode(r.answer, add_special_tokens=False)
        policy.append_turn(session, ids + [policy.tokenizer.convert_tokens_to_ids(IM_END)])
        return EncodedEpisode(inputs=policy.model_inputs(session),
                              loss_mask=torch.tensor(session.loss_mask, dtype=torch.long),
                              old_logprobs=torch.zeros(len(session.token_ids)), prompt_length=session.prompt_length)
    finally:
        policy.end(session)


def collate(episodes: list[EncodedEpisode], pad_id: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right-padded batch inputs of several conversations (their images in order) and the (B, T) loss mask.
    One round per conversation, many conversations per step: packing many rounds into one conversation
    left the model looking for its question among many, and it did not learn to copy."""
    width = max(e.num_tokens for e in episodes)
    b = len(episodes)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    positions = torch.zeros((3, b, width), dtype=torch.long)
    mm_types = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    pixels, grids = [], []
    for row, e in enumerate(episodes):
        n = e.num_tokens
        ids[row, :n] = e.inputs["input_ids"][0]
        attention[row, :n] = 1
        positions[:, row, :n] = e.inputs["position_ids"][:, 0]
        if "mm_token_type_ids" in e.inputs:
            mm_types[row, :n] = e.inputs["mm_token_type_ids"][0]
        mask[row, :n] = e.loss_mask
        if "pixel_values" in e.inputs:
            pixels.append(e.inputs["pixel_values"])
            grids.append(e.inputs["image_grid_thw"])
    inputs = {"input_ids": ids, "attention_mask": attention, "position_ids": positions, "mm_token_type_ids": mm_types}
    if pixels:
        inputs.update(pixel_values=torch.cat(pixels), image_grid_thw=torch.cat(grids))
    return inputs, mask


def length_groups(episodes: list[EncodedEpisode], max_tokens: int) -> list[list[EncodedEpisode]]:
    """``episodes`` sorted by length and cut into groups whose padded size (rows x longest) stays within
    ``max_tokens`` (a longer episode is a group of its own). Measured (128-wide 4-layer model, 1 thread):
    one search round (about 1,200 tokens) padded fifteen 170-token window rounds to its length (5.3 s for
    the step against 0.35 s without it); a default-mix step of 16 rounds took 1.45 s as one padded batch and
    0.68 s in groups of 4,096 tokens (0.68 / 0.63 at 2,048 / 1,024)."""
    groups: list[list[EncodedEpisode]] = []
    for e in sorted(episodes, key=lambda e: e.num_tokens):
        if groups and (len(groups[-1]) + 1) * e.num_tokens <= max_tokens:
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def drill_loss(model: torch.nn.Module, episodes: list[EncodedEpisode], pad_id: int, max_tokens: int) -> float:
    """Back-propagate the step's loss (cross entropy averaged over every answer token of ``episodes``) one
    length group at a time; the gradients are those of one padded batch. Returns the loss."""
    total = sum(int(e.loss_mask[1:].sum()) for e in episodes)
    value = 0.0
    for group in length_groups(episodes, max_tokens):
        inputs, mask = collate(group, pad_id)
        inputs = on_device(model, inputs)
        logits = model(**inputs, use_cache=False).logits.float()
        mask = mask[:, 1:].to(logits.device)
        loss = sft_loss(logits[:, :-1], inputs["input_ids"][:, 1:], mask) * (mask.sum() / max(1, total))
        loss.backward()
        value += float(loss.detach())
    return value


def draw_kind(rng: np.random.Generator, mix: dict[str, float], kinds: tuple[str, ...]) -> str:
    """One of ``kinds``, drawn with the weights ``mix`` gives them."""
    names = [k for k in kinds if mix.get(k, 0) > 0]
    weights = np.array([mix[k] for k in names], float)
    return names[int(rng.choice(len(names), p=weights / weights.sum()))]


def warmup_then_decay(optimizer: torch.optim.Optimizer, steps: int, hold: float = 0.0
                      ) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over a tenth of the steps (at most 30), the full rate until ``hold`` of the steps,
    then a linear decay to 5% of the rate at the end."""
    warmup = max(1, min(30, steps // 10))
    start = int(hold * steps)

    def factor(s: int) -> float:
        decay = 1.0 if s < start else 1 - (s - start) / max(1, steps - start)
        return min(1.0, (s + 1) / warmup) * max(0.05, decay)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def phase_of(step: int, cfg: PretrainConfig) -> str:
    if step < cfg.language_share * cfg.steps:
        return "language"
    if step < (cfg.language_share + cfg.vision_share) * cfg.steps:
        return "vision"
    return "all"


def _set_trainable(model: torch.nn.Module, phase: str, vision_only: bool) -> None:
    visual = model.model.visual
    vision_ids = {id(p) for p in visual.parameters()}
    for p in model.parameters():
        p.requires_grad_(not (vision_only and phase == "vision") or id(p) in vision_ids)


def pretrain(cfg: PretrainConfig, progress: bool = True) -> dict[str, Any]:
    """Run the stage; save the model to ``cfg.output_dir``; returns losses per phase and the time taken."""
    if not cfg.model:
        raise ValueError("pretrain needs model= (a checkpoint folder)")
    unknown = set(cfg.mix) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown drills in mix: {sorted(unknown)}; choose from {', '.join(KINDS)}")
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.model, device=cfg.device)
    model = policy.model
    model.train()
    world = SynthConfig()
    system = system_prompt()
    pad = policy.tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.lr, cfg.vision_lr), lr=cfg.lr, weight_decay=0.0)
    scheduler = warmup_then_decay(optimizer, cfg.steps)
    language = tuple(k for k in KINDS if k not in PERCEPTION)
    losses: dict[str, list[float]] = {}
    phase = None
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc="pretrain", unit="step", disable=not progress)
    for step in bar:
        if phase_of(step, cfg) != phase:
            phase = phase_of(step, cfg)
            _set_trainable(model, phase, cfg.vision_only)
        rng = np.random.default_rng([cfg.seed, step])
        kinds = language if phase == "language" else PERCEPTION if phase == "vision" else KINDS
        rounds = [make_round(draw_kind(rng, cfg.mix, kinds), rng, world) for _ in range(cfg.rounds_per_step)]
        loss = drill_loss(model, [encode_round(policy, r, system) for r in rounds], pad, cfg.micro_batch_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.setdefault(phase, []).append(loss)
        if step % 10 == 0:
            bar.set_postfix(phase=phase, loss=f"{np.mean(losses[phase][-20:]):.3f}")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    result = {"steps": cfg.steps, "seconds": round(time.perf_counter() - t0, 1),
              "loss": {k: round(float(np.mean(v[-50:])), 4) for k, v in losses.items()}, "config": asdict(cfg)}
    save_final(model, policy, cfg.output_dir, about={"trained_by": "mmagent pretrain (drills)", "pretrain": result})
    return result


def drill_accuracy(model: str | HFPolicy, per_kind: int = 20, kinds: tuple[str, ...] = KINDS, seed: int = 12345,
                   max_new_tokens: int = 360, device: str = "cpu") -> dict[str, float]:
    """Share of fresh drill rounds (seeded apart from training's) whose greedy answer is exactly right.
    ``max_new_tokens`` must hold the longest answer (a ``grounding_turn`` holds eight frames against the asked
    colour: up to 311 tokens in 200 episodes under the recipe's tokenizer); a shorter cap scores every longer
    answer wrong."""
    policy = model if isinstance(model, HFPolicy) else load_policy(model, device=device)
    system = system_prompt()
    world = SynthConfig()
    out = {}
    for kind in kinds:
        rng = np.random.default_rng([seed, KINDS.index(kind)])
        rounds = [make_round(kind, rng, world) for _ in range(per_kind)]
        sessions = [start_session(policy, system, r) for r in rounds]
        gens = policy.generate(sessions, max_new_tokens)
        for s in sessions:
            policy.end(s)
        out[kind] = sum(_same(g.text, r.answer) for g, r in zip(gens, rounds)) / per_kind
    return out


def _same(text: str, answer: str) -> bool:
    return text.strip().removesuffix("<|im_end|>").strip() == answer.strip()


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
