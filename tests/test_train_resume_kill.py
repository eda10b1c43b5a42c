"""kill -9 during training: running the same command again continues from the last whole checkpoint, with no
step lost or trained twice, the same data order, and a final model (and checkpoint) that load.

``mmagent train sft`` runs as a child process on the tiny setup and is SIGKILLed once its first checkpoint is on
disk; a half-written later checkpoint is left behind as a kill during a save would leave it. The same command,
run again, must end exactly where an uninterrupted run ends: the same weights and, step by step, the same loss
(so each step trained the same episode), each step logged once after the resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from deadlines import sigkill_when

from mmagent.eval.benchmarks import synth
from mmagent.cli import main
from mmagent.policy.hf import HFPolicy
from mmagent.tiny import build_tiny_qwen2_5_vl
from mmagent.training.common import latest_checkpoint, param_fingerprint
from mmagent.training.synth_data import write_sft_data

STEPS = 8  # 4 episodes, one per step: two epochs, so the resumed run crosses an epoch's reshuffle


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kill-train")
    tasks = synth.build(root / "world", per_family=1, seed=0, progress=False)
    write_sft_data(tasks, root / "sft.jsonl", progress=False)
    return build_tiny_qwen2_5_vl(root / "model", seed=1), root / "sft.jsonl"


def _args(model: Path, data: Path, out: Path) -> list[str]:
    return ["train", "sft", f"model={model}", f"data={data}", f"output_dir={out}", f"max_steps={STEPS}",
            "save_every=2", "grad_accum=1", "log_every=1", "lr=3e-3", "device=cpu", "freeze_vision=false", "--quiet"]


def _losses(out: Path) -> list[list[tuple[int, float]]]:
    """(step, loss) of each TensorBoard events file under ``out``, one list per process that trained there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = []
    for f in sorted(out.rglob("events.out.tfevents*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(f))
        acc.Reload()
        if "train/loss" in acc.Tags()["scalars"]:
            runs.append([(e.step, e.value) for e in acc.Scalars("train/loss")])
    return runs


def test_kill_9_mid_training_then_the_same_command_resumes_exactly(setup, tmp_path, capsys):
    model, data = setup
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    first = killed / "checkpoints" / "step-000002" / "trainer_state.json"
    with open(tmp_path / "log.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmagent", *_args(model, data, killed)], stdout=log,
                                stderr=subprocess.STDOUT)
        sigkill_when(proc, first.is_file, "its first checkpoint", tmp_path / "log.txt")
    resumed_from = latest_checkpoint(killed)
    k = json.loads((resumed_from / "trainer_state.json").read_text())["step"]
    assert 2 <= k < STEPS and not (killed / "final").exists()
    # A kill during the next save leaves a checkpoint folder without its trainer_state.json: never resumed from.
    partial = killed / "checkpoints" / f"step-{k + 2:06d}"
    if not partial.exists():
        partial.mkdir()
        (partial / "model.safetensors").write_bytes(b"cut short by kill -9")
    assert not (partial / "trainer_state.json").exists() and latest_checkpoint(killed) == resumed_from

    capsys.readouterr()
    assert main(_args(model, data, killed)) == 0  # the same command again
    said = capsys.readouterr().out
    assert f"Resuming from {resumed_from} (step {k})" in said
    assert main(_args(model, data, whole)) == 0
    capsys.readouterr()

    done, straight = (json.loads((d / "sft_summary.json").read_text()) for d in (killed, whole))
    assert done["steps"] == straight["steps"] == STEPS
    assert done["param_fingerprint"] == pytest.approx(straight["param_fingerprint"], rel=1e-9)
    assert done["loss"] == pytest.approx(straight["loss"], rel=1e-6)
    # step by step: the killed run logged 1..(at least k), the resumed run exactly k+1..STEPS, each once, with the
    # losses of the uninterrupted run (the same episode in the same step, the same weights before it)
    (reference,) = _losses(whole)
    assert [s for s, _ in reference] == list(range(1, STEPS + 1))
    ref = dict(reference)
    before, after = _losses(killed)
    assert [s for s, _ in before][:k] == list(range(1, k + 1))
    assert [s for s, _ in after] == list(range(k + 1, STEPS + 1))
    for step, loss in before[:k] + after:
        assert loss == pytest.approx(ref[step], rel=1e-5), step
    # what is left loads: the final model, and every checkpoint (the half-written one was written again, whole)
    final = HFPolicy.from_pretrained(str(killed / "final"), device="cpu")
    assert param_fingerprint(final.model) == pytest.approx(done["param_fingerprint"], rel=1e-9)
    states = {p.name: json.loads((p / "trainer_state.json").read_text()) for p in (killed / "checkpoints").iterdir()}
    assert states == {f"step-{s:06d}": {"step": s, "cursor": s} for s in range(2, STEPS + 1, 2)}
    from safetensors.torch import load_file

    assert load_file(str(partial / "model.safetensors"))
    # and the last checkpoint resumes: the same command a third time trains nothing and changes nothing
    assert main(_args(model, data, killed)) == 0
    assert f"Resuming from {killed / 'checkpoints' / f'step-{STEPS:06d}'} (step {STEPS})" in capsys.readouterr().out
    again = json.loads((killed / "sft_summary.json").read_text())
    assert again["steps"] == STEPS and again["param_fingerprint"] == pytest.approx(done["param_fingerprint"], rel=1e-12)


@pytest.mark.parametrize("override, message", [
    ("lr=fast", "lr must be a finite number, got 'fast'"),
    ("lr=.nan", "lr must be a finite number, got nan"),
    ("max_steps=2.5", "max_steps must be a whole number, got 2.5"),
    ("grad_accum=yes", "grad_accum must be a whole number, got True"),
    ("resume=sometimes", "resume must be true or false, got 'sometimes'"),
    ("lora.r=[4]", "r must be a whole number, got [4]"),
])
def test_bad_numbers_in_a_training_config_are_refused_before_anything_loads(override, message, capsys, tmp_path):
    assert main(["train", "sft", "model=/nonexistent", f"output_dir={tmp_path}", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mmagent: error: ") and message in err, err
    assert list(tmp_path.iterdir()) == []


def test_numbers_yaml_reads_as_strings_still_train():
    """``lr=3e-3`` (a string to YAML 1.1, and so to the config) is the float it looks like."""
    from mmagent.training.config import load_config
    from mmagent.training.sft import SFTConfig

    cfg = load_config(SFTConfig, "sft_synth", ["lr=3e-3", "weight_decay=1e-2", "max_grad_norm=1"])
    assert (cfg.lr, cfg.weight_decay, cfg.max_grad_norm) == (0.003, 0.01, 1.0)
    assert all(isinstance(v, float) for v in (cfg.lr, cfg.weight_decay, cfg.max_grad_norm))
