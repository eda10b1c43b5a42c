"""Run an agent over a benchmark into a folder that survives crashes: predictions, trajectories, reports.

``run_eval(bench, agent, tasks, out_dir)`` runs the tasks with ``batch_size`` episodes in flight and leaves::

    run.json            what the run is (benchmark, model, data, agent settings): resuming checks it; also the
                        public scorer the benchmark's numbers reproduce (``reference``) and the malformed
                        annotation rows its loader skipped (``skipped_rows``)
    predictions.jsonl   one line per finished item, in the order they finish: id, answer, score dict, stop
                        reason, seconds, turns
    trajectories/       <safe id>.json per item (the whole episode) and <safe id>/ with the tool images
    summary.json        the benchmark's summary rows plus counts, the run's identity, the reference and the
                        skipped annotation rows
    summary.md          the same as a Markdown table
    plot.png            accuracy by duration / distance / IoU threshold / category / family
    report.html         every item with its turns, thoughts, tool calls and returned frames and crops

Crash safety: as each episode ends its trajectory is written first (atomically), then its prediction
line is appended and fsync'd — a prediction line is the commit point of an item. ``resume=True`` reads
``predictions.jsonl`` back (a last line cut short by a kill is dropped and the file trimmed to its last
whole line), skips the ids already there and appends the rest, so no item is lost or written twice.
Every episode's seed is ``seed + its index in tasks``, whatever runs beside it, so a resumed run
gives what an uninterrupted one would.

A folder that already holds files is only reused with ``resume=True``, and only if its ``run.json``
names the same benchmark, model, data and agent settings (:class:`RunError` otherwise, saying what
differs). ``--limit`` is not part of that identity: a run can be resumed with a larger limit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from tqdm.auto import tqdm

from mmagent.agent import Agent
from mmagent.eval.benchmarks.base import skipped_rows
from mmagent.trajectory import Task, Trajectory

RUN_FILE, PREDICTIONS_FILE, TRAJECTORY_DIR = "run.json", "predictions.jsonl", "trajectories"
SUMMARY_JSON, SUMMARY_MD, PLOT_FILE, REPORT_FILE = "summary.json", "summary.md", "plot.png", "report.html"
FORMAT_VERSION = 1


class RunError(ValueError):
    """A run folder that cannot be used as asked (one sentence for the user)."""


@dataclass
class EvalResult:
    out_dir: Path
    summary: dict[str, dict[str, Any]]
    #: prediction records of the tasks, in task order (only the finished ones)
    predictions: list[dict[str, Any]]
    n_tasks: int
    #: items found done in predictions.jsonl when the run (re)started
    resumed: int
    table: str


def safe_id(task_id: str) -> str:
    """A file name for ``task_id``: its safe characters plus a hash, so different ids never collide
    (not even on case-insensitive file systems)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id).strip("._")[:80] or "item"
    return f"{stem}-{hashlib.sha1(task_id.encode()).hexdigest()[:10]}"


def describe_agent(agent: Agent) -> dict[str, Any]:
    """The agent settings that change results: policy kind, tools, budgets, pixels, sampling, prompt."""
    policy = agent.policy

    def plain(x: Any) -> Any:
        return dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x

    return {"policy": type(policy).__name__, "tools": list(agent.tools), "budgets": plain(agent.budgets),
            "media_budget": plain(getattr(policy, "media_budget", None)),
            "sampling": plain(getattr(policy, "sampling", None)),
            "system_prompt_sha256": hashlib.sha256(agent.system_prompt.encode()).hexdigest()}


def _normal(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def _json_default(x: Any) -> Any:
    if hasattr(x, "item") and callable(x.item):  # numpy scalars
        return x.item()
    if hasattr(x, "tolist") and callable(x.tolist):
        return x.tolist()
    return str(x)


def strict_json(x: Any) -> Any:
    """``x`` with every non-finite float (an unparsed answer's infinite km, say) as None, so the files are
    strict JSON that any tool reads; benchmarks' ``summarise`` read None back as "no value"."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    return x


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_predictions(path: str | os.PathLike, repair: bool = False) -> dict[str, dict[str, Any]]:
    """id -> record from a predictions file. A last line cut short (a kill mid-write) is ignored, and with
    ``repair`` the file is trimmed back to its last whole line; a bad line anywhere else is an error."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = path.read_bytes()
    records: dict[str, dict[str, Any]] = {}
    pos, line_no = 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        last = end < 0
        line = data[pos:] if last else data[pos:end]
        line_no += 1
        try:
            rec = json.loads(line) if line.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            rec = ...
        if rec is ... or (rec is not None and not (isinstance(rec, dict) and isinstance(rec.get("id"), str))):
            if not last:
                raise RunError(f"{path}:{line_no} is not a prediction record; the file is damaged (remove that "
                               "line to keep the rest, or start again with a new --out)")
            if repair:  # a partial last line from a kill: drop it
                with open(path, "r+b") as f:
                    f.truncate(pos)
                    f.flush()
                    os.fsync(f.fileno())
            break
        if rec is not None:
            records.setdefault(rec["id"], rec)
        if last:
            if repair:  # a whole record whose newline was not written yet
                with open(path, "ab") as f:
                    f.write(b"\n")
                    f.flush()
                    os.fsync(f.fileno())
            break
        pos = end + 1
    return records


def check_folder(out_dir: str | os.PathLike, resume: bool, identity: dict[str, Any] | None = None) -> bool:
    """Whether ``out_dir`` holds a run to resume (False: a new run goes there). Raises RunError for a folder
    that holds files without ``resume``, that is not a run folder, or (given ``identity``, the part of a run's
    identity known before a model loads) that holds a run made with other settings. Cheap: callers check
    before loading a model; :func:`run_eval` checks again, with the whole identity."""
    out = Path(out_dir)
    if not out.exists():
        return False
    if not out.is_dir():
        raise RunError(f"{out} is a file, not a folder: choose another --out")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return False
    if not resume:
        raise RunError(f"{out} already holds a run ({', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''}): "
                       "pass --resume to continue it, or give a new --out")
    if not (out / RUN_FILE).is_file():
        raise RunError(f"{out} is not an mmagent eval folder (no {RUN_FILE}): give a new --out")
    if identity is not None:
        _check_identity(out, identity, known_only=True)
    return True


def _check_identity(out: Path, identity: dict[str, Any], known_only: bool = False) -> dict[str, Any]:
    """The stored run.json of ``out`` if its identity matches ``identity`` (with ``known_only``: in the keys
    ``identity`` has), else RunError saying what differs."""
    run_file = out / RUN_FILE
    try:
        stored = json.loads(run_file.read_text())
        old = stored["identity"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise RunError(f"{run_file} is damaged: give a new --out") from None
    diffs = _differences(old, _normal(identity), known_only=known_only)
    if diffs:
        shown = "; ".join(diffs[:3]) + (f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else "")
        raise RunError(f"{out} holds a different run, so it cannot be resumed: {shown}. Give a new --out "
                       "(or run again with the settings it was made with)")
    return stored


def _check_folder(out: Path, identity: dict[str, Any], resume: bool) -> dict[str, Any] | None:
    """The stored run.json when resuming a matching run; None for a new run. Raises RunError otherwise."""
    if not check_folder(out, resume):
        return None
    return _check_identity(out, identity)


def _differences(old: Any, new: Any, where: str = "", known_only: bool = False) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(new) if known_only else set(old) | set(new), key=str):
            out += _differences(old.get(k), new.get(k), f"{where}.{k}" if where else str(k), known_only)
        return out
    if old != new:
        def short(x: Any) -> str:
            s = json.dumps(x, default=str)
            return s if len(s) <= 60 else s[:57] + "..."
        return [f"{where} was {short(old)}, now {short(new)}"]
    return []


def _save_trajectory(traj: Trajectory, folder: Path, name: str) -> str:
    image_dir = folder / name
    if image_dir.exists():  # left by an attempt that was killed before its prediction line
        shutil.rmtree(image_dir)
    d = traj.to_dict(image_dir=image_dir, relative_to=folder)
    _write_atomic(folder / f"{name}.json", json.dumps(d, ensure_ascii=False, default=_json_default) + "\n")
    return f"{name}.json"


def _record(task: Task, traj: Trajectory, score: dict[str, Any], name: str) -> dict[str, Any]:
    return {"id": task.id, "answer": traj.answer, "score": score, "stop_reason": traj.stop_reason,
            "seconds": round(float(traj.timings.get("episode_s", 0.0)), 4),
            "turns": sum(t.role == "assistant" for t in traj.turns), "tool_calls": len(traj.tool_calls),
            "error": traj.info.get("error"), "safe_id": name, "trajectory": name + ".json"}


def _bench_module(bench: ModuleType | str) -> ModuleType:
    if isinstance(bench, str):
        from mmagent.eval.registry import module

        return module(bench)
    for attr in ("NAME", "score", "summarise"):
        if not hasattr(bench, attr):
            raise TypeError(f"{bench!r} is not a benchmark module (it has no {attr})")
    return bench


def run_eval(bench: ModuleType | str, agent: Agent, tasks: Sequence[Task], out_dir: str | os.PathLike,
             resume: bool = False, batch_size: int = 8, progress: bool = True, seed: int = 0,
             identity: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
             title: str | None = None) -> EvalResult:
    """Run ``agent`` on ``tasks`` into ``out_dir`` (see the module docstring); return the summary.

    ``identity`` (model, backend, data folder, benchmark options) is what a resumed run must match, with
    the benchmark name, the agent's settings (:func:`describe_agent`) and ``seed``; ``info`` is recorded
    in run.json but not compared (the command line, the limit).
    """
    module = _bench_module(bench)
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    skipped = skipped_rows(tasks)
    tasks = list(tasks)
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise RunError(f"task id {dup!r} appears more than once: every task needs its own id")
    if any(not i for i in ids):
        raise RunError("a task has an empty id: every task needs its own id")
    out = Path(out_dir)
    ident = _normal({"bench": module.NAME, **(identity or {}), "agent": describe_agent(agent), "seed": seed})
    stored = _check_folder(out, ident, resume)
    traj_dir = out / TRAJECTORY_DIR
    traj_dir.mkdir(parents=True, exist_ok=True)
    pred_path = out / PREDICTIONS_FILE
    done = read_predictions(pred_path, repair=True) if stored is not None else {}
    if done and not any(t.id in done for t in tasks):
        raise RunError(f"none of the {len(done)} predictions in {pred_path} are for these tasks: that folder was "
                       "made for other data; give a new --out")
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    run = stored or {"format": FORMAT_VERSION, "identity": ident, "created": now, "info": _normal(info or {})}
    if stored is not None:
        run.setdefault("resumed", []).append({"at": now, "done": len(done), "info": _normal(info or {})})
    run["reference"] = _normal(getattr(module, "REFERENCE", None))
    run["skipped_rows"] = skipped
    _write_atomic(out / RUN_FILE, json.dumps(run, indent=2) + "\n")

    todo = [(k, t) for k, t in enumerate(tasks) if t.id not in done]
    resumed = len(tasks) - len(todo)
    scored = [float(done[t.id]["score"]["score"]) for t in tasks if t.id in done]
    bar = tqdm(total=len(tasks), initial=resumed, desc=module.NAME, unit="item", disable=not progress,
               dynamic_ncols=True)
    try:
        with open(pred_path, "a", encoding="utf-8") as pf:
            # batch_size episodes in flight; each one that ends is written at once and the next task starts
            episodes = agent.run_stream([t for _, t in todo], seed=[seed + k for k, _ in todo], progress=False,
                                        max_open=batch_size)
            for j, traj in episodes:
                task = todo[j][1]
                score = dict(module.score(task, traj.answer))
                traj.rewards["task"] = float(score["score"])
                name = safe_id(task.id)
                _save_trajectory(traj, traj_dir, name)
                rec = _record(task, traj, score, name)
                done[task.id] = rec
                pf.write(json.dumps(strict_json(rec), ensure_ascii=False, default=_json_default) + "\n")
                pf.flush()
                os.fsync(pf.fileno())
                scored.append(float(score["score"]))
                bar.update(1)
                bar.set_postfix(score=f"{sum(scored) / len(scored):.3f}")
    finally:
        bar.close()
    return finish_run(module, tasks, out, records=done, resumed=resumed, title=title, skipped=skipped)


def finish_run(bench: ModuleType | str, tasks: Sequence[Task], out_dir: str | os.PathLike,
               records: dict[str, dict[str, Any]] | None = None, resumed: int = 0,
               title: str | None = None, skipped: Sequence[str] | None = None) -> EvalResult:
    """Write summary.json, summary.md, plot.png and report.html of a run folder (also to redo them).

    ``skipped``: the malformed annotation rows the loader left out (default: ``tasks.skipped`` of a
    :class:`~mmagent.eval.benchmarks.base.TaskList`, else what run.json recorded)."""
    from mmagent.eval.report import markdown_table, plot_summary, write_report

    module = _bench_module(bench)
    out = Path(out_dir)
    records = records if records is not None else read_predictions(out / PREDICTIONS_FILE)
    run = json.loads((out / RUN_FILE).read_text()) if (out / RUN_FILE).is_file() else {}
    ident = run.get("identity", {})
    skipped = list(skipped if skipped is not None else skipped_rows(tasks) or run.get("skipped_rows", []))
    done_tasks = [t for t in tasks if t.id in records]
    scores = [records[t.id]["score"] for t in done_tasks]
    summary = module.summarise(done_tasks, scores) if done_tasks else {}
    others = len(set(records) - {t.id for t in tasks})
    model = ident.get("model", "")
    title = title or f"{module.NAME} · {model_label(model) if model else ident.get('agent', {}).get('policy', '')}"
    stops: dict[str, int] = {}
    for t in done_tasks:
        stops[records[t.id]["stop_reason"]] = stops.get(records[t.id]["stop_reason"], 0) + 1
    secs = [float(records[t.id].get("seconds") or 0) for t in done_tasks]
    payload = {"bench": module.NAME, "model": model, "n_tasks": len(tasks), "n_done": len(done_tasks),
               "summary": summary, "stop_reasons": stops,
               "mean_seconds": sum(secs) / len(secs) if secs else 0.0, "other_predictions": others,
               "skipped_rows": {"n": len(skipped), "rows": skipped},
               "reference": _normal(getattr(module, "REFERENCE", None)), "identity": ident}
    _write_atomic(out / SUMMARY_JSON, json.dumps(strict_json(payload), indent=2, default=_json_default) + "\n")
    table = markdown_table(summary)
    notes = [f"{len(done_tasks)} of {len(tasks)} items scored."]
    if skipped:
        notes.append(f"{len(skipped)} malformed annotation rows were skipped (listed in {SUMMARY_JSON}); "
                     f"the first: {skipped[0]}")
    reference = _reference_note(getattr(module, "REFERENCE", None))
    if reference:
        notes.append(reference)
    if others:
        notes.append(f"{others} other predictions in {PREDICTIONS_FILE} are for items outside this run.")
    _write_atomic(out / SUMMARY_MD, f"# {title}\n\n{table}\n\n" + " ".join(notes) + "\n")
    plot = plot_summary(module.NAME, summary, scores, out / PLOT_FILE, title=title)
    write_report(out / REPORT_FILE, title, summary, tasks, records, out / TRAJECTORY_DIR,
                 plot=PLOT_FILE if plot else None, notes=notes[1:])
    return EvalResult(out_dir=out, summary=summary, predictions=[records[t.id] for t in done_tasks],
                      n_tasks=len(tasks), resumed=resumed, table=table)


def _reference_note(reference: Any) -> str:
    """One sentence naming the public scorer(s) the headline numbers reproduce."""
    if not isinstance(reference, dict):
        return ""
    refs = [reference] if "repo" in reference else [r for r in reference.values() if isinstance(r, dict)]
    named = "; ".join(f"{r.get('benchmark', '')}: {r['repo']} {r['file']} @ {str(r['commit'])[:8]}" for r in refs)
    return f"Scored as the reference scorer does ({named})." if named else ""


def default_run_dir(bench: str, model: str, backend: str = "hf", tools: Sequence[str] | None = None,
                    bench_tools: Sequence[str] = (), frames: int | None = None, root: str = "runs/eval") -> Path:
    """``runs/eval/<bench>-<model>``, plus what makes a run incomparable with the plain one: the backend when
    not ``hf``, ``notools`` or the tools when not the benchmark's own, and ``f<N>`` for a frame count given."""
    parts = [bench, model_label(model)]
    if backend != "hf":
        parts.append(backend)
    if tools is not None and list(tools) != list(bench_tools):
        parts.append("tools_" + "+".join(tools) if tools else "notools")
    if frames is not None:
        parts.append(f"f{frames}")
    return Path(root) / re.sub(r"[^A-Za-z0-9._+-]+", "_", "-".join(parts))


def model_label(model: str) -> str:
    """A short name for a model: a folder's name (its parent's for .../final), or the hub id."""
    p = Path(model)
    if p.name == "final" and p.parent.name:
        return p.parent.name
    return p.name or model
