"""KV-cache reuse across turns vs re-encoding the whole conversation every turn.

Runs the same scripted multi-turn episode (real tiny Qwen2.5-VL, real processor, real tools) twice:
with the policy's cache kept across turns, and with ``reuse_cache=False`` (what calling
``model.generate`` on the full conversation each turn costs). Prints tokens prefilled per turn and
the wall-clock ratio measured in this run.

    python benchmarks/kv_reuse.py            # about a minute on 2 CPU cores
    python benchmarks/kv_reuse.py --turns 6 --hidden 256 --frames 32
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mmagent.agent import Agent, Budgets
from mmagent.policy.render import MediaBudget
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.protocol import format_tool_call
from mmagent.tiny import build_tiny_qwen2_5_vl, write_synthetic_video


def run(model_dir: Path, video: Path, turns: int, frames: int, reuse: bool, repeats: int) -> tuple[list[int], float]:
    script = [f"<think>Look at second {k}.</think>" + format_tool_call(
        "resample_frames", {"start": float(k), "end": float(k + 1), "num_frames": 4}) for k in range(turns - 1)]
    script.append("<think>Done.</think><answer>A</answer>")
    best = float("inf")
    for _ in range(repeats):
        policy = HFPolicy.from_pretrained(str(model_dir), device="cpu", reuse_cache=reuse,
                                          chooser=ReplayChooser(script),
                                          media_budget=MediaBudget(video_frames=frames, video_max_pixels=224 * 224))
        agent = Agent(policy, budgets=Budgets(max_turns=turns + 1))
        t0 = time.perf_counter()
        traj = agent.run("What happens?", video=video).trajectory
        best = min(best, time.perf_counter() - t0)
    return [t.prefill_tokens for t in traj.turns if t.role == "assistant"], best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen2_5_vl(Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers)
        video = write_synthetic_video(Path(tmp) / "clip.mp4", seconds=8.0, fps=8, size=(320, 240))
        reuse_counts, reuse_s = run(model_dir, video, args.turns, args.frames, True, args.repeats)
        full_counts, full_s = run(model_dir, video, args.turns, args.frames, False, args.repeats)
    print(f"tokens prefilled per turn, cache reused : {reuse_counts}  (total {sum(reuse_counts)})")
    print(f"tokens prefilled per turn, re-encoded   : {full_counts}  (total {sum(full_counts)})")
    print(f"prefilled tokens ratio (re-encode / reuse): {sum(full_counts) / sum(reuse_counts):.2f}x")
    print(f"episode wall time: reuse {reuse_s:.3f} s, re-encode {full_s:.3f} s, speed-up {full_s / reuse_s:.2f}x")


if __name__ == "__main__":
    main()
