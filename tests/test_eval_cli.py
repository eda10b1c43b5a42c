"""`mmagent eval --bench synth` as a user runs it, and what it says for a missing folder or an unknown benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmagent.eval.benchmarks import synth


def _mmagent(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mmagent", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("toy-eval")
    synth.build(root, per_family=1, seed=1, progress=False)
    return root


def test_eval_synth_prints_the_table_and_writes_the_scores(toy: Path, family_model_dir: Path, tmp_path: Path) -> None:
    """For each model family: a whole eval run from the command line."""
    out = _mmagent("eval", "--bench", "synth", "--data-dir", str(toy), "--model", str(family_model_dir), "--device",
                   "cpu", "--quiet", "--out", str(tmp_path / "scores.json"))
    assert out.returncode == 0, out.stderr
    assert "| video_qa | 1 |" in out.stdout and "| overall | 4 |" in out.stdout
    saved = json.loads((tmp_path / "scores.json").read_text())
    assert saved["bench"] == "synth" and set(saved["scores"]) == {*synth.FAMILIES, "overall"}
    # a random model answers nothing right
    assert saved["scores"]["overall"]["score"] == 0.0


def test_eval_reports_a_missing_folder_and_unknown_benchmarks(tmp_path: Path) -> None:
    out = _mmagent("eval", "--bench", "synth", "--data-dir", str(tmp_path / "nope"), "--model", "m")
    assert out.returncode == 2 and "mmagent synth" in out.stderr
    out = _mmagent("eval", "--bench", "mmmu", "--data-dir", str(tmp_path))
    assert out.returncode == 2 and "invalid choice: 'mmmu'" in out.stderr
