"""The shipped built-in model: it loads, is labelled, reproduces the answers it recorded, and `mmagent run`
uses it when no --model is given (or says how to rebuild it when it is gone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmagent.eval.benchmarks import synth
from mmagent import cli, default_model
from mmagent.default_model import DEFAULT_MODEL_DIR, default_model_info
from mmagent.training.recipes.toy_world import reference_answers


def test_the_builtin_model_is_shipped_and_labelled() -> None:
    info = default_model_info()
    assert "toy world ONLY" in info["label"]
    assert info["recipe"].startswith("python -m mmagent.training.recipes.toy_world")
    assert set(info["test_scores"]) == {*synth.FAMILIES, "overall"}
    assert all(s["n"] == 50 and "se" in s for f, s in info["test_scores"].items() if f != "overall")
    assert info["training_s"] > 0
    assert len(info["reference"]["answers"]) == len(synth.FAMILIES) * info["reference"]["per_family"]


@pytest.mark.xfail(strict=True, reason="issue 19's target: the recipe trains in <= 30 min on 2 CPU cores; the "
                                       "shipped run trained for 53.5 min (README). Drop this mark when it is met.")
def test_the_builtin_model_was_trained_within_the_time_target() -> None:
    assert default_model_info()["training_s"] < 30 * 60


def test_the_builtin_model_reproduces_its_recorded_answers(tmp_path: Path) -> None:
    reference = default_model_info()["reference"]
    synth.build(tmp_path, per_family=reference["per_family"], seed=reference["test_world_seed"], progress=False)
    again = reference_answers(DEFAULT_MODEL_DIR, tmp_path, per_family=reference["per_family"])
    assert set(again["answers"]) == set(reference["answers"])
    same = [i for i, a in reference["answers"].items() if again["answers"][i] == a]
    # greedy decoding on CPU: equal up to float noise flipping a near-tie (at most one item)
    assert len(same) >= len(reference["answers"]) - 1, (again["answers"], reference["answers"])
    assert abs(sum(again["scores"].values()) - sum(reference["scores"].values())) <= 1.0


def test_run_uses_the_builtin_model_without_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    task = synth.build(tmp_path, per_family=1, seed=1, families=["video_qa"], progress=False)[0]
    options = [arg for o in task.options for arg in ("--option", o)]
    assert cli.main(["run", "--video", task.video, *options, "--json", task.question]) == 0
    out = json.loads(capsys.readouterr().out)
    # the trained policy looks again at the video before it answers with a letter
    assert out["turns"][0]["tool_call"]["name"] == "resample_frames"
    assert out["stop_reason"] == "answer" and out["answer"] in "ABCD"


def test_run_without_the_builtin_model_says_how_to_get_it(video_path: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_DIR", tmp_path / "gone")
    assert cli.main(["run", "--video", str(video_path), "What colour is the screen?"]) == 2
    err = capsys.readouterr().err
    assert "built-in model is missing" in err and "mmagent.training.recipes.toy_world" in err
