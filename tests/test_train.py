"""The trainers on the tiny model: SFT learns and resumes exactly, two processes stay in sync, RL raises the reward."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmagent.eval.benchmarks import synth
from mmagent.policy.hf import HFPolicy
from mmagent.tiny import build_tiny_qwen2_5_vl
from mmagent.trajectory import Task, save_jsonl
from mmagent.training.common import media_budget
from mmagent.training.rl import RLConfig, episode_weights, train_rl
from mmagent.training.sft import SFTConfig, param_fingerprint, train_sft
from mmagent.training.synth_data import write_sft_data

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft-world")
    tasks = synth.build(root, per_family=2, seed=0, progress=False)
    write_sft_data(tasks, root / "sft.jsonl", progress=False)
    return root / "sft.jsonl"


@pytest.fixture(scope="module")
def fresh_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-train"), seed=1)


def _sft(model: Path, data: Path, out: Path, **kw) -> dict:
    kw.setdefault("lr", 3e-3)
    cfg = SFTConfig(model=str(model), data=[str(data)], output_dir=str(out), grad_accum=2, device="cpu",
                    freeze_vision=False, **kw)
    return train_sft(cfg, progress=False)


@pytest.mark.slow
def test_sft_lowers_the_loss_and_saves_a_loadable_model(fresh_model: Path, sft_data: Path, tmp_path: Path) -> None:
    first = _sft(fresh_model, sft_data, tmp_path / "a", max_steps=1, save_every=0)
    more = _sft(fresh_model, sft_data, tmp_path / "b", max_steps=40, save_every=0)
    assert more["loss"] < 0.5 * first["loss"], (first["loss"], more["loss"])
    policy = HFPolicy.from_pretrained(more["final"], device="cpu")
    assert param_fingerprint(policy.model) == pytest.approx(more["param_fingerprint"], rel=1e-9)
    assert policy.media_budget == media_budget("synth")  # read back from the folder's mmagent.json
    assert list((tmp_path / "b").rglob("events.out.tfevents*")), "TensorBoard logs are written"


def test_sft_resume_ends_where_an_uninterrupted_run_ends(fresh_model: Path, sft_data: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    straight = _sft(fresh_model, sft_data, run, max_steps=4, save_every=2)
    # As if killed after step 2: only the step-2 checkpoint is left.
    shutil.rmtree(run / "checkpoints" / "step-000004")
    shutil.rmtree(run / "final")
    resumed = _sft(fresh_model, sft_data, run, max_steps=4, save_every=2)
    assert resumed["steps"] == 4 and resumed["seconds"] < straight["seconds"] * 2
    assert resumed["param_fingerprint"] == pytest.approx(straight["param_fingerprint"], rel=1e-12, abs=1e-12)
    assert resumed["loss"] == pytest.approx(straight["loss"], rel=1e-9)


def test_sft_with_lora_trains_adapters_and_merges_them(fresh_model: Path, sft_data: Path, tmp_path: Path) -> None:
    base = HFPolicy.from_pretrained(str(fresh_model), device="cpu")
    out = _sft(fresh_model, sft_data, tmp_path / "lora", max_steps=2, save_every=0,
               lora={"enabled": True, "r": 4, "alpha": 8})
    merged = HFPolicy.from_pretrained(out["final"], device="cpu").model
    assert not any("lora" in n for n, _ in merged.named_parameters())
    names = dict(base.model.named_parameters())
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, names[n])]
    assert changed and all(any(t in n for t in ("q_proj", "k_proj", "v_proj", "o_proj")) for n in changed)


def _torchrun(stage: str, model: str, data: str, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           str(ROOT / "tests" / "distributed_train.py"), stage, model, data, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "distributed.json").read_text())


@pytest.mark.slow
def test_two_processes_keep_the_same_weights(fresh_model: Path, sft_data: Path, tmp_path: Path) -> None:
    result = _torchrun("sft", str(fresh_model), str(sft_data), tmp_path / "dist")
    assert result["processes"] == 2 and result["steps"] == 2
    assert result["fingerprints"][0] == result["fingerprints"][1]
    assert result["saved"] == pytest.approx(result["fingerprints"][0], rel=1e-9)
    assert result["saved"] != result["start"]


def test_episode_weights_sum_to_the_aggregation() -> None:
    from mmagent.trajectory import Trajectory

    def traj(n_policy: int, n_total: int) -> Trajectory:
        t = Trajectory(task=Task(question="q"))
        t.prompt_length, t.loss_mask = 2, [0, 0] + [1] * n_policy + [0] * (n_total - n_policy)
        return t

    a, b = traj(3, 4), traj(1, 8)
    assert episode_weights([a, b], "grpo") == [0.5, 0.5]
    assert episode_weights([a, b], "dapo") == [0.75, 0.25]  # 3 and 1 of the 4 active tokens
    assert episode_weights([a, b], "dr_grpo") == [3 / 16, 1 / 16]  # tokens / (2 sequences * 8 long)
    # Two processes hold 4 episodes, 8 policy tokens, the longest 10 long; the engine halves the gradient sum.
    totals = (4, 8, 10)
    assert episode_weights([a, b], "grpo", totals, world=2) == [0.5, 0.5]  # 2 * 1/4
    assert episode_weights([a, b], "dapo", totals, world=2) == [0.75, 0.25]  # 2 * 3/8, 2 * 1/8
    assert episode_weights([a, b], "bnpo", totals, world=2) == [0.75, 0.25]  # this process's 4 tokens
    assert episode_weights([a, b], "dr_grpo", totals, world=2) == pytest.approx([0.15, 0.05])  # 2 * 3/40


# ----- RL ----------------------------------------------------------------------------------------------


def _success_rate(model: str, tasks: list[Task], samples: int, seed: int) -> float:
    """Share of sampled episodes (temperature 1, as in RL) whose answer is the task's letter."""
    from mmagent.agent import Agent, Budgets
    from mmagent.policy.sampling import SamplingConfig
    from mmagent.training.rewards import task_reward

    policy = HFPolicy.from_pretrained(model, device="cpu", dtype=torch.float32, media_budget=media_budget("synth"),
                                      sampling=SamplingConfig(temperature=1.0))
    agent = Agent(policy, tools=["resample_frames"], budgets=Budgets(max_turns=2, max_new_tokens=12))
    trajs = agent.run_batch([t for t in tasks for _ in range(samples)], seed=seed, progress=False)
    return sum(task_reward(t) for t in trajs) / len(trajs)


@pytest.fixture(scope="module")
def letter_world(fresh_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Task], str]:
    """One toy video question (answer C) and a model SFT-trained to answer it with A, B, C or D alike."""
    from itertools import cycle

    from mmagent.agent import Agent, Budgets
    from mmagent.policy.replay import ReplayChooser

    root = tmp_path_factory.mktemp("letter-world")
    tasks = synth.build(root / "world", per_family=1, seed=5, families=["video_qa"], progress=False)
    assert tasks[0].answer == "C"
    letters = cycle("ABCD")
    forced = HFPolicy.from_pretrained(str(fresh_model), device="cpu", dtype=torch.float32,
                                      media_budget=media_budget("synth"),
                                      chooser=ReplayChooser(lambda s, turn: f"<answer>{next(letters)}</answer>"
                                                            if turn == 0 else None))
    agent = Agent(forced, tools=["resample_frames"], budgets=Budgets(max_turns=2))
    # sorted: which episode gets which letter depends on the order the batch starts its episodes
    episodes = sorted(agent.run_batch([t for t in tasks for _ in range(8)], progress=False), key=lambda t: t.answer)
    save_jsonl(episodes, root / "uniform.jsonl")
    # 60 steps at 5e-3: at 40 steps and 1e-2, one SFT seed in eight ended unconverged (loss 0.81 against ~0.55,
    # 35 of 64 answers missing or malformed) and RL then failed from it; 60 at 5e-3 ended at 0.48-0.53 for all eight.
    sft = _sft(fresh_model, root / "uniform.jsonl", root / "sft", max_steps=60, lr=5e-3, save_every=0)
    return root / "world", tasks, sft["final"]


@pytest.mark.slow
def test_a_few_rl_steps_raise_the_reward(letter_world: tuple, tmp_path: Path) -> None:
    """SFT taught the format with every letter about equally likely; RL (DGRPO) must find the right one.

    Settings and margin from measurement (success on 64 samples at temperature 1; this fixture, SFT data
    order fixed, 1 thread): at rate 2e-3 for 40 steps, 2 of 16 runs (2 SFT seeds x 8 RL seeds) fell into an
    absorbing failure: one update taught the policy to write "<answer>C<answer>C..." without the
    closing tag, every rollout then scored alike, so no group had an advantage and nothing changed again (a CI
    machine ended at 0.0 so). At 1e-3, 32 runs of 40 steps (4 x 8) ended at 0.875-1.0, none collapsed, and 16
    runs of 60 steps (2 other SFT seeds x 8) at 0.94-1.0: so 60 steps at 1e-3, with 0.8 more than four standard
    errors below the lowest."""
    world, tasks, model = letter_world
    before = _success_rate(model, tasks, samples=64, seed=11)
    cfg = RLConfig(model=model, data=str(world), output_dir=str(tmp_path / "rl"), steps=60,
                   prompts_per_step=1, group_size=8, lr=1e-3, max_new_tokens=12, max_turns=2,
                   tools=["resample_frames"], device="cpu", save_every=8, freeze_vision=False)
    summary = train_rl(cfg, progress=False)
    after = _success_rate(summary["final"], tasks, samples=64, seed=11)
    assert 0.05 <= before <= 0.6 and after >= max(0.8, before + 0.3), (before, after)
    rows = summary["history"]
    assert len(rows) == 60 and all(r["episodes_trained"] in (0, 8) for r in rows)
    assert sum(r["episodes_trained"] for r in rows) > 0
    assert (tmp_path / "rl" / "checkpoints" / "step-000008").is_dir()


@pytest.mark.slow
def test_two_processes_stay_in_sync_in_rl(letter_world: tuple, tmp_path: Path) -> None:
    """Each rank rolls out its own groups (so they keep different episode counts); weights stay equal."""
    world, _, model = letter_world
    result = _torchrun("rl", model, str(world), tmp_path / "dist")
    assert result["processes"] == 2 and result["steps"] == 3
    assert result["fingerprints"][0] == result["fingerprints"][1]
    assert result["saved"] == pytest.approx(result["fingerprints"][0], rel=1e-9) and result["saved"] != result["start"]


def test_cached_episodes_train_exactly_as_re_encoded_ones(fresh_model: Path, sft_data: Path, tmp_path: Path) -> None:
    # 8 episodes, grad_accum 2: 8 steps are two epochs, so the second epoch runs from the cache
    plain = _sft(fresh_model, sft_data, tmp_path / "plain", max_steps=8, save_every=0)
    cached = _sft(fresh_model, sft_data, tmp_path / "cached", max_steps=8, save_every=0, cache_episodes=True)
    assert cached["param_fingerprint"] == pytest.approx(plain["param_fingerprint"], rel=1e-12, abs=1e-12)
    assert cached["loss"] == pytest.approx(plain["loss"], rel=1e-9)
