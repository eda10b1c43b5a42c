"""vLLM as the RL rollout generator, where vLLM cannot run (no GPU here): the bookkeeping around it.

The engine is replaced by a stand-in that does what ``vllm.LLM.generate`` is documented to do with a
token prompt (expand each single image/video placeholder into the image's tokens, return the expanded
``prompt_token_ids``, the generated ids and each sampled token's log-probability). Through it, an episode
recorded by :class:`VLLMPolicy` with ``token_in_out=True`` must be token for token the episode the
transformers backend records, and must pass the trainer's re-encoding check. The weight push is checked
on the real peft model: the engine must receive the merged weights under plain checkpoint names.
"""

from __future__ import annotations

import copy
import importlib.util
import types

import pytest
import torch

from mmagent import Agent
from mmagent.cli import main
from mmagent.policy.render import MediaBudget
from mmagent.policy.hf import HFPolicy
from mmagent.policy.replay import ReplayChooser
from mmagent.policy.vllm_engine import VLLMPolicy
from mmagent.protocol import format_tool_call
from mmagent.training.common import LoraSettings, make_trainable
from mmagent.training.encode import encode_trajectory
from mmagent.training.rl import RLConfig
from mmagent.training.vllm_rollouts import push_weights, resolve_backend

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
CALL = "<think>Look again.</think>" + format_tool_call("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})
ANSWER = "<think>It is green.</think><answer>green</answer>"
BUDGET = MediaBudget(video_frames=4, video_max_pixels=56 * 84, observation_max_pixels=56 * 56)


class _StandInLLM:
    """What vllm.LLM.generate does with {"prompt_token_ids", "multi_modal_data"} requests, on CPU."""

    def __init__(self, tokenizer, script, patch_factor: int = 28) -> None:
        self.tokenizer, self.script, self.f = tokenizer, list(script), patch_factor
        vocab = tokenizer.get_vocab()
        self.image_pad, self.video_pad = vocab["<|image_pad|>"], vocab["<|video_pad|>"]
        self.turn = 0
        self.sent: list[dict] = []

    def get_tokenizer(self):
        return self.tokenizer

    def _expand(self, req: dict) -> list[int]:
        images = list(req.get("multi_modal_data", {}).get("image", []))
        videos = list(req.get("multi_modal_data", {}).get("video", []))
        out = []
        for tok in req["prompt_token_ids"]:
            if tok == self.image_pad:
                im = images.pop(0)
                out += [tok] * ((im.height // self.f) * (im.width // self.f))
            elif tok == self.video_pad:
                v = videos.pop(0)
                out += [tok] * (v.shape[0] // 2 * (v.shape[1] // self.f) * (v.shape[2] // self.f))
            else:
                out.append(tok)
        assert not images and not videos, "more media than placeholders"
        return out

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        outs = []
        for req, params in zip(prompts, sampling_params):
            assert "prompt" not in req and params["logprobs"] == 0
            self.sent.append(req)
            ids = self.tokenizer.encode(self.script[self.turn], add_special_tokens=False)
            self.turn += 1
            logprobs = [{t: types.SimpleNamespace(logprob=-0.01 * (k + 1))} for k, t in enumerate(ids)]
            done = types.SimpleNamespace(text=self.tokenizer.decode(ids), token_ids=ids, logprobs=logprobs,
                                         finish_reason="stop")
            outs.append(types.SimpleNamespace(outputs=[done], prompt_token_ids=self._expand(req), num_cached_tokens=0))
        return outs


@pytest.fixture()
def fake_vllm(monkeypatch):
    import sys

    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", module)


def test_token_in_out_episode_equals_the_transformers_one_and_re_encodes(tiny_model_dir, video_path, fake_vllm):
    hf = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=BUDGET,
                                  chooser=ReplayChooser([CALL, ANSWER]))
    reference = Agent(hf, tools=["resample_frames"]).run("What colour is shown at 1.5 s?", video=video_path).trajectory
    llm = _StandInLLM(hf.tokenizer, [CALL, ANSWER], patch_factor=hf.patch_factor)
    policy = VLLMPolicy(llm, media_budget=BUDGET, token_in_out=True, patch_factor=hf.patch_factor)
    traj = Agent(policy, tools=["resample_frames"]).run("What colour is shown at 1.5 s?", video=video_path).trajectory
    assert traj.answer == "green" and [len(o.images) for o in traj.observations] == [2]
    # the second request carried one placeholder per image, not the expanded run
    second = llm.sent[1]
    assert second["prompt_token_ids"].count(llm.image_pad) == len(second["multi_modal_data"]["image"]) == 2
    assert traj.token_ids == reference.token_ids and traj.loss_mask == reference.loss_mask
    assert traj.prompt_length == reference.prompt_length
    # the trainer rebuilds it with the transformers model: same tokens, and the sampler's log-probabilities
    episode = encode_trajectory(hf, traj)
    assert episode.loss_mask.tolist() == traj.loss_mask
    policy_lp = episode.old_logprobs[episode.loss_mask.bool()]
    n_call = len(hf.tokenizer.encode(CALL, add_special_tokens=False))
    assert policy_lp[:3].tolist() == pytest.approx([-0.01, -0.02, -0.03])
    assert policy_lp[n_call:n_call + 1].tolist() == pytest.approx([-0.01])  # the answer turn starts again


def test_a_prompt_that_does_not_extend_the_episode_is_an_error(tiny_model_dir, video_path, fake_vllm):
    hf = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=BUDGET)
    llm = _StandInLLM(hf.tokenizer, [CALL, ANSWER], patch_factor=hf.patch_factor)
    expand = llm._expand
    llm._expand = lambda req: [0] + expand(req) if llm.turn > 1 else expand(req)  # a different tokenizer, say
    policy = VLLMPolicy(llm, media_budget=BUDGET, token_in_out=True, patch_factor=hf.patch_factor)
    with pytest.raises(RuntimeError, match="does not extend the episode's earlier tokens"):
        Agent(policy, tools=["resample_frames"]).run("What colour?", video=video_path)


class _EngineModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.received: dict[str, torch.Tensor] = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.received[name] = tensor.clone()


def test_push_weights_sends_merged_lora_weights_under_checkpoint_names(tiny_model_dir):
    hf = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", dtype=torch.float32)
    base = {k: v.clone() for k, v in hf.model.state_dict().items()}
    plain_names = set(base)
    model = make_trainable(hf, LoraSettings(enabled=True, r=4), freeze_vision=True)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # as if trained: the merged weights differ from the base ones
    expected = copy.deepcopy(model).merge_and_unload().state_dict()
    engine = _EngineModel()
    resets = []
    llm = types.SimpleNamespace(
        llm_engine=types.SimpleNamespace(model_executor=types.SimpleNamespace(
            driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=engine)))),
        reset_prefix_cache=lambda: resets.append(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n = push_weights(llm, model)
    assert n == len(engine.received) and set(engine.received) == plain_names == set(expected)
    q = next(k for k in expected if k.endswith("layers.0.self_attn.q_proj.weight"))
    assert not torch.allclose(expected[q], base[q])  # the adapters really moved the weights that were sent
    for k, v in expected.items():
        assert torch.allclose(engine.received[k], v, atol=1e-6), k
    assert resets == [1]
    after = model.state_dict()  # unmerged again: training goes on from the same adapters
    assert all(torch.allclose(after[k], before[k], atol=1e-6) for k in before)


def test_rollout_backend_choice_and_errors(tiny_model_dir, tmp_path, capsys):
    assert resolve_backend("hf") == "hf"
    assert resolve_backend("auto") == ("vllm" if HAVE_VLLM and torch.cuda.is_available() else "hf")
    with pytest.raises(ValueError, match="unknown rollout_backend 'sglang'; use hf, vllm, auto"):
        RLConfig(rollout_backend="sglang")
    if not HAVE_VLLM:
        from mmagent.eval.benchmarks import synth

        synth.build(tmp_path / "toy", per_family=1, seed=0, families=["video_qa"], progress=False)
        rc = main(["train", "rl", "--config", "rl_synth", f"model={tiny_model_dir}", f"data={tmp_path / 'toy'}",
                   f"output_dir={tmp_path / 'rl'}", "rollout_backend=vllm", "steps=1", "--quiet"])
        assert rc == 2 and "pip install mmagent[vllm]" in capsys.readouterr().err
