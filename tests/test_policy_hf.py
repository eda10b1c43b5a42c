"""The transformers policy on tiny random Qwen2.5-VL and Qwen3-VL models: loading, encoding, positions, KV reuse,
decoding (every test on ``family_model_dir`` runs for both families)."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy
from mmagent.policy.render import MediaBudget
from mmagent.policy.replay import ReplayChooser
from mmagent.policy.sampling import SamplingConfig
from mmagent.policy.segments import concat_segments
from mmagent.protocol import format_tool_call
from mmagent.toolbox import Observation

CALL = "<think>look again</think>" + format_tool_call("resample_frames", {"start": 0, "end": 2, "num_frames": 2})


def _frames(n: int = 2) -> Observation:
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    images = [Image.new("RGB", (96, 64), colours[k % 3]) for k in range(n)]
    return Observation(text=f"{n} frames", images=images, image_labels=[f"{k}.00s" for k in range(n)],
                       handles=[f"obs:{k + 1}" for k in range(n)])


def _policy(model_dir, **kwargs) -> HFPolicy:
    return HFPolicy.from_pretrained(str(model_dir), device="cpu", **kwargs)


def _start(policy: HFPolicy, media: EpisodeMedia, system: str = "sys", question: str = "q", seed: int = 0):
    """A session on the rendered first prompt, as the agent starts one; returns it and the view."""
    view = policy.renderer.prompt(system, question, media)
    return policy.start(view, seed=seed), view


def _observe(policy: HFPolicy, session, obs: Observation) -> int:
    return policy.observe(session, policy.renderer.observation(obs))


def _episode(policy: HFPolicy, video_path, turns: int = 3, images_per_obs: int = 2, max_new_tokens: int = 12):
    """start, then (generate, observe) x (turns - 1), then a last generate; returns session and generations."""
    session, _ = _start(policy, EpisodeMedia(video=video_path), "You are a test.", "What colour is it?")
    gens = []
    for k in range(turns):
        gens.append(policy.generate([session], max_new_tokens)[0])
        if k < turns - 1:
            _observe(policy, session, _frames(images_per_obs))
    return session, gens


def test_from_pretrained_loads_the_real_classes(family_model_dir):
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor

    policy = _policy(family_model_dir)
    assert type(policy.model) is policy.family.model_class()
    processor = {"qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[policy.family.name]
    assert isinstance(policy.processor, processor)
    assert policy.patch_factor == policy.family.patch_factor
    tok = policy.tokenizer
    for special in ("<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1, special
    text = 'caf\u00e9 <tool_call>{"a": 1.5}</tool_call>\n'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_missing_local_model_folder_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="make-tiny"):
        HFPolicy.from_pretrained(str(tmp_path / "nope"))


def test_first_prompt_encodes_video_frames_within_the_pixel_budget(family_model_dir, video_path):
    policy = _policy(family_model_dir, media_budget=MediaBudget(video_frames=8, video_min_pixels=28 * 28,
                                                              video_max_pixels=56 * 56))
    session, view = _start(policy, EpisodeMedia(video=video_path))
    seg = session.segments[0]
    t, h, w = seg.vision["video_grid_thw"][0].tolist()
    assert t == 4  # 8 frames, two per temporal patch
    patch = policy.patch_factor // 2
    assert h * w * patch * patch <= 56 * 56 * 1.01
    # every video token placeholder was expanded once: T*H*W / merge^2 tokens, what the renderer counted
    assert int((seg.mm_types == 2).sum()) == t * h * w // 4 == view.visual_tokens
    assert view.view_sizes["video"] == (w * patch, h * patch)
    assert view.frame_times == pytest.approx([0.25 + 0.5 * k for k in range(8)])
    assert session.loss_mask == [0] * len(session.token_ids) and session.prompt_length == len(session.token_ids)


def test_image_episode_records_the_view_size(family_model_dir):
    policy = _policy(family_model_dir, media_budget=MediaBudget(image_max_pixels=112 * 112))
    session, view = _start(policy, EpisodeMedia(image=Image.new("RGB", (400, 200), "white")))
    w, h = view.view_sizes["image"]
    f = policy.patch_factor
    assert w % f == 0 and h % f == 0 and w * h <= 112 * 112 and w / h == pytest.approx(2, rel=0.3)
    assert view.visual_tokens == (w // f) * (h // f) == int((session.segments[0].mm_types == 1).sum())


def test_incremental_positions_equal_get_rope_index_over_the_whole_sequence(family_model_dir, video_path):
    policy = _policy(family_model_dir)
    session, _ = _episode(policy, video_path, turns=3)
    inputs = policy.model_inputs(session)
    full, _ = policy.model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"],
        video_grid_thw=inputs["video_grid_thw"], second_per_grid_ts=inputs.get("second_per_grid_ts"))
    assert torch.equal(full, inputs["position_ids"])
    assert inputs["input_ids"][0].tolist() == session.token_ids


def test_every_observation_image_reaches_the_model_input(family_model_dir, video_path):
    policy = _policy(family_model_dir)
    session, _ = _episode(policy, video_path, turns=3, images_per_obs=3)
    inputs = policy.model_inputs(session)
    grids = inputs["image_grid_thw"]
    assert grids.shape[0] == 6  # two observations of three images
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert session.token_ids.count(image_pad) == int(grids.prod(-1).sum()) // 4
    assert inputs["pixel_values"].shape[0] == int(grids.prod(-1).sum())


def test_cached_logits_match_a_full_forward_of_the_conversation(family_model_dir, video_path):
    policy = _policy(family_model_dir)
    session, _ = _episode(policy, video_path, turns=2)
    _observe(policy, session, _frames(1))
    incremental = policy.begin_turns([session])[0].logits  # last generated token + observation on top of the cache
    inputs = policy.model_inputs(session)
    with torch.inference_mode():
        full = policy.model(**inputs, use_cache=False).logits[0, -1].float()
    assert torch.allclose(incremental, full, atol=1e-4), (incremental - full).abs().max()


def test_kv_cache_reuse_prefills_only_the_new_tokens(family_model_dir, video_path):
    """The claim of the issue: later turns prefill the observation only, not the conversation again."""
    script = [CALL, CALL, "<answer>A</answer>"]
    prefill = {}
    texts = {}
    for reuse in (True, False):
        policy = _policy(family_model_dir, reuse_cache=reuse, chooser=ReplayChooser(script))
        session, _ = _start(policy, EpisodeMedia(video=video_path), "You are a test.", "What colour is it?")
        before, obs_lengths, counts, out = [], [], [], []
        for k in range(3):
            before.append(len(session.token_ids))
            gen = policy.generate([session], 64)[0]
            counts.append(gen.prefill_tokens)
            out.append(gen.text)
            if k < 2:
                obs_lengths.append(_observe(policy, session, _frames(2)))
        prefill[reuse], texts[reuse] = counts, out
        if reuse:
            # turn 1: the prompt; later turns: the last sampled token + the observation segment
            assert counts == [before[0], obs_lengths[0] + 1, obs_lengths[1] + 1]
        else:
            # the re-encoding baseline runs the whole conversation so far every turn
            assert counts == before
    assert texts[True] == texts[False] == script
    assert sum(prefill[True][1:]) * 3 < sum(prefill[False][1:])


def test_greedy_outputs_are_the_same_with_and_without_cache_reuse(family_model_dir, video_path):
    outs = []
    for reuse in (True, False):
        policy = _policy(family_model_dir, reuse_cache=reuse)
        session, gens = _episode(policy, video_path, turns=3, max_new_tokens=8)
        outs.append(([g.token_ids for g in gens], session.token_ids))
    assert outs[0] == outs[1]


def test_token_ids_only_grow_and_the_mask_marks_exactly_the_generated_tokens(family_model_dir, video_path):
    policy = _policy(family_model_dir, chooser=ReplayChooser([CALL, "<answer>A</answer>"]))
    session, _ = _start(policy, EpisodeMedia(video=video_path))
    snapshot = list(session.token_ids)
    expected_mask = [0] * len(snapshot)
    gen = policy.generate([session], 64)[0]
    assert session.token_ids[:len(snapshot)] == snapshot
    expected_mask += [1] * len(gen.token_ids)
    snapshot = list(session.token_ids)
    n = _observe(policy, session, _frames(2))
    assert session.token_ids[:len(snapshot)] == snapshot
    expected_mask += [0] * n
    gen2 = policy.generate([session], 64)[0]
    expected_mask += [1] * len(gen2.token_ids)
    assert session.loss_mask == expected_mask
    generated = [t for t, m in zip(session.token_ids, session.loss_mask) if m]
    assert generated == gen.token_ids + gen2.token_ids
    assert policy.tokenizer.decode(gen.token_ids) == CALL
    assert len(session.logprobs) == len(session.token_ids)
    assert all(lp <= 0 for lp in session.logprobs)


def test_generation_stops_at_the_stop_string_and_reports_truncation(tiny_model_dir, video_path):
    policy = _policy(tiny_model_dir, chooser=ReplayChooser([CALL + " and more text", "x " * 50]))
    session, _ = _start(policy, EpisodeMedia(video=video_path))
    gen = policy.generate([session], 64)[0]
    assert gen.text == CALL and not gen.truncated
    _observe(policy, session, _frames(1))
    gen = policy.generate([session], 10)[0]
    assert gen.truncated and len(gen.token_ids) == 10


def test_vision_tokens_are_never_generated(family_model_dir, video_path):
    policy = _policy(family_model_dir)
    image_pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with torch.no_grad():  # make <|image_pad|> by far the likeliest next token
        policy.model.lm_head.weight[image_pad] = policy.model.lm_head.weight.abs().max() * 50
        policy.model.lm_head.weight[image_pad] *= torch.sign(torch.randn_like(policy.model.lm_head.weight[image_pad]))
    session, gens = _episode(policy, video_path, turns=1, max_new_tokens=16)
    banned = set(policy.suppress_ids.tolist())
    assert image_pad in banned and not banned & set(gens[0].token_ids)


def test_sampling_is_seeded_per_session(tiny_model_dir, video_path):
    def sample(seed: int) -> list[int]:
        policy = _policy(tiny_model_dir, sampling=SamplingConfig(temperature=1.0, top_p=0.95))
        session, _ = _start(policy, EpisodeMedia(video=video_path), seed=seed)
        return policy.generate([session], 16)[0].token_ids

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_concat_segments_joins_vision_inputs_in_order(family_model_dir, video_path):
    policy = _policy(family_model_dir)
    session, _ = _episode(policy, video_path, turns=2, images_per_obs=2)
    joined = concat_segments(session.segments)
    assert joined["input_ids"].shape == (1, len(session.token_ids))
    assert joined["position_ids"].shape == (3, 1, len(session.token_ids))
    assert joined["video_grid_thw"].shape[0] == 1 and joined["image_grid_thw"].shape[0] == 2
