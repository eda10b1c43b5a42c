"""`mmagent eval`'s default run folder tells incomparable runs apart, every refusal comes before a model loads,
and the HTML report counts turns and times right and keeps wide tables inside their box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmagent import cli
from mmagent.eval.benchmarks import synth
from mmagent.eval.report import write_report
from mmagent.eval.runner import RUN_FILE, default_run_dir
from mmagent.trajectory import Task


def test_the_default_folder_names_what_makes_runs_incomparable():
    tools = ("resample_frames", "zoom")
    assert default_run_dir("videomme", "Qwen/Qwen2.5-VL-7B-Instruct", "hf", tools, tools) == \
        Path("runs/eval/videomme-Qwen2.5-VL-7B-Instruct")
    names = {default_run_dir("videomme", "m", backend, t, tools, frames).name
             for backend in ("hf", "vllm", "openai") for t in (tools, [], ["zoom"]) for frames in (None, 32)}
    assert len(names) == 18  # every combination its own folder
    assert default_run_dir("synth", "runs/rl/final", "vllm", [], tools, 64).name == "synth-rl-vllm-notools-f64"
    assert default_run_dir("synth", "m", "hf", ["zoom"], tools).name == "synth-m-tools_zoom"


class Loaded(Exception):
    """Raised instead of loading a model: the command got past every check."""


@pytest.fixture()
def toy(tmp_path_factory, monkeypatch, tmp_path):
    root = tmp_path_factory.mktemp("toy")
    synth.build(root, per_family=1, seed=1, families=["image_qa"], progress=False)
    monkeypatch.chdir(tmp_path)

    def no_load(args, media_budget):
        raise Loaded(args.backend)

    monkeypatch.setattr(cli, "_eval_policy", no_load)
    return root


def _eval(toy: Path, *extra: str) -> int:
    return cli.main(["eval", "--bench", "synth", "--data-dir", str(toy), "--model", "some/model", "--quiet", *extra])


def test_a_no_tools_run_after_a_tools_run_gets_its_own_folder(toy, capsys):
    folder = Path("runs/eval/synth-model")
    folder.mkdir(parents=True)
    (folder / RUN_FILE).write_text(json.dumps({"identity": {"model": "some/model"}}))
    assert _eval(toy) == 2 and "already holds a run" in capsys.readouterr().err  # before loading
    with pytest.raises(Loaded):
        _eval(toy, "--no-tools")  # runs/eval/synth-model-notools: free, so it goes on to load the model


def test_every_refusal_comes_before_the_model_loads(toy, capsys):
    folder = Path("runs/eval/synth-model-notools")
    folder.mkdir(parents=True)
    identity = {"bench": "synth", "model": "some/model", "backend": "hf", "data_dir": str(toy.resolve()),
                "options": {}, "seed": 0, "agent": {"tools": ["zoom"]}}
    (folder / RUN_FILE).write_text(json.dumps({"identity": identity}))
    assert _eval(toy, "--no-tools", "--resume") == 2
    err = capsys.readouterr().err
    assert "cannot be resumed" in err and "agent.tools was [\"zoom\"], now []" in err
    assert _eval(toy, "--tools", "zoom,teleport") == 2 and "unknown tool 'teleport'" in capsys.readouterr().err
    assert _eval(toy, "--tools", "zoom", "--no-tools") == 2 and "contradict" in capsys.readouterr().err
    assert _eval(toy, "--max-turns", "-1") == 2 and "max_turns" in capsys.readouterr().err


def test_the_report_counts_turns_and_times_right_and_wide_tables_scroll(tmp_path):
    task = Task("Which colour?", id="q1", options=["A. red", "B. blue"], answer="A")
    turns = [{"role": "assistant", "text": "<tool_call>{}</tool_call>", "num_tokens": 5, "seconds": 0.5,
              "tool_call": {"name": "zoom", "arguments": {}}},
             {"role": "tool", "text": "crop", "seconds": -0.0001, "tool_call": {"name": "zoom"},
              "observation": {"images": [], "is_error": False}},
             {"role": "assistant", "text": "bad", "num_tokens": 2, "seconds": 0.2, "error": "no_action"},
             {"role": "tool", "text": "no action", "seconds": 0.0, "observation": {"images": [], "is_error": True}},
             {"role": "assistant", "text": "<answer>A</answer>", "num_tokens": 3, "seconds": 0.1}]
    (tmp_path / "traj").mkdir()
    (tmp_path / "traj" / "q1.json").write_text(json.dumps({"turns": turns}))
    rec = {"id": "q1", "answer": "A", "score": {"score": 1.0}, "stop_reason": "answer", "seconds": 0.9,
           "turns": 3, "tool_calls": 1, "safe_id": "q1", "trajectory": "q1.json"}
    summary = {"overall": {"n": 1, **{f"metric_{k}": 0.5 for k in range(30)}}}
    page = write_report(tmp_path / "report.html", "t", summary, [task], {"q1": rec}, tmp_path / "traj").read_text()
    assert "3 policy turns · 1 tool call" in page
    assert page.count("class='turn assistant'") == 3 and "turn 3 · policy" in page and "turn 4" not in page
    assert "turn 1 · tool zoom · 0.00 s" in page and "turn 2 · the agent's reply" in page and "-0.00" not in page
    assert "<div class='wide'><table class='summary'>" in page and ".wide{overflow-x:auto" in page
