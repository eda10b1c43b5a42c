"""The toy world: seeded, tools provably needed, oracles at ~100% with tools and at chance without."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent.eval.benchmarks import synth
from mmagent.eval.synth import render
from mmagent.eval.synth.families import SynthConfig, make_item, option_values
from mmagent.eval.synth.oracle import SYNTH_TOOLS, _grounding_brackets
from mmagent.eval.synth.perception import classify_shape, find_shape, read_label_by_synthesis
from mmagent.eval.synth.scoring import CHANCE, score_answer
from mmagent.media import open_video
from mmagent.policy.render import fit_image
from mmagent.trajectory import load_jsonl
from mmagent.training.synth_data import sft_scripts, write_sft_data

CFG = SynthConfig()


def chance_bound(n: int, p: float = CHANCE["image_qa"]) -> float:
    """Chance plus three standard deviations of guessing over ``n`` items."""
    return p + 3 * (p * (1 - p) / n) ** 0.5


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("synth")
    return root, synth.build(root, per_family=9, seed=0, progress=False)


@pytest.fixture(scope="module")
def image_items(tmp_path_factory: pytest.TempPathFactory) -> list:
    """Enough image items for a statistical chance test."""
    return synth.build(tmp_path_factory.mktemp("synth-img"), per_family=90, seed=1,
                       families=["image_qa", "geolocation"], progress=False)


# ----- generation -----------------------------------------------------------------------------------
def test_same_seed_same_items_and_more_items_keep_the_first(tmp_path: Path) -> None:
    a = synth.build(tmp_path / "a", per_family=2, seed=3, progress=False)
    b = synth.build(tmp_path / "b", per_family=3, seed=3, progress=False)
    c = synth.build(tmp_path / "c", per_family=2, seed=4, progress=False)
    first_b = [t for t in b if t.metadata["index"] < 2]
    strip = lambda t: {**t.__dict__, "video": Path(t.video).name if t.video else None,  # noqa: E731
                       "image": Path(t.image).name if t.image else None}
    assert [strip(t) for t in a] == [strip(t) for t in first_b]
    for ta, tb in zip(a, first_b):
        for key in ("video", "image"):
            if getattr(ta, key):
                assert Path(getattr(ta, key)).read_bytes() == Path(getattr(tb, key)).read_bytes()
    assert [t.question for t in a] != [t.question for t in c]


def test_levels_set_the_difficulty(small: tuple[Path, list]) -> None:
    _, tasks = small
    for family in synth.FAMILIES:
        items = [t for t in tasks if t.task_type == family]
        assert [t.metadata["difficulty"] for t in items[:3]] == ["easy", "medium", "hard"]
    durations = {t.metadata["difficulty"]: t.metadata["duration"] for t in tasks if t.task_type == "video_qa"}
    assert durations == {"easy": 60.0, "medium": 120.0, "hard": 180.0}
    tags = {t.metadata["difficulty"]: len(t.metadata["distractors"]) for t in tasks if t.task_type == "image_qa"}
    assert tags == {"easy": 0, "medium": 2, "hard": 4}
    lengths = {t.metadata["difficulty"]: t.answer[1] - t.answer[0] for t in tasks if t.task_type == "grounding"}
    assert lengths["easy"] >= 12 and lengths["hard"] <= 9
    letters = [t.answer for t in tasks if t.options]
    assert set(letters) <= set("ABCD") and all(len(t.options) == 4 for t in tasks if t.options)


def test_the_first_look_never_shows_the_asked_event(small: tuple[Path, list]) -> None:
    _, tasks = small
    for task in (t for t in tasks if t.task_type == "video_qa"):
        reader = open_video(task.video)
        w0, w1 = task.metadata["window"]
        for frame in reader.sample_uniform(CFG.initial_frames):
            if w0 <= frame.timestamp <= w1:
                assert find_shape(frame.image) is None, task.id
        event = task.metadata["event"]
        shown = reader.frames_at([(event["start"] + event["end"]) / 2])[0].image
        mask = find_shape(shown)
        assert mask is not None and classify_shape(mask, list(render.SHAPES)) == event["shape"]
        assert event["colour"] in option_values(task) or event["shape"] in option_values(task)
        reader.close()


def test_the_grounding_segment_covers_a_first_look_frame(small: tuple[Path, list]) -> None:
    _, tasks = small
    for task in (t for t in tasks if t.task_type == "grounding"):
        s, e = task.answer
        assert any(s <= t < e for t in CFG.initial_times(task.metadata["duration"]))


def test_labels_look_the_same_in_the_view_whatever_they_say() -> None:
    """The fine print averages away: the 168x168 view of a tag is within one grey level whatever it says,
    while the zoomed source differs by the full ink contrast."""
    views, crops = [], []
    for text in "18WM":
        canvas = render.scene((CFG.image_size, CFG.image_size), np.random.default_rng(0))
        render.draw_label(canvas, text, (600, 601, *render.label_size(1)), render.LABEL_PALETTE["red"],
                          np.random.default_rng(1))
        views.append(np.asarray(fit_image(Image.fromarray(canvas), 3136, CFG.image_view_pixels), int))
        crops.append(canvas[601:631, 600:626].astype(int))
    for v in views[1:]:
        assert np.abs(v - views[0]).max() <= 1
    for c in crops[1:]:
        assert np.abs(c - crops[0]).max() >= 2 * render.INK_CONTRAST - 6 * render.GRAIN


def test_grounding_brackets_from_frames() -> None:
    # 4 fps: frames 40-59 are the segment [10 s, 15 s); seen: frame 36 off, 44 on, 52 on, 64 off.
    samples = [(9.0, False), (11.0, True), (13.0, True), (16.0, False)]
    assert _grounding_brackets(samples, 4, 60.0) == ((9.25, 11.0), (13.25, 16.0))
    assert _grounding_brackets([(5.0, False)], 4, 60.0) is None
    assert _grounding_brackets([(0.0, True)], 4, 60.0) == ((0.0, 0.0), (0.25, 60.0))


# ----- oracles --------------------------------------------------------------------------------------
def test_the_tool_oracle_scores_about_100_percent(small: tuple[Path, list]) -> None:
    _, tasks = small
    trajs, scores, summary = synth.evaluate(synth.oracle_agent(), tasks, progress=False)
    assert summary["video_qa"]["score"] == 1.0
    assert summary["image_qa"]["score"] == 1.0
    assert summary["geolocation"]["score"] == 1.0 and summary["geolocation"]["median_km"] < 2
    assert summary["grounding"]["miou"] >= 0.9 and summary["grounding"]["r@0.7"] == 1.0
    for traj in trajs:
        assert traj.stop_reason == "answer" and traj.tool_calls
        assert all(t.error is None for t in traj.turns), traj.task.id
    geo = next(t for t in trajs if t.task.task_type == "geolocation")
    assert [c.name for c in geo.tool_calls] == ["zoom", "web_search"]


def test_without_tools_the_oracle_stays_at_chance(small: tuple[Path, list], image_items: list) -> None:
    _, tasks = small
    _, _, with_tools = synth.evaluate(synth.oracle_agent(), tasks, progress=False)
    trajs, _, without = synth.evaluate(synth.oracle_agent(use_tools=False), tasks, progress=False)
    assert all(not t.tool_calls for t in trajs)
    assert without["video_qa"]["score"] <= chance_bound(without["video_qa"]["n"])
    # Grounding: the first look brackets the segment, tools sharpen it.
    assert without["grounding"]["miou"] <= with_tools["grounding"]["miou"] - 0.2
    _, _, images = synth.evaluate(synth.oracle_agent(use_tools=False), image_items, progress=False)
    _, _, images_tools = synth.evaluate(synth.oracle_agent(), image_items, progress=False)
    for family in ("image_qa", "geolocation"):
        assert images[family]["n"] == 90
        # Even told the answer is one of four texts, it cannot tell which from the view.
        assert images[family]["score"] <= chance_bound(90), images[family]
        assert images_tools[family]["score"] == 1.0


def test_even_an_ideal_observer_barely_reads_the_view(image_items: list) -> None:
    """Knowing the whole scene but the text, and the exact shrink, leaves it near chance (1/4)."""
    b = CFG.media_budget()
    hits = []
    for task in (t for t in image_items if t.task_type == "image_qa"):
        src = np.asarray(Image.open(task.image).convert("RGB"))
        view = fit_image(Image.fromarray(src), b.image_min_pixels, b.image_max_pixels)
        label = task.metadata["label"]
        got, _ = read_label_by_synthesis(view, src, tuple(label["box"]), label["candidates"],
                                         tuple(label["background"]))
        hits.append(got == label["text"])
    assert np.mean(hits) <= 0.45


# ----- scoring, loading, data -------------------------------------------------------------------------
def test_scores_on_hand_made_answers(tmp_path: Path) -> None:
    mcq = make_item("image_qa", 0, 0, tmp_path)
    wrong = next(L for L in "ABCD" if L != mcq.answer)
    assert score_answer(mcq, f"<answer>{mcq.answer}</answer>")["score"] == 1.0
    assert score_answer(mcq, f"<answer>{wrong}</answer>")["score"] == 0.0
    assert score_answer(mcq, None)["score"] == 0.0
    g = make_item("grounding", 0, 0, tmp_path)
    s, e = g.answer
    assert score_answer(g, f"<answer>[{s}, {e}]</answer>")["score"] == pytest.approx(1.0)
    half = score_answer(g, f"<answer>[{s}, {(s + e) / 2}]</answer>")["score"]
    assert half == pytest.approx(0.5)
    geo = make_item("geolocation", 0, 0, tmp_path)
    lat, lon = geo.answer["lat"], geo.answer["lon"]
    near = score_answer(geo, f"<answer>{lat:.2f}, {lon:.2f}</answer>")
    assert near["score"] == 1.0 and near["country"] and near["km"] < 1
    far = score_answer(geo, f"<answer>{-lat:.2f}, {lon - 180 if lon > 0 else lon + 180:.2f}</answer>")
    assert far["score"] == 0.0 and far["km"] > 10000


def test_load_checks_the_folder(small: tuple[Path, list], tmp_path: Path) -> None:
    root, tasks = small
    again = synth.load(root)
    assert [t.id for t in again] == [t.id for t in tasks]
    assert len(synth.load(root, families=["grounding"], limit=2)) == 2
    with pytest.raises(synth.DatasetError, match="no toy-world folder"):
        synth.load(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    with pytest.raises(synth.DatasetError, match="tasks.jsonl is missing"):
        synth.load(broken)
    (broken / "tasks.jsonl").write_text('{"question": "q", "nope": 1}\n')
    with pytest.raises(synth.DatasetError, match=r"tasks.jsonl:1: not a task"):
        synth.load(broken)
    one = synth.build(tmp_path / "one", per_family=1, families=["image_qa"], progress=False)
    Path(one[0].image).unlink()
    with pytest.raises(synth.DatasetError, match="image_qa-0-00000: image .* is missing"):
        synth.load(tmp_path / "one")
    assert synth.load_config(root) == CFG


def test_sft_data_round_trips(small: tuple[Path, list], tmp_path: Path) -> None:
    _, tasks = small
    report = write_sft_data(tasks[:: 3], tmp_path / "sft.jsonl", progress=False)
    assert report["kept"] == report["total"] == len(tasks[::3])
    trajs = list(load_jsonl(tmp_path / "sft.jsonl"))
    assert [t.task.id for t in trajs] == [t.id for t in tasks[::3]]
    for traj in trajs:
        assert traj.rewards["task"] >= 0.5 and traj.tool_calls
        assert any(o.images for o in traj.observations) or traj.task.task_type == "geolocation"
        assert traj.turns[-1].text.endswith("</answer>") and "<think>" in traj.turns[0].text
    scripts = sft_scripts(trajs)
    assert set(scripts) == {t.task.id for t in trajs}
    assert all(len(v) == len(trajs[k].tool_calls) + 1 for k, v in enumerate(scripts.values()))


def test_oracle_episodes_replay_through_the_real_policy(small: tuple[Path, list], tiny_model_dir: Path) -> None:
    """The SFT episodes encode through the real processor and model with the toy world's pixel budget,
    and the real tools give back the same observations."""
    from mmagent.agent import Agent, Budgets
    from mmagent.policy.hf import HFPolicy
    from mmagent.policy.replay import ReplayChooser

    _, tasks = small
    picked = [next(t for t in tasks if t.task_type == f) for f in synth.FAMILIES]
    oracle_trajs, _, _ = synth.evaluate(synth.oracle_agent(), picked, progress=False)
    policy = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu", media_budget=CFG.media_budget(),
                                      chooser=ReplayChooser(sft_scripts(oracle_trajs)))
    agent = Agent(policy, tools=list(SYNTH_TOOLS), budgets=Budgets(max_turns=synth.MAX_TURNS))
    replayed = agent.run_batch(picked, progress=False)
    for ref, got in zip(oracle_trajs, replayed):
        assert got.answer == ref.answer and got.stop_reason == "answer"
        assert [t.text for t in got.turns if t.role == "tool"] == [t.text for t in ref.turns if t.role == "tool"]
        assert sum(got.loss_mask) > 0 and len(got.token_ids) > got.prompt_length
    video = next(t for t in replayed if t.task.task_type == "video_qa")
    image = next(t for t in replayed if t.task.task_type == "image_qa")
    # 8 frames at 112x112: 4 temporal patches of 4x4 tokens; then 8 tool frames of 4x4 tokens each.
    assert video.visual_tokens == 64 + 8 * 16
    # The 168x168 view is 6x6 tokens; the zoom comes back within 224x224.
    assert 36 < image.visual_tokens <= 36 + 64


def test_cli_builds_a_toy_world(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mmagent.cli import main

    assert main(["synth", str(tmp_path / "w"), "--per-family", "1", "--families", "image_qa,grounding"]) == 0
    out = capsys.readouterr().out
    assert "| image_qa | 1 | 1.000 ± 0.000 |" in out
    scores = json.loads((tmp_path / "w" / "oracle_scores.json").read_text())
    assert set(scores) == {"oracle", "no-tool oracle"}
    assert len(list(load_jsonl(tmp_path / "w" / "sft" / "oracle.jsonl"))) == 2
    assert main(["synth", str(tmp_path / "x"), "--families", "nope"]) == 2
    assert "unknown toy-world families" in capsys.readouterr().err


def test_summaries_carry_standard_errors(tmp_path: Path) -> None:
    from mmagent.eval.synth.scoring import standard_error, summarise

    assert standard_error([1.0]) == 0.0
    assert standard_error([0.0, 1.0, 0.0, 1.0]) == pytest.approx((1 / 3) ** 0.5 / 2)
    tasks = [make_item("image_qa", i, 5, tmp_path) for i in range(2)]
    tasks += [make_item("video_qa", 0, 5, tmp_path)]
    rows = summarise(tasks, [{"score": 1.0}, {"score": 0.0}, {"score": 1.0}])
    assert rows["image_qa"]["se"] == pytest.approx(0.5) and rows["video_qa"]["se"] == 0.0
    assert rows["overall"]["se"] == pytest.approx(0.5 / 2)
