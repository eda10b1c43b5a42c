"""Rollout tokens/s and the peak memory of one RL step for a random-init Qwen2.5-VL-7B (GPU, offline).

No weights are downloaded: the model has Qwen2.5-VL-7B-Instruct's architecture (28 layers, 3584 wide,
GQA 28/4 heads, the 32-block windowed vision tower) with random weights in bf16, and the tokenizer and
processor are built locally (mmagent.tiny). Random weights cannot follow the tool protocol, so every
turn is scripted (``ReplayChooser``): the text is forced, but every prefill, decode step, vision encoding,
tool call and cache operation is the real engine's. Each episode watches a synthetic 16 s video with
``--frames`` frames at up to ``--pixels`` x ``--pixels`` pixels, re-samples frames ``--turns - 1`` times and
answers. Then one real RL update (the trainer's ``update_policy`` on the rollouts' own encoded inputs:
forward, clipped policy loss, backward, AdamW step, gradient checkpointing on) runs on those rollouts, and
the script prints its peak GPU memory.

    python benchmarks/gpu_rollout.py                    # H200: about 3-5 minutes
    python benchmarks/gpu_rollout.py --tiny --device cpu --episodes 2 --frames 4 --pixels 112   # smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from mmagent.agent import Agent, Budgets
from mmagent.policy.render import MediaBudget
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.tiny import build_processor, build_tokenizer, tiny_config, write_synthetic_video
from mmagent.trajectory import Task


def qwen2_5_vl_7b_config(tokenizer: Any) -> Any:
    """Qwen2.5-VL-7B-Instruct's published architecture, with this tokenizer's special-token ids."""
    config = tiny_config(tokenizer)
    text = config.text_config
    for key, value in {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                       "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 128000,
                       "vocab_size": 152064}.items():
        setattr(text, key, value)
    text.rope_parameters = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}
    text.layer_types = ["full_attention"] * 28
    vision = config.vision_config
    for key, value in {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                       "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31], "window_size": 112,
                       "tokens_per_second": 2}.items():
        setattr(vision, key, value)
    return config


def build_policy(tiny: bool, device: str, frames: int, pixels: int, script: Sequence[str]) -> HFPolicy:
    from transformers import AutoModelForImageTextToText

    tokenizer = build_tokenizer()
    processor = build_processor(tokenizer, max_pixels=pixels * pixels)
    config = tiny_config(tokenizer, hidden_size=128, num_layers=4) if tiny else qwen2_5_vl_7b_config(tokenizer)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):  # random init straight on the device: no 15 GB pass through host memory
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    budget = MediaBudget(video_frames=frames, video_min_pixels=28 * 28 * 4, video_max_pixels=pixels * pixels,
                         observation_max_pixels=pixels * pixels)
    return HFPolicy(model, processor, media_budget=budget, chooser=ReplayChooser(list(script)))


def script_for(turns: int, duration: float) -> list[str]:
    calls = [f"<think>I should look again at {k * 2:.0f}-{k * 2 + 4:.0f} s to see what changes.</think>"
             + format_tool_call("resample_frames", {"start": k * 2.0, "end": min(duration, k * 2.0 + 4), "num_frames": 8})
             for k in range(turns - 1)]
    return calls + ["<think>The frames show the colour changing; I have what I need.</think><answer>A</answer>"]


def _peak_gib(device: str) -> float:
    return torch.cuda.max_memory_allocated() / 2 ** 30 if device.startswith("cuda") else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=16, help="episodes rolled out together (default: %(default)s)")
    ap.add_argument("--turns", type=int, default=3, help="policy turns per episode (default: %(default)s)")
    ap.add_argument("--frames", type=int, default=32, help="frames in the first prompt (default: %(default)s)")
    ap.add_argument("--pixels", type=int, default=448, help="frame side in pixels (default: %(default)s)")
    ap.add_argument("--train-episodes", type=int, default=4, help="episodes in the RL update (default: %(default)s)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny model instead of the 7B (smoke test)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    from accelerate import Accelerator

    from mmagent.training.rl import RLConfig, update_policy

    cuda = args.device.startswith("cuda")
    duration = 16.0
    script = script_for(args.turns, duration)
    t0 = time.perf_counter()
    policy = build_policy(args.tiny, args.device, args.frames, args.pixels, script)
    params = sum(p.numel() for p in policy.model.parameters())
    print(f"model: {params / 1e9:.2f} B parameters, {next(policy.model.parameters()).dtype}, on {args.device} "
          f"(built in {time.perf_counter() - t0:.0f} s)")
    figures: dict[str, Any] = {"params_b": params / 1e9, "frames": args.frames, "pixels": args.pixels,
                               "episodes": args.episodes, "turns": args.turns}
    with tempfile.TemporaryDirectory() as tmp:
        video = write_synthetic_video(Path(tmp) / "clip.mp4", seconds=duration, fps=8, size=(640, 448))
        tasks = [Task(question="What colour is the screen at the end?", video=str(video), id=f"ep{k}",
                      options=["A. red", "B. blue"], answer="A") for k in range(args.episodes)]
        budgets = Budgets(max_turns=args.turns, max_new_tokens=128, max_context_tokens=65536,
                          max_visual_tokens=60000)
        agent = Agent(policy, tools=["resample_frames", "zoom"], budgets=budgets, keep_model_inputs=True)
        agent.run_batch(tasks[:1], progress=False)  # warm-up (kernels, allocator)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        trajs = agent.run_batch(tasks, progress=False)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        assistant = [t for x in trajs for t in x.turns if t.role == "assistant"]
        generated = sum(t.num_tokens for t in assistant)
        prefilled = sum(t.prefill_tokens for t in assistant)
        assert all(x.answer == "A" and len(x.tool_calls) == args.turns - 1 for x in trajs), "a scripted episode broke"
        figures.update(rollout_s=seconds, generated_tokens=generated, prefilled_tokens=prefilled,
                       generated_tok_s=generated / seconds, prefilled_tok_s=prefilled / seconds,
                       episodes_s=len(trajs) / seconds, context_tokens=max(len(x.token_ids) for x in trajs),
                       visual_tokens=max(x.visual_tokens for x in trajs), rollout_peak_gib=_peak_gib(args.device))
        print(f"rollout: {len(trajs)} episodes x {args.turns} turns in {seconds:.1f} s: "
              f"{generated / seconds:.0f} generated tokens/s, {prefilled / seconds:.0f} prefilled tokens/s, "
              f"{len(trajs) / seconds:.2f} episodes/s; longest context {figures['context_tokens']} tokens "
              f"({figures['visual_tokens']} visual); peak {figures['rollout_peak_gib']:.1f} GiB")

        # One RL update on the first --train-episodes rollouts (full fine-tune of the language model).
        cfg = RLConfig(model="random-init", data="-", temperature=1.0, lr=1e-6, device=args.device)
        accelerator = Accelerator(cpu=not cuda)
        enable = getattr(policy.model, "activation_checkpointing_enable", None) or policy.model.gradient_checkpointing_enable
        enable()
        policy.model.config.use_cache = False
        for name, p in policy.model.named_parameters():
            p.requires_grad_(not name.startswith("model.visual."))
        optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=cfg.lr)
        model, optimizer = accelerator.prepare(policy.model, optimizer)
        kept = [(t, 1.0 if k % 2 else -1.0) for k, t in enumerate(trajs[:args.train_episodes])]
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        stats = update_policy(cfg, policy, model, optimizer, kept, trajs[0], accelerator)
        if cuda:
            torch.cuda.synchronize()
        figures.update(train_step_s=time.perf_counter() - t0, train_peak_gib=_peak_gib(args.device),
                       train_episodes=len(kept), train_loss=float(stats["loss"]))
        print(f"RL step: {len(kept)} episodes in {figures['train_step_s']:.1f} s, loss {stats['loss']:.4f}, "
              f"peak {figures['train_peak_gib']:.1f} GiB (bf16 weights + AdamW state + activations, "
              "gradient checkpointing)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
