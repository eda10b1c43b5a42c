"""Drills and the drill pre-training stage: fresh rounds whose answers are true of their pixels, encoded as
the agent renders episodes, and a trainer that learns from them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from mmagent.eval.synth import render
from mmagent.eval.synth.drills import KINDS, PERCEPTION, make_round
from mmagent.eval.synth.families import SynthConfig, sign_cities
from mmagent.eval.synth.perception import blob_colour, classify_shape, find_shape, frame_colour, read_label_sharp
from mmagent.protocol import parse_turn

CFG = SynthConfig()


def test_rounds_are_seeded_and_every_kind_is_drawn() -> None:
    for kind in KINDS:
        a = make_round(kind, np.random.default_rng([7, 1]))
        b = make_round(kind, np.random.default_rng([7, 1]))
        c = make_round(kind, np.random.default_rng([7, 2]))
        assert a.answer == b.answer and a.text == b.text, kind
        assert (a.answer, a.text) != (c.answer, c.text) or kind == "whole", kind
        shown = kind in PERCEPTION or kind in ("search", "grounding_text")  # tool text, no pixels, in the last two
        assert (a.observation is not None or a.view is not None) == shown, kind
    with pytest.raises(ValueError, match="unknown drill"):
        make_round("nope", np.random.default_rng(0))


def test_flash_and_screen_answers_are_what_the_frames_show() -> None:
    rng = np.random.default_rng(3)
    seen_shapes = 0
    for _ in range(12):
        r = make_round("flash", rng)
        times = r.observation.data["timestamps"]
        assert r.observation.image_labels == [f"{t:.2f}s" for t in times]
        m = re.fullmatch(r"The frame at ([\d.]+)s shows an? (\w+) (\w+)\.", r.answer)
        if m is None:
            assert r.answer.startswith("No frame") and all(find_shape(im) is None for im in r.observation.images)
            continue
        seen_shapes += 1
        t, colour, shape = float(m.group(1)), m.group(2), m.group(3)
        k = times.index(t)
        assert all(find_shape(im) is None for im in r.observation.images[:k])  # the first frame that shows it
        mask = find_shape(r.observation.images[k])
        assert blob_colour(r.observation.images[k], mask) == colour
        assert classify_shape(mask, list(render.SHAPES)) == shape
    assert seen_shapes >= 8
    r = make_round("screen", np.random.default_rng(4))
    said = re.findall(r"(\w+) at ([\d.]+)s", r.answer)
    assert [c for c, _ in said] == [frame_colour(im) for im in r.observation.images]
    assert [f"{float(t):.2f}s" for _, t in said] == r.observation.image_labels


def test_zoom_drills_show_the_label_whole_and_readable() -> None:
    """The zoom (the real tool, its box a few pixels off) holds the whole label, and the oracle's reader reads
    the answer's text from the image as the policy is shown it (fitted to the observation budget)."""
    from mmagent.policy.render import Renderer

    renderer = Renderer(CFG.media_budget())
    rng = np.random.default_rng(5)
    names = [c["name"].upper() for c in sign_cities()]
    for kind in ("tag", "sign") * 6:
        r = make_round(kind, rng)
        m = re.fullmatch(r"The zoomed (\w+) (?:tag|sign) reads (\w+)\.", r.answer)
        assert m is not None and m.group(2).upper() == r.meta["text"].upper(), r.answer
        text = r.meta["text"]
        x, y, w, h = r.meta["label_box"]
        bx1, by1, bx2, by2 = r.observation.data["box_source"]
        assert bx1 <= x and by1 <= y and x + w <= bx2 and y + h <= by2  # the whole label is in the crop
        shown = renderer.fit(r.observation.images[0], "observation")
        sx, sy = shown.width / (bx2 - bx1), shown.height / (by2 - by1)
        box = ((x - bx1) * sx, (y - by1) * sy, (x + w - bx1) * sx, (y + h - by1) * sy)
        candidates = list("0123456789") if kind == "tag" else sorted({text, *names[:6]})
        read, _ = read_label_sharp(shown, box, (w, h), candidates, tuple(r.meta["background"]))
        assert read == text, (kind, text, read)


def test_where_answers_a_zoom_call_on_the_named_label() -> None:
    rng = np.random.default_rng(6)
    for _ in range(4):
        r = make_round("where", rng)
        assert r.view.size == CFG.image_view_size()
        call = parse_turn(r.answer).action
        assert call.name == "zoom" and call.arguments["bbox"] == r.meta["bbox"]
        x1, y1, x2, y2 = call.arguments["bbox"]
        assert 0 <= x1 < x2 <= r.view.width and 0 <= y1 < y2 <= r.view.height


def test_search_drills_copy_coordinates_with_their_signs() -> None:
    rng = np.random.default_rng(8)
    southern = 0
    for _ in range(30):
        r = make_round("search", rng)
        m = re.search(r"<answer>(-?[\d.]+), (-?[\d.]+)</answer>", r.answer)
        assert m is not None
        lat, lon = float(m.group(1)), float(m.group(2))
        text = r.observation.text
        assert f"{abs(lat):.2f} {'N' if lat >= 0 else 'S'} {abs(lon):.2f} {'E' if lon >= 0 else 'W'}" in text
        southern += lat < 0 or lon < 0
    assert southern > 0


def test_option_drills_answer_the_letter_of_what_was_seen() -> None:
    rng = np.random.default_rng(9)
    for _ in range(20):
        r = make_round("option", rng)
        think, letter = re.fullmatch(r"<think>(.*)</think>\n<answer>([ABCD])</answer>", r.answer).groups()
        options = dict(re.findall(r"^([ABCD])\. (\w+)$", r.text, flags=re.M))
        seen = r.text.rsplit("\n", 1)[1]
        assert re.search(rf"\b{options[letter]}\b", seen)
        assert sum(bool(re.search(rf"\b{v}\b", seen)) for v in options.values()) >= 1
        # the seen sentence, then the seen value held against each option up to the one that matches
        checks = re.findall(r"(\w+) vs ([ABCD])\. (\w+): (yes|no)\.", think)
        assert think.startswith(seen + " ") and [c[1] for c in checks] == list("ABCD"[:"ABCD".index(letter) + 1])
        assert all(value == options[letter] and options[k] == v and (said == "yes") == (k == letter)
                   for value, k, v, said in checks)


def test_video_answer_rounds_are_an_episode_last_turn_true_of_their_frames() -> None:
    from mmagent.eval.synth.oracle import choose

    rng = np.random.default_rng(21)
    for _ in range(6):
        r = make_round("video_answer", rng)
        options = dict(re.findall(r"^([ABCD])\. (\w+)$", r.text, flags=re.M))
        w0, w1 = (float(v) for v in re.search(r"between (\d+) s and (\d+) s", r.text).groups())
        assert json.loads(r.call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"] == {
            "start": w0, "end": w1, "num_frames": CFG.probe_frames}
        asked = r.meta["colour"] if "colour" in r.text else r.meta["shape"]
        assert options[r.meta["letter"]] == asked and r.answer.endswith(f"<answer>{r.meta['letter']}</answer>")
        seen = [k for k, im in enumerate(r.observation.images) if find_shape(im) is not None]
        assert 1 <= len(seen) <= 3
        t = r.observation.data["timestamps"][seen[0]]
        think = f"The frame at {t:.2f}s shows {'an' if r.meta['colour'][0] in 'aeiou' else 'a'} {r.meta['colour']} {r.meta['shape']}."
        assert r.answer == choose(think, [options[k] for k in "ABCD"], asked)
        assert all(w0 <= t <= w1 for t in r.observation.data["timestamps"])


def test_grounding_turns_copy_frame_times_the_frames_bear_out() -> None:
    """Every call of a grounding round looks between a frame without the colour and one with it (or looks at
    the whole video first); the answer's times are the first frame of the colour and the first after it, and
    the truth lies within the oracle's tolerance of them."""
    from mmagent.eval.synth.oracle import BOUNDARY_TOLERANCE_S

    rng = np.random.default_rng(31)
    turns_seen = set()
    for _ in range(8):
        r = make_round("grounding_turn", rng)
        colour = re.search(r"screen (\w+)\?", r.text).group(1)
        exchanges = [*r.history, (r.call, r.observation)]
        assert len(exchanges) == r.meta["turn"] and r.meta["turn"] < r.meta["turns"]
        turns_seen.add(r.meta["turn"])
        first = json.loads(exchanges[0][0].split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]
        assert first["start"] == 0.0 and f"{first['end']:g} s long" in r.text
        seen = {round(t, 2): frame_colour(im) == colour for _, obs in exchanges
                for t, im in zip(obs.data["timestamps"], obs.images)}
        assert any(seen.values())
        ends = {0.0: False, first["end"]: False}  # a boundary before the first frame or after the last seen
        for call, _ in exchanges[1:]:  # each refining call brackets a boundary between two frames it saw
            args = json.loads(call.split("<tool_call>")[1].split("</tool_call>")[0])["arguments"]
            a, b = ({**ends, **seen}.get(args[k]) for k in ("start", "end"))
            assert a is not None and b is not None and a != b, args
        if "<answer>" in r.answer:
            start, end = json.loads(r.answer.split("<answer>")[1].split("</answer>")[0])
            assert seen[start] and not seen[end]
            assert abs(start - r.meta["truth"][0]) <= BOUNDARY_TOLERANCE_S
            assert abs(end - r.meta["truth"][1]) <= BOUNDARY_TOLERANCE_S
        else:
            assert parse_turn(r.answer).action.name == "resample_frames"
    assert len(turns_seen) >= 3


def test_every_number_of_a_grounding_turn_is_in_the_last_look_or_the_turn_before(tiny_model_dir: Path) -> None:
    """The oracle's grounding thinks first name every frame just returned (its colour and label, in order), each
    held against the asked colour ("red at 22.50s vs cyan: no"), with each boundary written at the frames where
    the colour comes or goes, then carry both boundaries forward, so no number is copied from an observation
    several turns back: each boundary of the summary is written beside the frames that show it in this turn or
    is the same bracket as in the turn before; the answer repeats its think's last two times. No look returns
    the same frame twice."""
    from mmagent.eval.synth.drills import grounding_exchanges
    from mmagent.eval.synth.families import grounding_timeline

    from transformers import AutoTokenizer

    from mmagent.training.recipes.toy_world import RecipeSizes

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = np.random.default_rng(5)
    entry = re.compile(r"(\w+) at (\d+\.\d\d)s vs (\w+): (yes|no)((?: \((?:starts|ends) between [\d.]+s and [\d.]+s\))*)")
    mark = re.compile(r"\((starts|ends) between (\d+\.\d\d)s and (\d+\.\d\d)s\)")
    marked_in_look = 0
    for k in range(12):
        timeline = grounding_timeline(CFG, rng, ("easy", "medium", "hard")[k % 3])
        exchanges, last = grounding_exchanges(timeline, CFG, in_words=k % 2 == 1)
        assert len(exchanges) >= 3 and "<answer>" in last
        turns = [c for c, _ in exchanges] + [last]
        duration = float(re.search(r"is (\d+) s long", timeline.question).group(1))
        colour = timeline.question.split("screen ")[1].split("?")[0]
        seen = {0.0: False, duration: False}  # the video's ends: a boundary before the first frame seen or after the last
        previous: dict[str, tuple[float, float]] = {}
        for _, look in exchanges:  # a closer look never returns one frame twice (closer_frames)
            assert len(set(look.data["timestamps"])) == len(look.data["timestamps"])
        for t in range(1, len(turns)):
            scanned, known = turns[t].split("</think>")[0].split(". The ", 1)
            look = exchanges[t - 1][1]
            entries = entry.findall(scanned)
            assert ", ".join(m.group(0) for m in entry.finditer(scanned)) == scanned.removeprefix("<think>")
            # every frame just returned, named with its label, in order, held against the asked colour
            assert [e[1] for e in entries] == [f"{x:.2f}" for x in look.data["timestamps"]]
            assert all(e[2] == colour and (e[3] == "yes") == (e[0] == colour) for e in entries)
            seen.update({float(e[1]): e[3] == "yes" for e in entries})
            # each boundary written where it shows: a frame (or video end) without the colour, then one with it
            marks = {w: (float(a), float(b)) for w, a, b in mark.findall(scanned)}
            for word, (a, b) in marks.items():
                assert (seen[a], seen[b]) == ((False, True) if word == "starts" else (True, False)), (word, a, b)
                assert not any(a < x < b for x in seen), (a, b)  # neighbours: no frame seen between them
                assert f"{a:.2f}" in {e[1] for e in entries} or f"{b:.2f}" in {e[1] for e in entries}
            marked_in_look += len(marks)
            # the summary: each bracket is the one marked in this turn or the same as in the turn before
            summary = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in re.finditer(
                r"(starts|ends) between (\d+\.\d\d)s and (\d+\.\d\d)s", known)}
            for word in ("starts", "ends"):
                bracket = marks.get(word, previous.get(word))
                assert bracket is not None
                if word in summary:
                    assert summary[word] == bracket
                else:  # within the tolerance: one time, the first frame of the colour or the first after it
                    assert re.search(rf"(?:starts at|is gone at) {bracket[1]:.2f}s", known), (word, bracket, known)
                previous[word] = bracket
        # the recipe's policies may write each turn whole
        longest = max(len(tokenizer(t)["input_ids"]) for t in turns)
        assert longest <= RecipeSizes().max_new_tokens, longest
        answer = json.loads(last.split("<answer>")[1].split("</answer>")[0])
        assert [f"{x:.2f}" for x in answer] == re.findall(r"(\d+\.\d\d)s", last.split("</think>")[0].split(". The ")[1])
        assert abs(answer[0] - timeline.truth[0]) <= 0.3 and abs(answer[1] - timeline.truth[1]) <= 0.3
    assert marked_in_look >= 24  # both boundaries at least once per episode


def test_grounding_turns_are_the_oracle_episode_on_the_real_tool(tmp_path: Path) -> None:
    """The drill's turns are what the oracle writes on the same video through the real agent loop and
    ``resample_frames`` (the drill draws the frames, the episode decodes them from the written mp4)."""
    from mmagent.eval.benchmarks import synth
    from mmagent.eval.synth.drills import grounding_exchanges
    from mmagent.eval.synth.families import grounding_timeline, item_rng, make_item

    for index in range(3):  # easy, medium, hard
        task = make_item("grounding", index, 3, tmp_path)
        task.video = str(tmp_path / task.video)
        episode = synth.oracle_agent().run_batch([task], progress=False)[0]
        timeline = grounding_timeline(CFG, item_rng(3, "grounding", index), task.metadata["difficulty"])
        assert timeline.truth == task.answer and timeline.question == task.question
        exchanges, last = grounding_exchanges(timeline, CFG)
        assert [c for c, _ in exchanges] + [last] == [t.text for t in episode.turns if t.role == "assistant"]
        assert [o.data["timestamps"] for _, o in exchanges] == [t.observation.data["timestamps"]
                                                                for t in episode.turns if t.role == "tool"]


def test_grounding_text_rounds_are_the_grounding_turns_in_words() -> None:
    """Drawn from the same generator, a ``grounding_text`` round is the ``grounding_turn`` round: the same video,
    the same calls and the same turn to write, each look returned as words whose colours are what the pixel
    reader sees in the frames (so the text drill teaches exactly the turns the episodes need), and no images."""
    turns_seen = set()
    for seed in range(10):
        pixels = make_round("grounding_turn", np.random.default_rng([41, seed]))
        words = make_round("grounding_text", np.random.default_rng([41, seed]))
        assert (words.kind, pixels.kind) == ("grounding_text", "grounding_turn")
        assert (words.answer, words.text, words.call, words.meta) == (pixels.answer, pixels.text, pixels.call, pixels.meta)
        turns_seen.add(words.meta["turn"])
        looks = [*pixels.history, (pixels.call, pixels.observation)]
        written = [*words.history, (words.call, words.observation)]
        assert [c for c, _ in written] == [c for c, _ in looks]
        colour = re.search(r"screen (\w+)\?", words.text).group(1)
        assert f"{colour} at" in written[0][1].text  # the first look sees the asked colour (the world's rule)
        for (_, framed), (_, worded) in zip(looks, written):
            assert worded.images == [] and worded.data["timestamps"] == framed.data["timestamps"]
            named = re.findall(r"(\w+) at (\d+\.\d\d)s", worded.text)
            assert named == [(frame_colour(im), f"{t:.2f}") for t, im in zip(framed.data["timestamps"], framed.images)]
    assert len(turns_seen) >= 3


def test_choose_holds_the_value_against_each_option_until_it_matches() -> None:
    from mmagent.eval.synth.oracle import choose

    assert choose("It is blue.", ["red", "blue", "star", "cyan"], "blue") == (
        "<think>It is blue. blue vs A. red: no. blue vs B. blue: yes.</think>\n<answer>B</answer>")
    assert choose("Reads 7.", ["7", "1", "2", "3"], "7") == "<think>Reads 7. 7 vs A. 7: yes.</think>\n<answer>A</answer>"
    with pytest.raises(ValueError):
        choose("It is green.", ["red", "blue", "star", "cyan"], "green")


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmagent.tiny import build_tiny_qwen2_5_vl

    path = tmp_path_factory.mktemp("pretrain") / "random"
    build_tiny_qwen2_5_vl(path, seed=0, hidden_size=64, num_layers=2, vision_width=32)
    (path / "mmagent.json").write_text(json.dumps({"media_budget": CFG.media_budget().__dict__}))
    return path


def test_rounds_encode_as_episodes_with_loss_on_the_answers_only(vision_model: Path) -> None:
    from mmagent.training.common import load_policy
    from mmagent.training.pretrain import collate, encode_round, system_prompt

    policy = load_policy(str(vision_model))
    rng = np.random.default_rng(10)
    rounds = [make_round(k, rng) for k in ("flash", "where", "window", "tag")]
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    episodes = [encode_round(policy, r, system_prompt()) for r in rounds]
    for r, episode in zip(rounds, episodes):
        ids = episode.inputs["input_ids"][0]
        answer = policy.tokenizer.encode(r.answer, add_special_tokens=False) + [end]
        assert ids[episode.loss_mask.bool()].tolist() == answer  # the answer and its end of turn, nothing else
        assert ids[-len(answer):].tolist() == answer
    inputs, mask = collate(episodes, policy.tokenizer.pad_token_id)
    assert inputs["input_ids"].shape == mask.shape == (4, max(e.num_tokens for e in episodes))
    assert int(mask.sum()) == sum(e.policy_tokens for e in episodes)
    # 8 frames, the first look and the zoom: every image of every round reaches the model, in order
    grid = inputs["image_grid_thw"]
    assert grid.shape[0] == 8 + 1 + 1
    assert int((inputs["input_ids"] == policy.model.config.image_token_id).sum()) == int((grid.prod(-1) // 4).sum())
    with torch.no_grad():  # a padded batch gives each conversation the logits it has alone
        batched = policy.model(**inputs, use_cache=False).logits
        for row, e in enumerate(episodes):
            alone = policy.model(**e.inputs, use_cache=False).logits[0]
            assert torch.allclose(batched[row, :e.num_tokens], alone, atol=1e-4)


@pytest.mark.parametrize("kind, seed, images", [("video_answer", 5, CFG.probe_frames), ("grounding_text", 6, 0)])
def test_a_later_turn_round_shows_question_call_and_look_and_trains_on_the_answer_only(
        vision_model: Path, kind: str, seed: int, images: int) -> None:
    """A later turn's round renders as the episode: the question, the call as the assistant's turn, what the tool
    returned (frames, or for ``grounding_text`` the look in words and no images), then the answer, the only
    tokens with loss."""
    from mmagent.training.common import load_policy
    from mmagent.training.pretrain import encode_round, system_prompt

    policy = load_policy(str(vision_model))
    r = make_round(kind, np.random.default_rng(seed))
    e = encode_round(policy, r, system_prompt())
    ids = e.inputs["input_ids"][0]
    text = policy.tokenizer.decode(ids)
    asked, called = text.index(r.text), text.index(r.call)
    shown = text.index("<tool_response>", called)
    assert asked < called < shown < text.rindex(r.answer)  # the episode's order
    assert text[:called].rstrip().endswith("<|im_start|>assistant")  # the call is the assistant's turn
    end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[e.loss_mask.bool()].tolist() == policy.tokenizer.encode(r.answer, add_special_tokens=False) + [end]
    if images:
        assert int(e.inputs["image_grid_thw"].shape[0]) == images
    else:
        assert "pixel_values" not in e.inputs and shown < text.index(r.observation.text) < text.rindex(r.answer)


def test_length_groups_give_the_gradients_of_one_padded_batch(vision_model: Path) -> None:
    """A step's rounds run in groups of similar length (a long search round no longer pads short ones to
    its length): same loss, same gradients as the whole step as one padded batch."""
    from mmagent.training.common import load_policy
    from mmagent.training.losses import sft_loss
    from mmagent.training.pretrain import collate, drill_loss, encode_round, length_groups, system_prompt

    policy = load_policy(str(vision_model))
    model = policy.model
    rng = np.random.default_rng(11)
    rounds = [make_round(k, rng) for k in ("search", "window", "flash", "option", "window", "tag")]
    episodes = [encode_round(policy, r, system_prompt()) for r in rounds]
    lengths = sorted(e.num_tokens for e in episodes)
    groups = length_groups(episodes, max_tokens=3 * lengths[-2])
    assert [e.num_tokens for g in groups for e in g] == lengths  # every round once, shortest first
    assert all(len(g) * g[-1].num_tokens <= 3 * lengths[-2] or len(g) == 1 for g in groups)
    assert len(groups) > 1 and groups[-1] == [max(episodes, key=lambda e: e.num_tokens)]

    def grads() -> list[torch.Tensor]:
        out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
        return out

    inputs, mask = collate(episodes, policy.tokenizer.pad_token_id)
    whole = sft_loss(model(**inputs, use_cache=False).logits.float()[:, :-1], inputs["input_ids"][:, 1:], mask[:, 1:])
    whole.backward()
    expected = grads()
    value = drill_loss(model, episodes, policy.tokenizer.pad_token_id, max_tokens=3 * lengths[-2])
    got = grads()
    assert value == pytest.approx(float(whole.detach()), rel=1e-4)
    assert len(got) == len(expected) and all(torch.allclose(a, b, atol=1e-5, rtol=1e-3) for a, b in zip(got, expected))


def test_pretraining_teaches_a_copy_drill(vision_model: Path, tmp_path: Path) -> None:
    """The language phase alone, on one drill (copy the video's length into a call): the loss on fresh rounds
    falls by more than half, and the stage's bookkeeping (phases, saved model, drill accuracy) holds."""
    from mmagent.training.common import load_policy
    from mmagent.training.pretrain import (PretrainConfig, collate, drill_accuracy, encode_round, pretrain,
                                           system_prompt)
    from mmagent.training.losses import sft_loss

    torch.set_num_threads(1)
    held_out = [make_round("whole", np.random.default_rng([99, i])) for i in range(8)]

    def loss_of(model_dir: Path) -> float:
        policy = load_policy(str(model_dir))
        inputs, mask = collate([encode_round(policy, r, system_prompt()) for r in held_out],
                               policy.tokenizer.pad_token_id)
        with torch.no_grad():
            logits = policy.model(**inputs, use_cache=False).logits
        return float(sft_loss(logits[:, :-1], inputs["input_ids"][:, 1:], mask[:, 1:]))

    model = tmp_path / "start"
    shutil.copytree(vision_model, model)
    cfg = PretrainConfig(model=str(model), output_dir=str(tmp_path / "out"), steps=30, rounds_per_step=8, lr=3e-3,
                         language_share=0.8, vision_share=0.1, mix={"whole": 1.0, "flash": 0.5})
    result = pretrain(cfg, progress=False)
    assert set(result["loss"]) == {"language", "vision", "all"}
    before, after = loss_of(model), loss_of(tmp_path / "out")
    assert after < 0.5 * before, (before, after)
    acc = drill_accuracy(str(tmp_path / "out"), per_kind=2, kinds=("whole", "tag"))
    assert set(acc) == {"whole", "tag"} and all(0.0 <= v <= 1.0 for v in acc.values())
    with pytest.raises(ValueError, match="unknown drills"):
        pretrain(PretrainConfig(model=str(model), mix={"nope": 1.0}), progress=False)
