"""Configs, and re-encoding episodes for training: ids round-trip, masks cover exactly the policy's turns."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from mmagent.eval.benchmarks import synth
from mmagent.eval.synth.families import SynthConfig
from mmagent.agent import Agent, Budgets
from mmagent.policy.hf import HFPolicy
from mmagent.policy.sampling import SamplingConfig
from mmagent.trajectory import load_jsonl
from mmagent.training.config import ConfigError, load_config
from mmagent.training.encode import EncodeError, encode_trajectory, forward_logits, next_token_targets
from mmagent.training.rl import RLConfig
from mmagent.training.sft import SFTConfig
from mmagent.training.synth_data import write_sft_data


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    root = tmp_path_factory.mktemp("train-world")
    tasks = synth.build(root, per_family=1, seed=0, progress=False)
    write_sft_data(tasks, root / "sft.jsonl", progress=False)
    return tasks, list(load_jsonl(root / "sft.jsonl"))


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=SynthConfig().media_budget(),
                                    sampling=SamplingConfig(temperature=1.0))


def test_config_from_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "rl.yaml"
    path.write_text("model: m\nsteps: 3\nadvantage:\n  mode: grpo\n")
    cfg = load_config(RLConfig, path, ["steps=5", "rewards.tool_bonus=0.5", "families=[image_qa]"])
    assert (cfg.model, cfg.steps, cfg.advantage.mode, cfg.rewards.tool_bonus, cfg.families) == \
        ("m", 5, "grpo", 0.5, ["image_qa"])
    with pytest.raises(ConfigError, match="unknown key 'stepz'.*known: model"):
        load_config(RLConfig, None, ["stepz=1"])
    with pytest.raises(ConfigError, match="group_size must be at least 2"):
        load_config(RLConfig, None, ["group_size=1"])
    with pytest.raises(ConfigError, match=r"not found.*shipped configs: rl_synth, sft_synth"):
        load_config(SFTConfig, tmp_path / "missing.yaml")
    assert load_config(SFTConfig, None, ["data=a.jsonl"]).data == ["a.jsonl"]
    assert Path("training/configs/sft_synth.yaml").is_file() and load_config(SFTConfig, "training/configs/sft_synth.yaml")
    assert load_config(RLConfig, "training/configs/rl_synth.yaml").advantage.mode == "dgrpo"
    assert load_config(RLConfig, "rl_synth", ["advantage.mode=grpo"]).advantage.mode == "grpo"  # shipped, by name


def test_oracle_episodes_encode_with_masks_on_the_policy_turns_only(world: tuple, policy: HFPolicy) -> None:
    _, trajs = world
    for traj in trajs:
        ep = encode_trajectory(policy, traj)
        ids, mask = ep.inputs["input_ids"][0], ep.loss_mask
        assert ids.shape == mask.shape and int(mask[:ep.prompt_length].sum()) == 0
        # The masked runs, decoded, are exactly the assistant turns.
        runs, cur = [], []
        for tok, m in zip(ids.tolist(), mask.tolist()):
            if m:
                cur.append(tok)
            elif cur:
                runs.append(cur)
                cur = []
        runs += [cur] if cur else []
        texts = [t.text for t in traj.turns if t.role == "assistant"]
        assert [policy.tokenizer.decode(r) for r in runs] == texts
        # Every image of every turn reaches the input: one vision block per frame slab / image.
        n_images = sum(len(o.images) for o in traj.observations) + (traj.task.image is not None)
        if n_images:
            assert ep.inputs["image_grid_thw"].shape[0] == n_images
        logits = forward_logits(policy.model, ep)
        targets, tmask = next_token_targets(ep)
        assert logits.shape[0] == ids.shape[0] and targets.shape == tmask.shape == (ids.shape[0] - 1,)


def test_rollout_inputs_are_reused_not_encoded_again(world: tuple, policy: HFPolicy, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """RL's rollouts keep what they encoded: training gets the very tensors re-encoding would build, without
    opening a video or running the processor again."""
    tasks, _ = world
    agent = Agent(policy, tools=list(synth.SYNTH_TOOLS), budgets=Budgets(max_turns=3, max_new_tokens=24),
                  keep_model_inputs=True)
    rollouts = agent.run_batch(tasks, seed=5, progress=False)
    assert all(t.model_inputs is not None for t in rollouts)
    rebuilt = [encode_trajectory(policy, dataclasses.replace(t, model_inputs=None)) for t in rollouts]
    import mmagent.training.encode as encode_module

    monkeypatch.setattr(encode_module, "EpisodeMedia", lambda *a, **k: pytest.fail("the media were opened again"))
    for traj, ref in zip(rollouts, rebuilt):
        ep = encode_trajectory(policy, traj)
        assert set(ep.inputs) == set(ref.inputs)
        for key in ref.inputs:
            assert torch.equal(ep.inputs[key], ref.inputs[key]), key
        assert torch.equal(ep.loss_mask, ref.loss_mask) and torch.equal(ep.old_logprobs, ref.old_logprobs)
        assert ep.prompt_length == ref.prompt_length
    tampered = dataclasses.replace(rollouts[0], token_ids=rollouts[0].token_ids[:-1] + [rollouts[0].token_ids[-1] + 1])
    with pytest.raises(EncodeError, match="do not hold its recorded token ids"):
        encode_trajectory(policy, tampered)
    assert "model_inputs" not in rollouts[0].to_dict(image_dir=tmp_path)  # in memory only, never saved
    evaluation = Agent(policy, tools=list(synth.SYNTH_TOOLS), budgets=Budgets(max_turns=1, max_new_tokens=8))
    assert evaluation.run_batch(tasks[:1], progress=False)[0].model_inputs is None


def test_sampled_rollouts_round_trip_token_for_token(world: tuple, policy: HFPolicy) -> None:
    tasks, _ = world
    agent = Agent(policy, tools=list(synth.SYNTH_TOOLS), budgets=Budgets(max_turns=3, max_new_tokens=24))
    rollouts = agent.run_batch(tasks, seed=5, progress=False)
    for traj in rollouts:
        ep = encode_trajectory(policy, traj)
        assert ep.inputs["input_ids"][0].tolist() == traj.token_ids
        assert ep.loss_mask.tolist() == traj.loss_mask
        assert torch.allclose(ep.old_logprobs, torch.tensor(traj.logprobs))
    broken = next(t for t in rollouts if any(turn.role == "tool" for turn in t.turns))
    k = broken.prompt_length
    while broken.loss_mask[k] == 1:  # past the first policy turn: into the first observation
        k += 1
    broken.token_ids[k + 3] = (broken.token_ids[k + 3] + 1) % 100
    with pytest.raises(EncodeError, match="observation re-encodes differently"):
        encode_trajectory(policy, broken)
