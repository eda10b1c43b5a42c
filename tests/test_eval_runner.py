"""The eval runner: predictions as items finish, resume after a crash or kill -9, refusals, reports."""

from __future__ import annotations

import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from deadlines import sigkill_when

from mmagent.eval.benchmarks import synth
from mmagent.eval.runner import PREDICTIONS_FILE, RunError, read_predictions, run_eval
from mmagent.agent import Agent, Budgets
from mmagent.cli import main
from mmagent.policy.base import Generation, Policy, Session
from mmagent.policy.render import MediaBudget
from mmagent.trajectory import Trajectory


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 toy-world items, three of each family."""
    root = tmp_path_factory.mktemp("toy-runner")
    synth.build(root, per_family=3, seed=1, progress=False)
    return root


@pytest.fixture(scope="module")
def tasks(toy: Path):
    return synth.load(toy)


class ScriptedPolicy(Policy):
    """Answers every episode at once with a fixed text per task (no model); records which tasks it ran."""

    def __init__(self, answers: dict[str, str] | None = None) -> None:
        self.answers = answers or {}
        self.media_budget = MediaBudget()
        self.ran: list[str] = []

    def start(self, view, seed=0, task=None):
        return Session(seed=seed, task=task)

    def generate(self, sessions, max_new_tokens):
        out = []
        for s in sessions:
            tid = s.task.id
            self.ran.append(tid)
            text = f"<think>about {tid} <b>bold</b></think><answer>{self.answers.get(tid, 'A')}</answer>"
            out.append(Generation(text=text, token_ids=[], logprobs=[], truncated=False, prefill_tokens=0))
        return out

    def observe(self, session, view):
        return 0


def _scripted(answers: dict[str, str] | None = None, max_turns: int = 6) -> Agent:
    return Agent(ScriptedPolicy(answers), tools=[], budgets=Budgets(max_turns=max_turns))


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / PREDICTIONS_FILE).read_text().splitlines()]


def test_oracle_run_leaves_predictions_trajectories_and_reports(tasks, tmp_path):
    four = [t for t in tasks if t.id.endswith("-00000")]
    out = tmp_path / "run"
    result = run_eval(synth, synth.oracle_agent(), four, out, batch_size=2, progress=False)

    recs = sorted(_lines(out), key=lambda r: [t.id for t in four].index(r["id"]))  # lines come in finish order
    assert [r["id"] for r in recs] == [t.id for t in four]
    for task, rec in zip(four, recs):
        assert rec["stop_reason"] == "answer" and rec["turns"] >= 2 and rec["tool_calls"] >= 1
        assert rec["seconds"] > 0 and rec["score"] == synth.score_answer(task, rec["answer"])
        traj = Trajectory.from_dict(json.loads((out / "trajectories" / rec["trajectory"]).read_text()),
                                    base_dir=out / "trajectories")  # loads every saved image back
        assert traj.answer == rec["answer"] and traj.rewards["task"] == rec["score"]["score"]
        assert sum(len(o.images) for o in traj.observations) > 0  # the oracle looked with tools
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"] == result.summary == synth.summarise(four, [r["score"] for r in recs])
    assert summary["n_done"] == summary["n_tasks"] == 4 and result.summary["overall"]["score"] > 0.9
    assert "| overall | 4 |" in (out / "summary.md").read_text()
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    class Imgs(HTMLParser):
        def __init__(self):
            super().__init__()
            self.srcs: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.srcs.append(dict(attrs)["src"])

    page = (out / "report.html").read_text()
    parser = Imgs()
    parser.feed(page)
    tool_images = [s for s in parser.srcs if s.startswith("trajectories/")]
    assert len(tool_images) == sum(len(o.images) for r in recs for o in Trajectory.from_dict(
        json.loads((out / "trajectories" / r["trajectory"]).read_text()), base_dir=out / "trajectories").observations)
    assert all((out / s).is_file() for s in tool_images) and "plot.png" in parser.srcs
    assert all(t.id in page for t in four) and "resample_frames" in page


def test_resume_runs_only_what_is_missing_and_never_duplicates(tasks, tmp_path):
    out = tmp_path / "run"
    first = _scripted()
    run_eval(synth, first, tasks[:5], out, batch_size=2, progress=False)
    assert len(_lines(out)) == 5
    second = _scripted()
    result = run_eval(synth, second, tasks, out, resume=True, batch_size=2, progress=False)
    assert second.policy.ran == [t.id for t in tasks[5:]]
    ids = [r["id"] for r in _lines(out)]
    assert sorted(ids) == sorted(t.id for t in tasks) and len(ids) == len(set(ids)) == len(tasks)
    assert result.resumed == 5 and len(result.predictions) == len(tasks)
    run = json.loads((out / "run.json").read_text())
    assert run["resumed"][0]["done"] == 5
    third = _scripted()  # nothing left to do
    run_eval(synth, third, tasks, out, resume=True, progress=False)
    assert third.policy.ran == [] and len(_lines(out)) == len(tasks)


def test_a_line_cut_short_by_a_kill_is_dropped_and_that_item_redone(tasks, tmp_path):
    out = tmp_path / "run"
    run_eval(synth, _scripted(), tasks, out, batch_size=4, progress=False)
    path = out / PREDICTIONS_FILE
    lines = path.read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])["id"]
    path.write_text("".join(lines[:-1]) + lines[-1][:30])  # killed in the middle of writing the last line
    agent = _scripted()
    run_eval(synth, agent, tasks, out, resume=True, progress=False)
    assert agent.policy.ran == [last]
    text = path.read_text()
    assert text.endswith("\n") and [json.loads(x)["id"] for x in text.splitlines()].count(last) == 1
    # a whole last record whose newline was lost is kept (and the newline restored)
    path.write_text(text.rstrip("\n"))
    agent = _scripted()
    run_eval(synth, agent, tasks, out, resume=True, progress=False)
    assert agent.policy.ran == [] and path.read_text() == text
    # damage anywhere else is not guessed at
    path.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(RunError, match=r"predictions.jsonl:2 is not a prediction record"):
        read_predictions(path)


def test_refuses_folders_it_should_not_write_into(tasks, toy, tmp_path):
    out = tmp_path / "run"
    run_eval(synth, _scripted(), tasks[:2], out, identity={"model": "a", "data_dir": str(toy)}, progress=False)
    with pytest.raises(RunError, match="pass --resume to continue it, or give a new --out"):
        run_eval(synth, _scripted(), tasks[:2], out, identity={"model": "a", "data_dir": str(toy)}, progress=False)
    with pytest.raises(RunError, match=r"model was \"a\", now \"b\""):
        run_eval(synth, _scripted(), tasks, out, resume=True, identity={"model": "b", "data_dir": str(toy)},
                 progress=False)
    with pytest.raises(RunError, match=r"agent\.budgets\.max_turns was 6, now 2"):
        run_eval(synth, _scripted(max_turns=2), tasks, out, resume=True,
                 identity={"model": "a", "data_dir": str(toy)}, progress=False)
    with pytest.raises(RunError, match=r"bench was \"synth\", now \"vstar\""):
        run_eval("vstar", _scripted(), tasks, out, resume=True, identity={"model": "a", "data_dir": str(toy)},
                 progress=False)
    with pytest.raises(RunError, match="made for other data"):
        run_eval(synth, _scripted(), tasks[5:], out, resume=True, identity={"model": "a", "data_dir": str(toy)},
                 progress=False)
    assert len(_lines(out)) == 2  # none of that touched the run
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not an mmagent eval folder"):
        run_eval(synth, _scripted(), tasks, tmp_path / "other", resume=True, progress=False)
    with pytest.raises(RunError, match="appears more than once"):
        run_eval(synth, _scripted(), [tasks[0], tasks[0]], tmp_path / "dup", progress=False)


def test_the_report_escapes_what_the_model_wrote(tasks, tmp_path):
    out = tmp_path / "run"
    evil = "<script>alert(1)</script>"
    run_eval(synth, _scripted({tasks[0].id: evil}), tasks[:2], out, progress=False)
    page = (out / "report.html").read_text()
    assert "<script" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert _lines(out)[0]["answer"] == evil  # kept verbatim in the data


def test_a_tiny_model_run_matches_synth_evaluate(tasks, tiny_model_dir, tmp_path):
    four = [t for t in tasks if t.id.endswith("-00000")]
    agent = synth.model_agent(str(tiny_model_dir), use_tools=False, max_new_tokens=8)
    agent.budgets = Budgets(max_turns=2, max_new_tokens=8)
    result = run_eval(synth, agent, four, tmp_path / "run", batch_size=3, progress=False)
    trajs, scores, summary = synth.evaluate(agent, four, progress=False)
    assert result.summary == summary
    assert [r["answer"] for r in result.predictions] == [t.answer for t in trajs]
    saved = json.loads((tmp_path / "run" / "trajectories" / result.predictions[0]["trajectory"]).read_text())
    assert saved["token_ids"] == trajs[0].token_ids and saved["stop_reason"] == trajs[0].stop_reason


def test_kill_9_then_resume_loses_nothing_and_matches_an_uninterrupted_run(toy, tasks, tiny_model_dir, tmp_path):
    args = ["eval", "--bench", "synth", "--data-dir", str(toy), "--model", str(tiny_model_dir), "--batch-size", "2",
            "--max-turns", "2", "--max-new-tokens", "8", "--no-tools", "--quiet"]
    killed = tmp_path / "killed"
    preds = killed / PREDICTIONS_FILE
    with open(tmp_path / "log.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmagent", *args, "--out", str(killed)], stdout=log,
                                stderr=subprocess.STDOUT)
        sigkill_when(proc, lambda: preds.is_file() and preds.read_bytes().count(b"\n") >= 2, "2 items",
                     tmp_path / "log.txt")
    assert not (killed / "summary.json").exists() and len(read_predictions(preds)) < len(tasks)

    assert main([*args, "--out", str(killed), "--resume"]) == 0
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0

    ids = [r["id"] for r in _lines(killed)]
    assert sorted(ids) == sorted(t.id for t in tasks) and len(set(ids)) == len(ids) == 12
    resumed, whole = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("killed", "whole"))
    assert resumed["summary"] == whole["summary"] and resumed["n_done"] == 12
    answers = {r["id"]: (r["answer"], r["stop_reason"], r["score"]) for r in _lines(killed)}
    assert answers == {r["id"]: (r["answer"], r["stop_reason"], r["score"]) for r in _lines(tmp_path / "whole")}


def test_the_registry_names_the_known_benchmarks():
    from mmagent.eval.registry import UnknownBenchmark, get, names

    assert names() == ["synth", "videomme", "charades_sta", "geo", "vstar"]
    for name in names():
        module = get(name).module
        assert module.NAME == name and callable(module.score) and callable(module.summarise)
    with pytest.raises(UnknownBenchmark, match="unknown benchmark 'mmmu'; known: synth, videomme, charades_sta"):
        get("mmmu")
    with pytest.raises(ValueError, match="takes no option subtitles"):
        get("vstar").load("unused", subtitles=True)


def test_the_reference_and_skipped_annotation_rows_reach_run_and_summary(tmp_path: Path) -> None:
    """A malformed Charades-STA line is skipped by the loader, then counted in summary.json / summary.md and
    listed in run.json, beside the reference scorer the numbers reproduce."""
    from mmagent.eval.benchmarks import charades_sta
    from mmagent.tiny import write_synthetic_video

    data = tmp_path / "charades"
    (data / "Charades_v1_480").mkdir(parents=True)
    write_synthetic_video(data / "Charades_v1_480" / "AAAAA.mp4", seconds=2.0, fps=4, size=(32, 32))
    (data / "charades_sta_test.txt").write_text("AAAAA 0.5 1.5##person opens a door.\n"
                                                "AAAAA 1.5 0.5##backwards\n")
    tasks = charades_sta.load(data)
    assert len(tasks) == 1 and len(tasks.skipped) == 1
    result = run_eval(charades_sta, _scripted({tasks[0].id: "0.5 - 1.5"}), tasks, tmp_path / "run", progress=False)
    assert result.summary["overall"]["miou"] == 1.0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    where = f"{data / 'charades_sta_test.txt'}:2"
    assert run["skipped_rows"] == summary["skipped_rows"]["rows"] and summary["skipped_rows"]["n"] == 1
    assert summary["skipped_rows"]["rows"][0].startswith(where + ": the segment [1.5, 0.5]")
    assert run["reference"] == summary["reference"] == charades_sta.REFERENCE
    assert summary["reference"]["repo"] == "EvolvingLMMs-Lab/lmms-eval" and len(summary["reference"]["commit"]) == 40
    md = (tmp_path / "run" / "summary.md").read_text()
    assert "1 malformed annotation rows were skipped" in md and where in md and "lmms_eval/tasks/charades_sta" in md
