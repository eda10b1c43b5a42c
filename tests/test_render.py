"""The one renderer of what the model sees, and the backends that map it: same text, same pixels, same counts."""

from __future__ import annotations

import logging
import re
import sys
import types

import numpy as np
import pytest
from PIL import Image

from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.messages import (MessageError, decode_image_url, decode_video_url, from_openai, to_openai,
                                     video_part)
from mmagent.policy.openai_http import OpenAIPolicy
from mmagent.policy.render import MediaBudget, Message, Part, Renderer, VideoClip, View
from mmagent.policy.vllm_engine import VLLMPolicy
from mmagent.protocol import format_tool_call
from mmagent.toolbox import Observation

CALL = "<think>again</think>" + format_tool_call("resample_frames", {"start": 0, "end": 2})
BUDGET = MediaBudget(video_frames=3, video_max_pixels=56 * 84, image_max_pixels=56 * 56,
                     observation_max_pixels=56 * 84)
PADS = re.compile(r"(<\|(?:image|video)_pad\|>)+")


def _observations() -> list[Observation]:
    return [Observation(text="2 frames", images=[Image.new("RGB", (96, 64), (200, 0, 0)),
                                                 Image.new("RGB", (50, 120), (0, 0, 200))],
                        image_labels=["0.50s", "1.50s"], handles=["obs:1", "obs:2"]),
            Observation(text="a crop", images=[Image.new("RGB", (300, 90), (9, 99, 9))], handles=["obs:3"])]


@pytest.fixture(scope="module")
def hf(tiny_model_dir) -> HFPolicy:
    return HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=BUDGET)


def test_the_renderer_writes_what_the_chat_template_writes(hf, caplog):
    parts = [Part(video=VideoClip([Image.new("RGB", (28, 28))], [0.0], 1.0)), Part(image=Image.new("RGB", (28, 28))),
             Part(text="Q?")]
    content = [{"type": "video"}, {"type": "image"}, {"type": "text", "text": "Q?"}]
    for system in (True, False):  # without a system turn the template writes its default one
        view = View(([Message("system", [Part(text="S")])] if system else []) + [Message("user", parts)], False)
        msgs = ([{"role": "system", "content": "S"}] if system else []) + [{"role": "user", "content": content}]
        assert view.text() == hf.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    # a model whose template is another format is loaded with a warning that says so
    template = hf.processor.chat_template
    try:
        hf.processor.chat_template = template.replace("<|im_start|>", "<|turn|>")
        with caplog.at_level(logging.WARNING, logger="mmagent.policy.hf"):
            HFPolicy(hf.model, hf.processor)
        assert "chat template" in caplog.text and "<|turn|>" in caplog.text
    finally:
        hf.processor.chat_template = template


def test_visual_token_counts_are_the_processors(hf, video_path):
    """The renderer's counts (what the agent's budget and every backend use) equal the tokens the model's
    processor expands the placeholders into: a 3-frame video padded to two slabs, the image, observations."""
    renderer = hf.renderer
    prompt = renderer.prompt("sys", "q", EpisodeMedia(video=video_path, image=Image.new("RGB", (400, 250))))
    assert len(prompt.videos[0].frames) == 3 and len(prompt.videos[0].padded()) == 4
    session = hf.start(prompt)
    assert prompt.visual_tokens == int((session.segments[0].mm_types != 0).sum()) > 0
    hf.append_turn(session, hf.tokenizer.encode(CALL, add_special_tokens=False))
    for obs in _observations():
        view = renderer.observation(obs)
        assert renderer.visual_tokens(obs.images) == view.visual_tokens  # what the budget asks before showing
        hf.observe(session, view)
        assert view.visual_tokens == int((session.segments[-1].mm_types == 1).sum()) > 0
        for handle, (w, h) in view.view_sizes.items():
            assert handle.startswith("obs:") and w % 28 == 0 and h % 28 == 0 and w * h <= BUDGET.observation_max_pixels


def test_observation_turn_names_each_image():
    obs = Observation(text="two", images=[Image.new("RGB", (64, 64))] * 2, image_labels=["at 1.00s", ""],
                      handles=["obs:4", "obs:5"])
    text = Renderer(BUDGET).observation(obs).text(close_turn=True)
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    assert text == (f"<|im_end|>\n<|im_start|>user\n<tool_response>\ntwo\nobs:4 (at 1.00s): {vision}\nobs:5: {vision}"
                    "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    unnamed = Renderer(BUDGET).observation(Observation(text="t", images=[Image.new("RGB", (64, 64))]))
    assert "image 1: " in unnamed.text(close_turn=False) and not unnamed.text(close_turn=False).startswith("<|im_end|>")
    assert unnamed.view_sizes == {}  # no handle: nothing a tool could address


class _TextEngine:
    """A stand-in for vllm.LLM: records each request (a prompt string with its media) and answers CALL."""

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.requests += prompts
        done = types.SimpleNamespace(text=CALL, token_ids=[1, 2], finish_reason="stop")
        return [types.SimpleNamespace(outputs=[done], prompt_token_ids=[0], num_cached_tokens=0) for _ in prompts]


def test_one_episode_through_every_backend_gives_the_model_the_same_input(hf, video_path, monkeypatch):
    """A multi-turn episode (video and image, two tool calls, three observation images) rendered once per
    step and mapped by the transformers, vLLM and OpenAI-HTTP input builders: the same conversation text
    around the vision placeholders, the same pixels in the same order, the same frame rate."""
    vllm_module = types.ModuleType("vllm")
    vllm_module.SamplingParams = lambda **kw: kw
    monkeypatch.setitem(sys.modules, "vllm", vllm_module)
    image = Image.new("RGB", (120, 90), (10, 200, 30))
    engine = _TextEngine()
    backends = {"hf": hf, "vllm": VLLMPolicy(engine, media_budget=BUDGET),
                "http": OpenAIPolicy("http://127.0.0.1:9/v1", model="m", media_budget=BUDGET)}
    sessions, shown = {}, []
    for name, policy in backends.items():
        view = policy.renderer.prompt("You are a test.", "What is green?", EpisodeMedia(video=video_path, image=image))
        sessions[name] = policy.start(view, seed=1)
        shown.append(view.images)
        for obs in _observations():
            if name == "hf":
                policy.append_turn(sessions[name], policy.tokenizer.encode(CALL, add_special_tokens=False))
            elif name == "vllm":
                policy.generate([sessions[name]], 16)
            else:
                sessions[name].messages.append({"role": "assistant", "content": CALL})
            view = policy.renderer.observation(obs)
            policy.observe(sessions[name], view)
            shown[-1] = shown[-1] + view.images
    backends["vllm"].generate([sessions["vllm"]], 16)  # sends the whole episode so far
    sent = engine.requests[-1]
    messages = sessions["http"].messages

    # text: the transformers ids decoded, vLLM's prompt, and what a server's chat template makes of the messages
    hf_text = PADS.sub(r"\1", hf.tokenizer.decode(sessions["hf"].token_ids))
    as_template = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
                    [{"type": "text", "text": p["text"]} if p["type"] == "text" else
                     {"type": "image" if p["type"] == "image_url" else "video"} for p in m["content"]]}
                   for m in messages]
    http_text = hf.processor.apply_chat_template(as_template, tokenize=False, add_generation_prompt=True)
    assert hf_text == sent["prompt"] == http_text

    # pixels: the images every backend was shown, in placeholder order, are the same
    hf_inputs = hf.model_inputs(sessions["hf"])
    http_images = [decode_image_url(p["image_url"]["url"]) for m in messages if isinstance(m["content"], list)
                   for p in m["content"] if p["type"] == "image_url"]
    assert len(sent["multi_modal_data"]["image"]) == len(http_images) == len(shown[0]) == 4
    for a, b, c, grid in zip(shown[0], sent["multi_modal_data"]["image"], http_images, hf_inputs["image_grid_thw"]):
        assert np.array_equal(np.asarray(a), np.asarray(b)) and np.array_equal(np.asarray(a), np.asarray(c))
        assert a.size == (int(grid[2]) * 14, int(grid[1]) * 14)
    frames = decode_video_url(next(p["video_url"]["url"] for p in messages[1]["content"] if p["type"] == "video_url"))
    video = sent["multi_modal_data"]["video"][0]
    assert video.shape[0] == 4 and len(frames) == 3  # vLLM gets whole temporal slabs, the server pads itself
    for k, frame in enumerate(frames):
        assert np.array_equal(video[k], np.asarray(frame))
    t, h, w = hf_inputs["video_grid_thw"][0].tolist()
    assert (t, h * 14, w * 14) == (2, video.shape[1], video.shape[2])
    assert sent["mm_processor_kwargs"]["fps"] == sessions["http"].fps == pytest.approx(3 / 4.0)


def test_wire_messages_read_back_to_the_same_view():
    """What the HTTP client sends, read back by the server, renders to the same text and the same pixels."""
    renderer = Renderer(BUDGET)
    obs = _observations()[0]
    obs_view = renderer.observation(obs)
    back = renderer.request(from_openai(to_openai(obs_view.messages)), continues=True)
    assert back.text() == obs_view.text() and back.visual_tokens == obs_view.visual_tokens
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(back.images, obs_view.images))
    # an image a client did not size is fitted to this budget; one it sized is kept as it came
    raw = renderer.request([Message("user", [Part(image=Image.new("RGB", (500, 300))), Part(text="q")])], False)
    assert raw.images[0].size == renderer.fit(Image.new("RGB", (500, 300)), "image").size
    sized = Image.new("RGB", (56, 28))
    assert renderer.request([Message("user", [Part(image=sized)])], False).images[0] is sized
    with pytest.raises(MessageError, match="same size"):
        uneven = video_part([Image.new("RGB", (56, 28)), Image.new("RGB", (28, 28))])
        from_openai([{"role": "user", "content": [uneven]}])
