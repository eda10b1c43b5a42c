"""The toy-world recipe end to end at its --quick sizes: every stage runs, the table carries standard errors,
and a second run continues from the folder instead of training again."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import torch

from mmagent.training.recipes.toy_world import RUNS, RecipeSizes, quick, run_recipe


@pytest.mark.slow
def test_the_quick_recipe_runs_every_stage_and_resumes(tmp_path: Path, capsys) -> None:
    torch.set_num_threads(1)
    sizes = quick(RecipeSizes())
    out = tmp_path / "toy"
    results = run_recipe(out, sizes, progress=False)
    assert set(results["scores"]) == set(RUNS)
    for label, scores in results["scores"].items():
        assert {"video_qa", "grounding", "image_qa", "geolocation", "overall"} <= set(scores), label
        assert all("se" in row and row["se"] >= 0 for row in scores.values()), label
    vision = json.loads((out / "vision" / "vision.json").read_text())
    assert vision["steps"] == vision["all_steps"] == sizes.vision_steps  # no glyph phase before the main mix
    assert set(vision["accuracy"]) >= {"shape", "colour", "screen"}
    stages = [json.loads((out / name / "pretrain.json").read_text()) for name in ("base", "base-2", "base-3")]
    assert [s["steps"] for s in stages] == [sizes.pretrain_steps, 2, 2]
    assert [s["config"]["model"] for s in stages] == [str(out / "vision"), str(out / "base"), str(out / "base-2")]
    assert [s["config"]["mix"] for s in stages] == [sizes.pretrain_mix] + [m for _, m in sizes.drill_phases]
    assert set(stages[-1]["drill_accuracy"]) == {"window", "flash", "option", "video_answer"}
    assert "±" in (out / "results.md").read_text()
    timings = json.loads((out / "timings.json").read_text())
    capsys.readouterr()
    again = run_recipe(out, sizes, progress=False)
    printed = capsys.readouterr().out
    for stage in ("data", "vision", "base", "base-2", "base-3", "sft", "sft_notools", "grpo", "dgrpo"):
        assert f"[{stage}] already done" in printed
    assert again["scores"] == results["scores"]
    assert {k: v for k, v in json.loads((out / "timings.json").read_text()).items() if k in timings} == timings


@pytest.mark.slow
def test_the_video_qa_preset_is_the_full_recipe_on_one_family(tmp_path: Path) -> None:
    """``--preset video_qa`` at --quick sizes: the full recipe's stages with one family in the worlds, the SFT
    data and the table."""
    from mmagent.training.recipes.toy_world import VIDEO_QA

    torch.set_num_threads(1)
    assert replace(quick(VIDEO_QA), families=RecipeSizes().families) == quick(RecipeSizes())
    out = tmp_path / "vqa"
    results = run_recipe(out, quick(VIDEO_QA), progress=False)
    assert all(set(scores) == {"video_qa", "overall"} for scores in results["scores"].values())
    assert {json.loads(line)["task"]["metadata"]["family"] for line in
            (out / "data" / "sft_tools.jsonl").read_text().splitlines()} == {"video_qa"}
    assert {"base", "base-2", "base-3"} <= set(results["timings_s"])


def test_install_refuses_a_one_family_preset(capsys) -> None:
    from mmagent.training.recipes.toy_world import main

    with pytest.raises(SystemExit):
        main(["unused-folder", "--preset", "video_qa", "--install"])
    assert "--install needs the full preset" in capsys.readouterr().err
