"""Run by tests/test_train.py under torchrun with 2 CPU processes (gloo): a few SFT or RL steps, then checks.

Each rank trains on its own share (SFT: its episodes; RL: its own prompts and rollouts, so ranks keep
different numbers of episodes); afterwards every rank's parameter fingerprint is gathered and rank 0
writes them (equal = gradients were averaged), the starting one and the saved model's.
Usage: python -m torch.distributed.run --nproc_per_node 2 tests/distributed_train.py sft|rl MODEL DATA OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(stage: str, model: str, data: str, out: str) -> None:
    from accelerate import PartialState
    from transformers import AutoModelForImageTextToText

    from mmagent.training.rl import RLConfig, train_rl
    from mmagent.training.sft import SFTConfig, param_fingerprint, train_sft

    state = PartialState(cpu=True)
    start = param_fingerprint(AutoModelForImageTextToText.from_pretrained(model))
    if stage == "sft":
        summary = train_sft(SFTConfig(model=model, data=[data], output_dir=out, max_steps=2, grad_accum=2, lr=1e-2,
                                      save_every=0, device="cpu", freeze_vision=False), progress=False)
    else:
        summary = train_rl(RLConfig(model=model, data=data, output_dir=out, steps=3, prompts_per_step=1, group_size=4,
                                    lr=2e-3, max_new_tokens=12, max_turns=2, tools=["resample_frames"], device="cpu",
                                    save_every=0, freeze_vision=False), progress=False)
    mine = torch.tensor([summary["param_fingerprint"]], dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(state.num_processes)]
    torch.distributed.all_gather(gathered, mine)
    kept = [r.get("episodes_trained", 0) for r in summary.get("history", [])]
    if state.is_main_process:
        saved = param_fingerprint(AutoModelForImageTextToText.from_pretrained(summary["final"]))
        result = {"processes": state.num_processes, "fingerprints": [float(g) for g in gathered],
                  "start": start, "saved": saved, "steps": summary["steps"], "kept_rank0": kept}
        (Path(out) / "distributed.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
