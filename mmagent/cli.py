"""The ``mmagent`` command line: ``run`` one question, list ``tools``, build a ``make-tiny`` offline model,
build the ``synth`` toy world.

Each subcommand is a small function over the Python API; ``mmagent <command> --help`` documents it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="answer one question about a video or an image, printing every step",
                       description="Answer one question about a video or an image. The agent reasons, calls "
                                   "tools, sees their images and answers; every step is printed.")
    p.add_argument("question", help="the question, in quotes")
    p.add_argument("--model", required=True, help="hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct) or a local folder")
    media = p.add_mutually_exclusive_group(required=True)
    media.add_argument("--video", help="path of a video file")
    media.add_argument("--image", help="path of an image file")
    p.add_argument("--tools", default="resample_frames,zoom",
                   help="comma-separated tool names (see `mmagent tools`); default: %(default)s")
    p.add_argument("--max-turns", type=int, default=6, help="policy turns before stopping (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per turn (default: %(default)s)")
    p.add_argument("--frames", type=int, default=16, help="video frames in the first prompt (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--json", action="store_true", help="print the whole trajectory as one JSON object")
    p.add_argument("--save", metavar="FILE.jsonl", help="also append the trajectory (and its images) to this file")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from mmagent.agent import Agent, Budgets, format_turn
    from mmagent.media import MediaError
    from mmagent.policy.base import MediaBudget
    from mmagent.trajectory import save_jsonl

    for kind in ("video", "image"):
        path = getattr(args, kind)
        if path is not None and not Path(path).is_file():
            return _fail(f"{kind} not found: {path}")
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    try:
        agent = Agent.from_pretrained(args.model, tools=tools, device=args.device, temperature=args.temperature,
                                      budgets=Budgets(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
                                      media_budget=MediaBudget(video_frames=args.frames))
    except (OSError, KeyError, ValueError) as exc:
        return _fail(str(exc).strip("'\""))
    show = None if args.json else (lambda turn: print(format_turn(turn), flush=True))
    if show:
        print(f"Question: {args.question}", flush=True)
    try:
        result = agent.run(args.question, video=args.video, image=args.image, seed=args.seed, on_turn=show)
    except MediaError as exc:
        return _fail(str(exc))
    traj = result.trajectory
    if args.save:
        save_jsonl([traj], args.save, append=True)
    if args.json:
        print(json.dumps(trajectory_summary(traj), ensure_ascii=False))
    else:
        print(f"Answer: {result.answer if result.answer is not None else '(none)'}   [stop: {traj.stop_reason}, "
              f"{sum(t.role == 'assistant' for t in traj.turns)} turns, {len(traj.token_ids)} tokens]")
        if args.save:
            print(f"Saved to {args.save}")
    return 0


def trajectory_summary(traj) -> dict:
    """The trajectory as JSON without pixels: texts, calls, observation texts and image handles, counts."""
    turns = []
    for t in traj.turns:
        obs = t.observation
        turns.append({"role": t.role, "text": t.text, "error": t.error, "num_tokens": t.num_tokens,
                      "prefill_tokens": t.prefill_tokens, "seconds": round(t.seconds, 4),
                      "tool_call": {"name": t.tool_call.name, "arguments": t.tool_call.arguments} if t.tool_call else None,
                      "images": obs.handles if obs is not None else []})
    return {"question": traj.task.question, "video": traj.task.video, "image": traj.task.image,
            "answer": traj.answer, "stop_reason": traj.stop_reason, "turns": turns,
            "num_tokens": len(traj.token_ids), "policy_tokens": sum(traj.loss_mask),
            "visual_tokens": traj.visual_tokens, "timings": traj.timings, "info": traj.info}


def _add_tools(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tools", help="list the tools the agent can call", description="List the registered tools.")
    p.add_argument("--json", action="store_true", help="print their JSON schemas")
    p.set_defaults(func=cmd_tools)


def cmd_tools(args: argparse.Namespace) -> int:
    from toolbox import available_tools, create_tool

    tools = [create_tool(n) for n in available_tools()]
    if args.json:
        print(json.dumps([t.schema() for t in tools], indent=2))
    else:
        for t in tools:
            print(f"{t.name:18s} {t.description}")
    return 0


def _add_make_tiny(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-tiny", help="build a tiny random Qwen2.5-VL offline (for trying the CLI and tests)",
                       description="Build a tiny random Qwen2.5-VL checkpoint in DIR without downloading anything. "
                                   "By default it is briefly trained to call resample_frames once and answer, so "
                                   "`mmagent run` shows a whole episode.")
    p.add_argument("dir", help="folder to write the checkpoint to")
    p.add_argument("--no-imprint", action="store_true", help="leave the weights random")
    p.add_argument("--video", metavar="FILE.mp4", help="also write a synthetic test video here")
    p.set_defaults(func=cmd_make_tiny)


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from mmagent.tiny import build_tiny_qwen2_5_vl, imprint, write_synthetic_video

    # The imprinted model is wider so that what it learns carries over to new questions and videos.
    path = build_tiny_qwen2_5_vl(args.dir, hidden_size=64 if args.no_imprint else 128)
    if not args.no_imprint:
        print("Teaching the tiny model one scripted episode (about 40 s on 2 CPU cores)...", flush=True)
        imprint(path)
    print(f"Wrote a tiny Qwen2.5-VL to {path}")
    if args.video:
        print(f"Wrote a synthetic video to {write_synthetic_video(args.video)}")
    return 0


def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("synth", help="build the toy world: tasks where tools are needed, with oracle episodes",
                       description="Generate the toy-world benchmark in DIR (video QA, temporal grounding, image "
                                   "detail QA, geolocation; media made on the spot, nothing downloaded), run the "
                                   "oracle with and without tools on it, and save the oracle's episodes as SFT data "
                                   "(DIR/sft/oracle.jsonl).")
    p.add_argument("dir", help="folder to write (tasks.jsonl, config.json, media/, sft/)")
    p.add_argument("--per-family", type=int, default=50, help="items of each family (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same items (default: %(default)s)")
    p.add_argument("--families", default="video_qa,grounding,image_qa,geolocation",
                   help="comma-separated families (default: all four)")
    p.add_argument("--no-sft", action="store_true", help="skip writing the oracle's episodes")
    p.set_defaults(func=cmd_synth)


def cmd_synth(args: argparse.Namespace) -> int:
    from eval.benchmarks import synth
    from training.synth_data import default_sft_path, write_sft_data

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    try:
        tasks = synth.build(args.dir, per_family=args.per_family, seed=args.seed, families=families)
    except ValueError as exc:
        return _fail(str(exc))
    print(f"Wrote {len(tasks)} tasks to {Path(args.dir) / synth.TASKS_FILE}", flush=True)
    results = {}
    if not args.no_sft:
        report = write_sft_data(tasks, default_sft_path(args.dir))
        results["oracle"] = report["oracle"]
        print(f"Wrote {report['kept']} of {report['total']} oracle episodes to {report['path']}", flush=True)
    else:
        results["oracle"] = synth.evaluate(synth.oracle_agent(tasks), tasks)[2]
    results["no-tool oracle"] = synth.evaluate(synth.oracle_agent(tasks, use_tools=False), tasks)[2]
    (Path(args.dir) / "oracle_scores.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\nScores (1.0 = every answer right; grounding: mean IoU):")
    print(synth.format_table(results))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmagent", description="Multimodal agents that think with tools.")
    sub = parser.add_subparsers(title="commands", metavar="<command>")
    _add_run(sub)
    _add_tools(sub)
    _add_make_tiny(sub)
    _add_synth(sub)
    return parser


def _fail(message: str) -> int:
    print(f"mmagent: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
