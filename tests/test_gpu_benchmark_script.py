"""benchmarks/gpu_rollout.py (the prepared GPU measurement) still runs end to end: a tiny model on CPU."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_rollout_script_runs_on_a_tiny_model(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_rollout.py"), "--tiny", "--device", "cpu",
                           "--episodes", "2", "--turns", "3", "--frames", "4", "--pixels", "112",
                           "--train-episodes", "2", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["episodes"] == 2 and figures["turns"] == 3 and figures["train_episodes"] == 2
    # 2 episodes x 3 scripted turns, every token really generated and every prompt really prefilled
    assert figures["generated_tokens"] > 6 and figures["prefilled_tokens"] > figures["generated_tokens"]
    assert figures["generated_tok_s"] > 0 and 0 < figures["visual_tokens"] < figures["context_tokens"]
    assert math.isfinite(figures["train_loss"]) and figures["train_step_s"] > 0
    assert "rollout: 2 episodes x 3 turns" in proc.stdout and "RL step: 2 episodes" in proc.stdout
