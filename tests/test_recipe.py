"""The toy-world recipe end to end at its --quick sizes: every stage runs, the table carries standard errors,
and a second run continues from the folder instead of training again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torch

from mmagent.training.recipes.toy_world import QUICK, RUNS, RecipeSizes, run_recipe


@pytest.mark.slow
def test_the_quick_recipe_runs_every_stage_and_resumes(tmp_path: Path, capsys) -> None:
    torch.set_num_threads(1)
    out = tmp_path / "toy"
    results = run_recipe(out, QUICK, progress=False)
    assert set(results["scores"]) == set(RUNS)
    for label, scores in results["scores"].items():
        assert {"video_qa", "grounding", "image_qa", "geolocation", "overall"} <= set(scores), label
        assert all("se" in row and row["se"] >= 0 for row in scores.values()), label
    vision = json.loads((out / "vision" / "vision.json").read_text())
    assert vision["steps"] == QUICK.vision_steps and vision["all_steps"] == QUICK.vision_steps + QUICK.vision_glyph_steps
    assert set(vision["accuracy"]) >= {"digit", "sign", "screen"}
    pretrained = json.loads((out / "base" / "pretrain.json").read_text())
    assert pretrained["steps"] == QUICK.pretrain_steps and set(pretrained["drill_accuracy"]) >= {"flash", "where"}
    assert "±" in (out / "results.md").read_text()
    timings = json.loads((out / "timings.json").read_text())
    capsys.readouterr()
    again = run_recipe(out, QUICK, progress=False)
    printed = capsys.readouterr().out
    for stage in ("data", "vision", "base", "sft", "sft_notools", "grpo", "dgrpo"):
        assert f"[{stage}] already done" in printed
    assert again["scores"] == results["scores"]
    assert {k: v for k, v in json.loads((out / "timings.json").read_text()).items() if k in timings} == timings


@pytest.mark.slow
def test_a_one_family_recipe_chains_its_drill_stages(tmp_path: Path) -> None:
    """The video_qa preset's shape at --quick sizes: one family in the worlds and the table, the vision stage on
    its own mix without the glyph phase, and each drill stage starting from the one before."""
    from mmagent.training.recipes.toy_world import VIDEO_QA, quick

    torch.set_num_threads(1)
    assert quick(RecipeSizes()) == QUICK  # --quick alone is the full recipe's shape
    out = tmp_path / "vqa"
    results = run_recipe(out, quick(VIDEO_QA), progress=False)
    assert all(set(scores) == {"video_qa", "overall"} for scores in results["scores"].values())
    assert {json.loads(line)["task"]["metadata"]["family"] for line in
            (out / "data" / "sft_tools.jsonl").read_text().splitlines()} == {"video_qa"}
    vision = json.loads((out / "vision" / "vision.json").read_text())
    assert vision["all_steps"] == QUICK.vision_steps  # no glyph phase before the main mix
    stages = [json.loads((out / name / "pretrain.json").read_text()) for name in ("base", "base-2", "base-3")]
    assert [s["steps"] for s in stages] == [QUICK.pretrain_steps, 2, 2]
    assert [s["config"]["model"] for s in stages] == [str(out / "vision"), str(out / "base"), str(out / "base-2")]
    assert [s["config"]["mix"] for s in stages] == [VIDEO_QA.pretrain_mix] + [m for _, m in VIDEO_QA.drill_phases]
    assert set(stages[-1]["drill_accuracy"]) == {"window", "flash", "option", "video_answer"}
    assert {"base", "base-2", "base-3"} <= set(results["timings_s"])


def test_install_refuses_a_one_family_preset(capsys) -> None:
    from mmagent.training.recipes.toy_world import main

    with pytest.raises(SystemExit):
        main(["unused-folder", "--preset", "video_qa", "--install"])
    assert "--install needs the full preset" in capsys.readouterr().err
