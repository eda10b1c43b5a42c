"""Model families: Qwen3-VL beside Qwen2.5-VL through the renderer, the transformers backend, the agent, SFT, RL,
``mmagent make-tiny`` and the vLLM request; an unsupported model type is refused with the supported list.

The tests that are the same for every family live in their own files on ``family_model_dir`` (parametrised over
both families); here are the checks of what is particular to Qwen3-VL (its chat template, its timestamps).
"""

from __future__ import annotations

import json
import re
import types

import numpy as np
import pytest
from PIL import Image

from mmagent import Agent
from mmagent.media import EpisodeMedia
from mmagent.policy.families import QWEN2_5_VL, QWEN3_VL, UnsupportedModel, family_for_name, family_of, get_family
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import MediaBudget, Message, Part, VideoClip, View
from mmagent.policy.replay import ReplayChooser
from mmagent.policy.vllm_engine import VLLMPolicy
from mmagent.protocol import format_tool_call
from mmagent.toolbox import Observation, create_tool

RESAMPLE = "<think>Look again.</think>" + format_tool_call("resample_frames", {"start": 1.0, "end": 2.0, "num_frames": 2})
ZOOM = "<think>Closer.</think>" + format_tool_call("zoom", {"bbox": [0, 0, 40, 28], "source": "obs:1"})
ANSWER = "<think>It is green.</think><answer>green</answer>"
STAMP = re.compile(r"<(\d+\.\d) seconds>")


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3_vl_dir) -> HFPolicy:
    return HFPolicy.from_pretrained(str(tiny_qwen3_vl_dir), device="cpu")


def _content(parts):
    return [{"type": p.kind} if p.kind != "text" else {"type": "text", "text": p.text} for p in parts]


def test_an_unsupported_model_type_names_the_supported_families(tmp_path):
    for bad in (lambda: family_of(types.SimpleNamespace(model_type="llava")), lambda: get_family("gemma3")):
        with pytest.raises(UnsupportedModel, match=r"Qwen2\.5-VL.*Qwen3-VL"):
            bad()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    with pytest.raises(UnsupportedModel, match="qwen3_vl"):
        HFPolicy.from_pretrained(str(tmp_path), device="cpu")
    assert family_of(types.SimpleNamespace(model_type="qwen3_vl_moe")) is QWEN3_VL
    assert family_for_name("Qwen/Qwen3-VL-8B-Instruct") is QWEN3_VL
    assert family_for_name("my-server-model") is QWEN2_5_VL


def test_qwen3_vl_views_are_what_its_chat_template_writes_tool_images_included(qwen3, video_path):
    """First prompt, an assistant turn and an observation with images, rendered by mmagent, equal the Qwen3-VL
    template applied to the same conversation with the observation as a ``tool`` turn; no default system turn."""
    assert qwen3.family is QWEN3_VL
    renderer = qwen3.renderer
    prompt = renderer.prompt("S", "What colour?", EpisodeMedia(video=video_path))
    obs = Observation(text="2 frames", images=[Image.new("RGB", (96, 64))] * 2, image_labels=["0.50s", "1.50s"],
                      handles=["obs:1", "obs:2"])
    view = renderer.observation(obs)
    tool = _content(view.messages[0].parts)
    assert tool[0]["text"].startswith("<tool_response>\n") and tool[-1]["text"].endswith("\n</tool_response>")
    tool[0]["text"] = tool[0]["text"][len("<tool_response>\n"):]
    tool[-1]["text"] = tool[-1]["text"][:-len("\n</tool_response>")]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": _content(prompt.messages[1].parts)},
                {"role": "assistant", "content": RESAMPLE}, {"role": "tool", "content": tool}]
    templated = qwen3.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.text() + RESAMPLE + view.text() == templated
    bare = View([Message("user", [Part(text="hi")])], False, family=QWEN3_VL)
    assert bare.text() == qwen3.processor.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                              add_generation_prompt=True)
    assert "You are a helpful assistant" not in bare.text()


def test_qwen3_vl_frames_carry_their_real_times(qwen3, video_path):
    """The first look: one ``<t seconds>`` per two-frame slab, t the mean of the real times of its frames; tool
    frames: each image block is preceded by its real time; every image reaches input_ids and pixel_values."""
    policy = qwen3
    media = EpisodeMedia(video=video_path)
    view = policy.renderer.prompt("S", "q", media)
    session = policy.start(view)
    times = view.videos[0].padded_times()
    expected = [f"{(a + b) / 2:.1f}" for a, b in zip(times[::2], times[1::2])]
    text = policy.tokenizer.decode(session.token_ids)
    assert STAMP.findall(text) == expected
    assert view.frame_times[0] == pytest.approx(4.0 / 16 / 2)  # the centre of the first slice, not 0
    policy.append_turn(session, policy.tokenizer.encode(RESAMPLE, add_special_tokens=False))
    obs = create_tool("resample_frames")({"start": 1.0, "end": 3.0, "num_frames": 3}, media)
    obs.handles = ["obs:1", "obs:2", "obs:3"]
    policy.observe(session, policy.renderer.observation(obs))
    seg = session.segments[-1]
    ids = seg.ids.tolist()
    start = policy.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    blocks = [k for k, t in enumerate(ids) if t == start]
    assert len(blocks) == 3 == seg.vision["image_grid_thw"].shape[0]
    for k, t in zip(blocks, obs.data["timestamps"]):
        before = policy.tokenizer.decode(ids[max(0, k - 8):k])
        assert before.endswith(f"<{t:.1f} seconds>"), before
        assert int(seg.mm_types[k + 1]) == 1  # the image's tokens follow its time
    assert int((seg.mm_types == 1).sum()) == int(seg.vision["image_grid_thw"].prod(-1).sum()) // 4
    media.close()


def test_qwen3_vl_agent_episode_masks_exactly_the_policy_turns(tiny_qwen3_vl_dir, video_path):
    """Agent end to end on Qwen3-VL: resample, zoom into a returned frame, answer; the loss mask is 1 on exactly
    the generated turns' ids and every tool image is in the inputs training sees."""
    policy = HFPolicy.from_pretrained(str(tiny_qwen3_vl_dir), device="cpu",
                                      chooser=ReplayChooser([RESAMPLE, ZOOM, ANSWER]))
    traj = Agent(policy, keep_model_inputs=True).run("What colour?", video=video_path).trajectory
    assert traj.answer == "green"
    spans, k = [], 0
    while k < len(traj.loss_mask):  # the runs of mask 1
        if traj.loss_mask[k]:
            j = k
            while j < len(traj.loss_mask) and traj.loss_mask[j]:
                j += 1
            spans.append(traj.token_ids[k:j])
            k = j
        k += 1
    assert [policy.tokenizer.decode(s) for s in spans] == [RESAMPLE, ZOOM, ANSWER]
    assert [len(s) for s in spans] == [t.num_tokens for t in traj.turns if t.role == "assistant"]
    inputs = traj.model_inputs
    assert inputs["image_grid_thw"].shape[0] == 3  # two frames and one crop
    assert inputs["input_ids"][0].tolist() == traj.token_ids


def test_make_tiny_builds_a_qwen3_vl_that_trains_with_sft_and_rl(tmp_path, capsys):
    from mmagent.cli import main
    from mmagent.eval.benchmarks import synth
    from mmagent.training.rl import RLConfig, train_rl
    from mmagent.training.sft import SFTConfig, train_sft
    from mmagent.training.synth_data import write_sft_data

    assert main(["make-tiny", str(tmp_path / "m"), "--family", "qwen3_vl", "--no-imprint"]) == 0
    assert "Qwen3-VL" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen3_vl"
    tasks = synth.build(tmp_path / "world", per_family=1, seed=0, families=["video_qa"], progress=False)
    write_sft_data(tasks, tmp_path / "sft.jsonl", progress=False)
    sft = train_sft(SFTConfig(model=str(tmp_path / "m"), data=[str(tmp_path / "sft.jsonl")],
                              output_dir=str(tmp_path / "sft"), max_steps=2, grad_accum=1, save_every=0, device="cpu",
                              freeze_vision=False), progress=False)
    assert np.isfinite(sft["loss"]) and sft["loss"] > 0
    rl = train_rl(RLConfig(model=sft["final"], data=str(tmp_path / "world"), output_dir=str(tmp_path / "rl"),
                           steps=1, prompts_per_step=1, group_size=2, max_new_tokens=8, max_turns=1,
                           tools=["resample_frames"], device="cpu", save_every=0, freeze_vision=False),
                  progress=False)
    assert len(rl["history"]) == 1
    assert HFPolicy.from_pretrained(rl["final"], device="cpu").family is QWEN3_VL


class _Engine:
    """Records what VLLMPolicy would hand to ``vllm.LLM.generate``."""

    def __init__(self, model_type: str) -> None:
        self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(
            hf_config=types.SimpleNamespace(model_type=model_type)))


@pytest.mark.parametrize("model_type", ["qwen2_5_vl", "qwen3_vl"])
def test_vllm_requests_say_what_each_family_needs_for_a_video(model_type):
    policy = VLLMPolicy(_Engine(model_type), media_budget=MediaBudget())
    clip = VideoClip([Image.new("RGB", (64, 64))] * 3, [0.5, 1.5, 2.5], 1.0)
    view = View([Message("system", [Part(text="S")]), Message("user", [Part(video=clip), Part(text="q")])], False,
                family=policy.family)
    req = policy._request(policy.start(view))
    video = req["multi_modal_data"]["video"][0]
    if model_type == "qwen3_vl":
        frames, meta = video
        assert meta["frames_indices"] == [0.5, 1.5, 2.5, 2.5] and meta["fps"] == 1.0 and frames.shape[0] == 4
        assert req["mm_processor_kwargs"] == {"do_resize": False, "do_sample_frames": False}
    else:
        assert isinstance(video, np.ndarray) and req["mm_processor_kwargs"] == {"do_resize": False, "fps": 1.0}
        assert req["prompt"].startswith("<|im_start|>system\nS")


def test_an_agent_over_http_against_mmagent_serve_on_qwen3_vl(qwen3, video_path):
    """The OpenAI-compatible client (family read from the served name) against ``mmagent serve`` on Qwen3-VL: the
    server re-renders the request for Qwen3-VL and its prompt count equals the in-process encoding of it."""
    from mmagent.policy.messages import from_openai, to_openai
    from mmagent.policy.openai_http import OpenAIPolicy
    from mmagent.serve import ChatEngine, EngineConfig, Server

    server = Server(ChatEngine(qwen3, "tiny-qwen3-vl", EngineConfig()), port=0)
    server.start()
    try:
        client = OpenAIPolicy(base_url=server.url, model="tiny-qwen3-vl", media_budget=qwen3.media_budget)
        assert client.family is QWEN3_VL and client.renderer.factor == 32
        view = client.renderer.prompt("S", "What colour?", EpisodeMedia(video=video_path))
        session = client.start(view)
        gen = client.generate([session], 6)[0]
        local = qwen3.start(qwen3.renderer.request(from_openai(to_openai(view.messages), view.videos[0].fps), False))
        assert session.num_tokens == len(local.token_ids) + gen.num_tokens
    finally:
        server.stop()


def test_a_qwen3_vl_moe_checkpoint_runs_the_same_episode(tiny_qwen3_vl_dir, video_path, tmp_path):
    """The MoE variant (``qwen3_vl_moe``) goes through the same family: built from the dense tiny config with
    four experts, saved with the dense model's tokenizer and processor, it loads by its folder like any
    checkpoint and plays the same scripted episode with the same loss-mask spans and tool images."""
    import shutil

    import torch
    from transformers import AutoConfig, Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    dense = AutoConfig.from_pretrained(tiny_qwen3_vl_dir).to_dict()
    text = {k: v for k, v in dense["text_config"].items() if k not in ("model_type", "architectures")}
    text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    config = Qwen3VLMoeConfig(text_config=text, vision_config=dense["vision_config"],
                              image_token_id=dense["image_token_id"], video_token_id=dense["video_token_id"],
                              vision_start_token_id=dense["vision_start_token_id"],
                              vision_end_token_id=dense["vision_end_token_id"], tie_word_embeddings=False)
    torch.manual_seed(0)
    moe = tmp_path / "moe"
    Qwen3VLMoeForConditionalGeneration(config).eval().save_pretrained(moe)
    for f in tiny_qwen3_vl_dir.iterdir():
        if not f.name.startswith(("config", "model", "generation")):
            shutil.copy(f, moe / f.name)
    assert family_of(AutoConfig.from_pretrained(moe)) is QWEN3_VL
    policy = HFPolicy.from_pretrained(str(moe), device="cpu", chooser=ReplayChooser([RESAMPLE, ZOOM, ANSWER]))
    assert type(policy.model).__name__ == "Qwen3VLMoeForConditionalGeneration"
    traj = Agent(policy, keep_model_inputs=True).run("What colour?", video=video_path).trajectory
    assert traj.answer == "green"
    mask = np.asarray(traj.loss_mask)
    starts = np.flatnonzero(np.diff(np.concatenate([[0], mask])) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate([mask, [0]])) == -1) + 1
    spans = [policy.tokenizer.decode(traj.token_ids[a:b]) for a, b in zip(starts, ends)]
    assert spans == [RESAMPLE, ZOOM, ANSWER]
    assert traj.model_inputs["image_grid_thw"].shape[0] == 3
