"""The toy-world recipe end to end at its --quick sizes: every stage runs, the table carries standard errors,
and a second run continues from the folder instead of training again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import torch

from mmagent.training.recipes.toy_world import QUICK, RUNS, run_recipe


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
