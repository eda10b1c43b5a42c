"""What an eval run leaves to look at: a Markdown table, a plot and a browsable HTML report.

* :func:`markdown_table` — one row per summary row (``overall``, ``duration/short``, ...), one column per
  metric; shares as fractions with three decimals, kilometres with one.
* :func:`plot_summary` — one PNG per run: accuracy by duration (Video-MME), by distance threshold (geo),
  recall by IoU threshold (Charades-STA, from every item's IoU), by category (V*), by family (toy world);
  other benchmarks get their rows' main metric. Drawn with matplotlib's Agg canvas directly (no pyplot,
  so no global backend is touched).
* :func:`write_report` — ``report.html``: the summary, the plot, an index, then one collapsible section
  per item with its question, options, truth, prediction and score, and every turn: the thoughts, the
  tool call, the observation text and the frames/crops the tool returned (``<img>`` to the PNG files the
  runner saved beside the trajectory). Turns are numbered by policy turn (a tool's result carries the number
  of the turn that called it), as the item's header counts them; tables wider than the page scroll inside
  their own box. Model output is untrusted: every piece of text is HTML-escaped, and the page runs no script.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import quote

from mmagent.trajectory import Task

_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if key == "n" and isinstance(value, (int, float)):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
        return f"{value:.1f}" if key.endswith("_km") else f"{value:.3f}"
    return str(value)


def _columns(summary: dict[str, dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for row in summary.values():
        cols += [k for k in row if k not in cols]
    return (["n"] if "n" in cols else []) + [c for c in cols if c != "n"]


def markdown_table(summary: dict[str, dict[str, Any]]) -> str:
    """The summary as a Markdown table (``| row | n | metric ... |``)."""
    if not summary:
        return "(no items scored)"
    cols = _columns(summary)
    lines = ["| row | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, row in summary.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(c, row[c]) if c in row else "-" for c in cols) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the plot

def _bars(summary: dict[str, dict[str, Any]], prefix: str | None, metric: str) -> tuple[list[str], list[float]]:
    rows = [(k, v) for k, v in summary.items() if (prefix is None and k != "overall") or
            (prefix is not None and k.startswith(prefix))]
    if prefix is not None and "overall" in summary:
        rows = [("overall", summary["overall"])] + rows
    rows = [(k, v) for k, v in rows if isinstance(v.get(metric), (int, float))]
    return [k.split("/", 1)[-1] for k, _ in rows], [float(v[metric]) for _, v in rows]


def _first_metric(summary: dict[str, dict[str, Any]]) -> str | None:
    for row in summary.values():
        for k, v in row.items():
            if k != "n" and isinstance(v, (int, float)) and not isinstance(v, bool):
                return k
    return None


def plot_summary(bench: str, summary: dict[str, dict[str, Any]], scores: Sequence[dict[str, Any]],
                 path: str | os.PathLike, title: str = "") -> Path | None:
    """Draw the benchmark's plot to ``path`` (PNG); None if there is nothing to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not summary:
        return None
    fig = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if bench == "geo":
        for name, row in summary.items():
            pts = sorted((float(m.group(1)), float(v)) for k, v in row.items()
                         if (m := re.fullmatch(r"acc@([\d.]+)km", k)))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name} (n={int(row['n'])})")
        ax.set_xscale("log")
        ax.set_xlabel("distance threshold (km)")
        ax.set_ylabel("accuracy (share within)")
        ax.legend(fontsize=8)
    elif bench == "charades_sta":
        ious = [float(s.get("iou", s.get("score", 0.0))) for s in scores]
        if not ious:
            return None
        ts = [round(0.05 * k, 2) for k in range(1, 20)]
        ax.plot(ts, [sum(i >= t for i in ious) / len(ious) for t in ts], marker=".")
        for t in (0.3, 0.5, 0.7):
            ax.axvline(t, color="grey", lw=0.5, ls="--")
        ax.set_xlabel("IoU threshold")
        ax.set_ylabel("R@1 (share of queries)")
    else:
        prefix, metric = {"videomme": ("duration/", "accuracy"), "vstar": ("category/", "accuracy"),
                          "synth": (None, "score")}.get(bench, (None, _first_metric(summary)))
        if metric is None:
            return None
        labels, values = _bars(summary, prefix, metric)
        if not values:
            labels, values = _bars(summary, None, metric)
        if not values and "overall" in summary:
            labels, values = ["overall"], [float(summary["overall"].get(metric, 0.0))]
        ax.bar(range(len(values)), values, color="#4c72b0")
        crowded = len(labels) > 4
        ax.set_xticks(range(len(values)), labels, rotation=20 if crowded else 0, ha="right" if crowded else "center",
                      fontsize=8)
        for k, v in enumerate(values):
            ax.text(k, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(metric)
        by = {"videomme": "by duration", "vstar": "by category", "synth": "by family"}.get(bench, "")
        ax.set_xlabel(by)
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(title or bench, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path


# --------------------------------------------------------------------------- the HTML report

def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _json(value: Any) -> str:
    return _e(json.dumps(value, ensure_ascii=False, indent=1, default=str))


def anchor(safe_id: str) -> str:
    return "item-" + re.sub(r"[^A-Za-z0-9_-]", "_", safe_id)


def _html_table(summary: dict[str, dict[str, Any]]) -> str:
    if not summary:
        return "<p>No items scored yet.</p>"
    cols = _columns(summary)
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    rows = "".join("<tr><th>" + _e(name) + "</th>" + "".join(f"<td>{_e(_fmt(c, row[c]) if c in row else '-')}</td>"
                                                             for c in cols) + "</tr>" for name, row in summary.items())
    return f"<div class='wide'><table class='summary'><tr><th>row</th>{head}</tr>{rows}</table></div>"


def _img_src(rel_dir: str, path: str) -> str | None:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        return None
    return quote(f"{rel_dir}/{p.as_posix()}")


def _seconds(value: Any) -> str:
    """A duration as ``1.23 s`` (never ``-0.00 s``: a clock read across threads can be a hair negative)."""
    return f"{max(0.0, float(value or 0)):.2f} s"


def _plural(n: Any, word: str) -> str:
    return f"{_e(n)} {word}{'' if n == 1 else 's'}"


def _turns_html(traj: dict[str, Any], rel_dir: str) -> str:
    """Each policy turn (numbered as the item's header counts them) and the tool result that answers it."""
    out = []
    k = 0
    for t in traj.get("turns", []):
        if t.get("role") == "assistant":
            k += 1
            thoughts = "".join(f"<blockquote class='think'>{_e(th.strip())}</blockquote>"
                               for th in _THINK.findall(t.get("text") or ""))
            call = t.get("tool_call")
            call_html = (f"<div class='call'>tool call: <code>{_e(call.get('name'))}</code> "
                         f"<code>{_e(json.dumps(call.get('arguments'), ensure_ascii=False))}</code></div>"
                         if call else "")
            err = f"<div class='err'>protocol error: {_e(t['error'])}</div>" if t.get("error") else ""
            out.append(f"<div class='turn assistant'><div class='meta'>turn {k} · policy · "
                       f"{_e(t.get('num_tokens', 0))} tokens · {_seconds(t.get('seconds'))}</div>{thoughts}"
                       f"<pre>{_e(t.get('text') or '')}</pre>{call_html}{err}</div>")
        else:
            obs = t.get("observation") or {}
            name = (t.get("tool_call") or {}).get("name") or "error"
            images = obs.get("images") or []
            labels = obs.get("image_labels") or [""] * len(images)
            handles = obs.get("handles") or [""] * len(images)
            figs = []
            for p, label, handle in zip(images, labels, handles):
                src = _img_src(rel_dir, p)
                if src is None:
                    continue
                cap = " · ".join(x for x in (handle, label) if x)
                figs.append(f"<figure><a href='{_e(src)}'><img src='{_e(src)}' loading='lazy' alt='{_e(cap)}'></a>"
                            f"<figcaption>{_e(cap)}</figcaption></figure>")
            cls = "turn tool error" if obs.get("is_error") else "turn tool"
            what = f"tool {_e(name)}" if name != "error" else "the agent's reply"
            out.append(f"<div class='{cls}'><div class='meta'>turn {k} · {what} · "
                       f"{_seconds(t.get('seconds'))}</div><pre>{_e(t.get('text') or '')}</pre>"
                       f"<div class='imgs'>{''.join(figs)}</div></div>")
    return "".join(out)


def _item_html(task: Task, rec: dict[str, Any], traj: dict[str, Any] | None, rel_dir: str) -> str:
    score = rec.get("score") or {}
    value = float(score.get("score", 0.0))
    cls = "good" if value >= 0.5 else "bad"
    opts = "".join(f"<li>{_e(o)}</li>" for o in task.options or [])
    score_rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(_fmt(k, v) if not isinstance(v, (list, dict)) else v)}</td>"
                         f"</tr>" for k, v in score.items())
    media = " · ".join(f"{k}: {_e(Path(v).name)}" for k, v in (("video", task.video), ("image", task.image)) if v)
    body = (f"<div class='qa'><h4>Question</h4><pre>{_e(task.question)}</pre>"
            + (f"<h4>Options</h4><ol class='opts'>{opts}</ol>" if opts else "")
            + f"<h4>Truth</h4><pre>{_json(task.answer)}</pre>"
            f"<h4>Prediction</h4><pre>{_e(rec.get('answer') if rec.get('answer') is not None else '(none)')}</pre>"
            f"<h4>Score</h4><div class='wide'><table class='score'>{score_rows}</table></div>"
            f"<p class='meta'>{media} · stop: {_e(rec.get('stop_reason'))} · "
            f"{_plural(rec.get('turns'), 'policy turn')}"
            + (f" · {_plural(rec.get('tool_calls'), 'tool call')}" if rec.get("tool_calls") is not None else "")
            + f" · {_seconds(rec.get('seconds'))}"
            + (f" · error: {_e(rec['error'])}" if rec.get("error") else "")
            + (f" · <a href='{_e(quote(rel_dir + '/' + rec['trajectory']))}'>trajectory JSON</a>"
               if rec.get("trajectory") else "") + "</p></div>")
    turns = _turns_html(traj, rel_dir) if traj else "<p class='meta'>(trajectory file missing)</p>"
    return (f"<section id='{_e(anchor(rec.get('safe_id', task.id)))}'><details><summary><span class='{cls}'>"
            f"{value:.2f}</span> {_e(task.id)} · {_e(task.task_type)} · {_e(rec.get('stop_reason'))}</summary>"
            f"{body}<h4>Turns</h4>{turns}</details></section>")


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;color:#222}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f6f6;padding:.4em .6em;border-radius:4px;margin:.2em 0}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left}
table.index td{max-width:420px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
details{border:1px solid #ddd;border-radius:6px;margin:.4em 0;padding:.3em .6em}summary{cursor:pointer}
.good{color:#0a7a2f;font-weight:bold}.bad{color:#b3261e;font-weight:bold}.meta{color:#666;font-size:12px}
.turn{border-left:3px solid #4c72b0;margin:.5em 0;padding-left:.6em}.turn.tool{border-color:#dd8452}
.turn.error{border-color:#b3261e}.think{color:#555;font-style:italic;margin:.2em 0 .2em 1em}
.call code{background:#eef;padding:0 .3em}.err{color:#b3261e}.imgs{display:flex;flex-wrap:wrap;gap:.5em}
figure{margin:0}figure img{max-height:180px;max-width:100%;border:1px solid #ccc}
figcaption{font-size:11px;color:#555}.wide{overflow-x:auto;max-width:100%}
"""


def write_report(path: str | os.PathLike, title: str, summary: dict[str, dict[str, Any]], tasks: Sequence[Task],
                 records: dict[str, dict[str, Any]], trajectory_dir: str | os.PathLike,
                 plot: str | None = None, notes: Sequence[str] = ()) -> Path:
    """Write the HTML report of a run folder; ``records`` maps task id -> prediction record."""
    path = Path(path)
    traj_dir = Path(trajectory_dir)
    rel_dir = os.path.relpath(traj_dir, path.parent).replace(os.sep, "/")
    done = [t for t in tasks if t.id in records]
    index = "".join(
        f"<tr><td><a href='#{_e(anchor(records[t.id].get('safe_id', t.id)))}'>{_e(t.id)}</a></td>"
        f"<td class='{'good' if float((records[t.id].get('score') or {}).get('score', 0)) >= 0.5 else 'bad'}'>"
        f"{float((records[t.id].get('score') or {}).get('score', 0)):.2f}</td>"
        f"<td>{_e(records[t.id].get('stop_reason'))}</td><td>{_e(records[t.id].get('turns'))}</td>"
        f"<td>{_e(records[t.id].get('answer') if records[t.id].get('answer') is not None else '(none)')}</td></tr>"
        for t in done)
    items = []
    for t in done:
        rec = records[t.id]
        traj = None
        if rec.get("trajectory"):
            try:
                traj = json.loads((traj_dir / rec["trajectory"]).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                traj = None
        items.append(_item_html(t, rec, traj, rel_dir))
    page = ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta http-equiv='Content-Security-Policy' content=\"script-src 'none'; object-src 'none'\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class='meta'>{len(done)} of {len(tasks)} items scored. "
            + " ".join(_e(n) for n in notes) + "</p>"
            f"<h2>Summary</h2>{_html_table(summary)}"
            + (f"<p><img src='{_e(quote(plot))}' alt='plot'></p>" if plot else "")
            + "<h2>Items</h2><div class='wide'><table class='index'><tr><th>id</th><th>score</th><th>stop</th>"
            f"<th>policy turns</th><th>answer</th></tr>{index}</table></div>{''.join(items)}</body></html>\n")
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path
