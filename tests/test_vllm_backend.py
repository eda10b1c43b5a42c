"""The vLLM backend where vLLM is not installed: the error that says how to get it, and the prompt it would
send (checked against the transformers backend's tokens through a stand-in engine)."""

from __future__ import annotations

import importlib.util
import re
import sys
import types

import pytest
from PIL import Image

from mmagent.eval.benchmarks import synth
from mmagent.cli import main
from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import MediaBudget
from mmagent.policy.vllm_engine import VLLMPolicy, VLLMUnavailable
from mmagent.protocol import STOP_STRINGS, format_tool_call
from mmagent.toolbox import Observation

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
CALL = "<think>again</think>" + format_tool_call("resample_frames", {"start": 0, "end": 2})


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here")
def test_without_vllm_the_backend_says_how_to_install_it(tmp_path, tiny_model_dir, capsys):
    with pytest.raises(VLLMUnavailable, match=r"pip install mmagent\[vllm\]"):
        VLLMPolicy.from_pretrained(str(tiny_model_dir))
    synth.build(tmp_path / "toy", per_family=1, seed=1, families=["image_qa"], progress=False)
    rc = main(["eval", "--bench", "synth", "--data-dir", str(tmp_path / "toy"), "--model", str(tiny_model_dir),
               "--backend", "vllm", "--quiet", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "pip install mmagent[vllm]" in err[0]
    assert not (tmp_path / "run").exists()


class _FakeOutput:
    def __init__(self, text: str, prompt: str) -> None:
        self.outputs = [types.SimpleNamespace(text=text, token_ids=[1, 2, 3], finish_reason="stop")]
        self.prompt_token_ids = list(range(len(prompt) // 4))
        self.num_cached_tokens = 5


class _FakeLLM:
    """Records what LLM.generate is given; every turn is CALL."""

    def __init__(self) -> None:
        self.requests: list[list[dict]] = []
        self.params: list = []

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.requests.append(prompts)
        self.params.append(sampling_params)
        return [_FakeOutput(CALL, p["prompt"]) for p in prompts]


def _collapse(text: str) -> str:
    return re.sub(r"(<\|(?:image|video)_pad\|>)+", r"\1", text)


def test_the_prompt_and_media_it_sends_match_the_transformers_backend(tiny_model_dir, video_path, monkeypatch):
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    budget = MediaBudget(video_frames=3, video_max_pixels=56 * 84, image_max_pixels=56 * 56)
    image = Image.new("RGB", (120, 90), (10, 200, 30))
    obs = Observation(text="2 frames", images=[Image.new("RGB", (96, 64)), Image.new("RGB", (96, 64), (9, 9, 9))],
                      image_labels=["0.50s", "1.50s"], handles=["obs:1", "obs:2"])

    llm = _FakeLLM()
    policy = VLLMPolicy(llm, media_budget=budget)
    media = EpisodeMedia(video=video_path, image=image)
    prompt, observation = policy.renderer.prompt("You are a test.", "What is green?", media), None
    session = policy.start(prompt, seed=3)
    gen = policy.generate([session], 16)[0]
    assert gen.text == CALL and gen.prefill_tokens == len(llm.requests[0][0]["prompt"]) // 4 - 5
    observation = policy.renderer.observation(obs)
    policy.observe(session, observation)
    policy.generate([session], 16)

    hf = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=budget)
    ref = hf.start(hf.renderer.prompt("You are a test.", "What is green?", EpisodeMedia(video=video_path, image=image)))
    hf.append_turn(ref, hf.tokenizer.encode(CALL, add_special_tokens=False))
    hf.observe(ref, hf.renderer.observation(obs))
    # the same text around the placeholders (vLLM expands each into the image's tokens, as HF did)
    sent = llm.requests[1][0]
    assert sent["prompt"] == _collapse(hf.tokenizer.decode(ref.token_ids))
    mm = sent["multi_modal_data"]
    sizes = {**prompt.view_sizes, **observation.view_sizes}
    assert [im.size for im in mm["image"]] == [sizes[h] for h in ("image", "obs:1", "obs:2")]
    assert mm["video"][0].shape[0] % 2 == 0 and sent["mm_processor_kwargs"]["do_resize"] is False
    assert sent["mm_processor_kwargs"]["fps"] == pytest.approx(3 / media.video.duration)
    params = llm.params[1][0]
    assert params["stop"] == list(STOP_STRINGS) and params["include_stop_str_in_output"] is True
    assert params["temperature"] == 0.0 and params["max_tokens"] == 16
    assert llm.params[0][0]["seed"] != params["seed"]  # each turn its own seed
