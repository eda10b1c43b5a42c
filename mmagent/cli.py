"""The ``mmagent`` command line: ``run`` one question, list ``tools``, build a ``make-tiny`` offline model,
build the ``synth`` toy world, ``eval`` a model on a benchmark, ``serve`` it over HTTP, ``train`` a policy.

Each subcommand is a small function over the Python API; ``mmagent <command> --help`` documents it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="answer one question about a video or an image, printing every step",
                       description="Answer one question about a video or an image. The agent reasons, calls "
                                   "tools, sees their images and answers; every step is printed.")
    p.add_argument("question", help="the question, in quotes")
    p.add_argument("--model", help="hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct or Qwen/Qwen3-VL-8B-Instruct) or a "
                                   "local folder; default: the built-in tiny model, trained on the toy world only")
    media = p.add_mutually_exclusive_group(required=True)
    media.add_argument("--video", help="path of a video file")
    media.add_argument("--image", help="path of an image file")
    p.add_argument("--option", action="append", dest="options", metavar="TEXT",
                   help='an answer option; repeat it: --option "A. red" --option "B. blue"')
    p.add_argument("--tools", help="comma-separated tool names (see `mmagent tools`); default: the ones the model "
                                   "was trained with, else resample_frames,zoom")
    p.add_argument("--max-turns", type=int, default=6, help="policy turns before stopping (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per turn (default: %(default)s)")
    p.add_argument("--frames", type=int, help="video frames in the first prompt (default: the model's trained "
                                               "budget, else 16)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler; with --temperature above 0 the same "
                                                        "seed gives the same episode (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--json", action="store_true", help="print the whole trajectory as one JSON object")
    p.add_argument("--save", metavar="FILE.jsonl", help="also append the trajectory (and its images) to this file")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from mmagent.agent import Agent, Budgets, answer_line, format_turn
    from mmagent.media import MediaError
    from mmagent.policy.checkpoint import saved_media_budget
    from mmagent.policy.render import MediaBudget
    from mmagent.trajectory import save_jsonl

    for kind in ("video", "image"):
        path = getattr(args, kind)
        if path is not None and not Path(path).is_file():
            return _fail(f"{kind} not found: {path}")
    if args.image is not None:
        from mmagent.media import load_image

        try:  # a file the model cannot be shown is refused before the model loads
            load_image(args.image)
        except MediaError as exc:
            return _fail(str(exc))
    try:
        model = _model_or_default(args.model)
        if args.model is None and not args.json:
            from mmagent.default_model import LABEL

            print(f"Model: {LABEL}", flush=True)
        tools = _tool_names(args.tools, model)
        budget = None
        if args.frames is not None:
            budget = dataclasses.replace(saved_media_budget(model) or MediaBudget(), video_frames=args.frames)
        agent = Agent.from_pretrained(model, tools=tools, device=args.device, temperature=args.temperature,
                                      budgets=Budgets(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens),
                                      media_budget=budget)
    except (OSError, KeyError, ValueError) as exc:
        return _fail(str(exc).strip("'\""))
    show = None if args.json else (lambda turn: print(format_turn(turn), flush=True))
    if show:
        print(f"Question: {args.question}", flush=True)
    try:
        result = agent.run(args.question, video=args.video, image=args.image, options=args.options, seed=args.seed,
                           on_turn=show)
    except MediaError as exc:
        return _fail(str(exc))
    traj = result.trajectory
    if args.save:
        save_jsonl([traj], args.save, append=True)
    if args.json:
        print(json.dumps(trajectory_summary(traj), ensure_ascii=False))
    else:
        print(f"Answer: {answer_line(traj)}   [stop: {traj.stop_reason}, "
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
            "options": traj.task.options, "answer": traj.answer,
            "answer_valid": traj.answer is not None and not traj.info.get("invalid_answer"),
            "stop_reason": traj.stop_reason, "turns": turns,
            "num_tokens": len(traj.token_ids), "policy_tokens": sum(traj.loss_mask),
            "visual_tokens": traj.visual_tokens, "timings": traj.timings, "info": traj.info}


def _add_tools(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tools", help="list the tools the agent can call", description="List the registered tools.")
    p.add_argument("--json", action="store_true", help="print their JSON schemas")
    p.set_defaults(func=cmd_tools)


def cmd_tools(args: argparse.Namespace) -> int:
    from mmagent.toolbox import available_tools, create_tool

    tools = [create_tool(n) for n in available_tools()]
    if args.json:
        print(json.dumps([t.schema() for t in tools], indent=2))
    else:
        for t in tools:
            print(f"{t.name:18s} {t.description}")
    return 0


def _add_make_tiny(sub: argparse._SubParsersAction) -> None:
    from mmagent.policy.families import families

    names = [f.name for f in families()]
    p = sub.add_parser("make-tiny", help="build a tiny random Qwen2.5-VL or Qwen3-VL offline (for trying the CLI and "
                                         "tests)",
                       description="Build a tiny random checkpoint of a model family (real model class, real "
                                   "processor, a tokenizer trained here) in DIR without downloading anything. By "
                                   "default it is briefly trained to call resample_frames once and answer, so "
                                   "`mmagent run` shows a whole episode.")
    p.add_argument("dir", help="folder to write the checkpoint to")
    p.add_argument("--family", choices=names, default=names[0],
                   help=f"model family (default {names[0]}): " + ", ".join(f"{f.name} = {f.label}" for f in families()))
    p.add_argument("--no-imprint", action="store_true", help="leave the weights random")
    p.add_argument("--video", metavar="FILE.mp4", help="also write a synthetic test video here")
    p.set_defaults(func=cmd_make_tiny)


def cmd_make_tiny(args: argparse.Namespace) -> int:
    from mmagent.policy.families import get_family
    from mmagent.tiny import build_tiny, imprint, write_synthetic_video

    family = get_family(args.family)
    # The imprinted model is wider so that what it learns carries over to new questions and videos.
    path = build_tiny(args.dir, family.name, hidden_size=64 if args.no_imprint else 128)
    if not args.no_imprint:
        print("Teaching the tiny model one scripted episode (about 40 s on 2 CPU cores)...", flush=True)
        imprint(path)
    print(f"Wrote a tiny {family.label} to {path}")
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
    from mmagent.eval.benchmarks import synth
    from mmagent.training.synth_data import default_sft_path, write_sft_data

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
        results["oracle"] = synth.evaluate(synth.oracle_agent(), tasks)[2]
    results["no-tool oracle"] = synth.evaluate(synth.oracle_agent(use_tools=False), tasks)[2]
    (Path(args.dir) / "oracle_scores.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\nScores (1.0 = every answer right; grounding: mean IoU):")
    print(synth.format_table(results))
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    from mmagent.eval.registry import BENCHMARKS

    p = sub.add_parser("eval", help="score a model on a benchmark; resumable, with a report",
                       description="Run a model on a benchmark folder. Predictions are appended to "
                                   "OUT/predictions.jsonl as items finish, so a run that was stopped continues "
                                   "with --resume; at the end OUT holds summary.md/json, plot.png and report.html "
                                   "(every episode with its frames and crops). Benchmarks: "
                                   + "; ".join(f"{b.name}: {b.description}" for b in BENCHMARKS.values()) + ".")
    p.add_argument("--bench", required=True, choices=list(BENCHMARKS), help="benchmark name")
    p.add_argument("--data-dir", required=True, help="the benchmark's folder, in its official release layout")
    p.add_argument("--model", help="hf/vllm: hub id or local folder (default: the built-in toy-world model); "
                                   "openai: the served model name (default: the first one the server lists)")
    p.add_argument("--backend", choices=["hf", "vllm", "openai"], default="hf",
                   help="hf: transformers in this process (CPU/GPU); vllm: the vLLM offline engine (GPU, "
                        "pip install mmagent[vllm]); openai: any OpenAI-compatible server, e.g. `vllm serve` or "
                        "`mmagent serve` (default: %(default)s)")
    p.add_argument("--base-url", default=None, help="openai backend: the server's URL (default: "
                                                     "http://127.0.0.1:8000/v1)")
    p.add_argument("--api-key-env", metavar="VAR", help="openai backend: environment variable holding the API key "
                                                        "(default: OPENAI_API_KEY if set, else no key)")
    p.add_argument("--limit", type=int, help="only the first N items (synth: of each family)")
    p.add_argument("--out", metavar="DIR", help="the run folder (default: runs/eval/<bench>-<model>, plus the "
                                                "backend when not hf, notools or the tools when not the "
                                                "benchmark's, and f<N> for --frames N). A path ending in .json "
                                                "keeps the older meaning: the scores are written there and the "
                                                "run folder is that path without .json")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished items")
    p.add_argument("--batch-size", type=int, default=8,
                   help="episodes in flight at once; as one ends the next starts (default: %(default)s)")
    p.add_argument("--tools", help="comma-separated tools to offer (default: the benchmark's own)")
    p.add_argument("--no-tools", action="store_true", help="offer the model no tools")
    p.add_argument("--max-turns", type=int, help="policy turns per episode (default: the benchmark's)")
    p.add_argument("--max-new-tokens", type=int, help="new tokens per turn (default: the benchmark's)")
    p.add_argument("--frames", type=int, help="video frames in the first prompt (default: the model's or the "
                                               "benchmark's budget)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="episode k gets seed + k (default: %(default)s)")
    p.add_argument("--device", default=None, help="hf backend: cpu, cuda, ... (default: cpu for synth, else cuda "
                                                  "if available)")
    p.add_argument("--families", help="synth: comma-separated families (default: all)")
    p.add_argument("--subtitles", action="store_true", help="videomme: put the subtitles in the prompt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def _eval_policy(args: argparse.Namespace, media_budget):
    """The policy of ``args.backend``; raises ValueError/OSError/ImportError/RuntimeError with a message."""
    from mmagent.policy.loading import load_policy
    from mmagent.policy.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=args.temperature)
    if args.backend == "openai":
        from mmagent.policy.openai_http import DEFAULT_BASE_URL, api_key_from_env

        policy = load_policy(args.model, "openai", media_budget=media_budget, sampling=sampling,
                             base_url=args.base_url or DEFAULT_BASE_URL, api_key=api_key_from_env(args.api_key_env))
        args.model = policy.resolve_model()
        return policy
    if args.base_url or args.api_key_env:
        raise ValueError("--base-url and --api-key-env are for --backend openai")
    if args.backend == "vllm":
        return load_policy(args.model, "vllm", media_budget=media_budget, sampling=sampling, seed=args.seed)
    # the toy world's models are tiny: the CPU unless --device says otherwise
    device = args.device or ("cpu" if args.bench == "synth" else None)
    return load_policy(args.model, "hf", device=device, media_budget=media_budget, sampling=sampling)


def cmd_eval(args: argparse.Namespace) -> int:
    from mmagent.eval.benchmarks.base import DatasetError
    from mmagent.eval.registry import get
    from mmagent.eval.runner import RunError, check_folder, default_run_dir, model_label, run_eval
    from mmagent.agent import Agent, Budgets
    from mmagent.policy.render import MediaBudget
    from mmagent.toolbox import available_tools

    spec = get(args.bench)
    for flag, value in (("--families", args.families), ("--subtitles", args.subtitles or None)):
        if value is not None and flag.lstrip("-") not in spec.options:
            return _fail(f"{flag} is not an option of --bench {args.bench}")
    if args.limit is not None and args.limit < 1:
        return _fail("--limit must be at least 1")
    if args.batch_size < 1:
        return _fail("--batch-size must be at least 1")
    options = {"families": [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None,
               "subtitles": True if args.subtitles else None}
    scores_file = None
    out = args.out
    if out and out.endswith(".json"):
        scores_file, out = Path(out), str(Path(out).with_suffix(""))
    if args.no_tools and args.tools:
        return _fail("--tools and --no-tools contradict each other: give one")
    # Every refusal comes before a model loads: the folder, the data, the tools, the budgets.
    try:
        if out:
            check_folder(out, args.resume)
        tasks = spec.load(args.data_dir, limit=args.limit, **options)
        if not tasks:
            return _fail(f"{args.data_dir} holds no {args.bench} items")
        skipped = list(getattr(tasks, "skipped", []))
        if skipped:
            print(f"warning: skipped {len(skipped)} malformed annotation rows (listed in the run's summary.json):",
                  file=sys.stderr)
            for line in skipped[:5]:
                print(f"  {line}", file=sys.stderr)
        if args.no_tools:
            tools: list[str] = []
        else:
            tools = [t.strip() for t in args.tools.split(",") if t.strip()] if args.tools else list(spec.tools)
        unknown = [t for t in tools if t not in available_tools()]
        if unknown:
            return _fail(f"unknown tool {', '.join(map(repr, unknown))}; known: {', '.join(available_tools())}")
        budgets = Budgets(max_turns=args.max_turns or spec.max_turns,
                          max_new_tokens=args.max_new_tokens or spec.max_new_tokens)
        if args.backend != "openai":
            args.model = _model_or_default(args.model)
        media_budget = None
        if args.bench == "synth":
            from mmagent.eval.benchmarks import synth

            media_budget = synth.load_config(args.data_dir).media_budget()
        elif args.model and args.backend != "openai":
            from mmagent.policy.placement import budget_for

            media_budget = budget_for(args.model, None)
        if args.frames is not None:
            media_budget = dataclasses.replace(media_budget or MediaBudget(), video_frames=args.frames)
        # An OpenAI-compatible server names its model (no weights load here); the others load below.
        policy = _eval_policy(args, media_budget) if args.backend == "openai" else None
        out = out or str(default_run_dir(args.bench, args.model, args.backend, tools, spec.tools, args.frames))
        identity = {"model": args.model, "backend": args.backend, "data_dir": str(Path(args.data_dir).resolve()),
                    "options": {k: v for k, v in options.items() if v is not None}}
        check_folder(out, args.resume, identity={"bench": spec.module.NAME, **identity, "seed": args.seed,
                                                 "agent": {"tools": tools, "budgets": dataclasses.asdict(budgets)}})
        if policy is None:
            policy = _eval_policy(args, media_budget)
        agent = Agent(policy, tools=tools, budgets=budgets)
    except (DatasetError, RunError, OSError, ValueError, KeyError, ImportError, RuntimeError) as exc:
        return _fail(str(exc).strip("'\""))
    label = model_label(args.model)
    info = {"limit": args.limit, "argv": sys.argv[1:], "batch_size": args.batch_size}
    try:
        result = run_eval(spec.module, agent, tasks, out, resume=args.resume, batch_size=args.batch_size,
                          progress=not args.quiet, seed=args.seed, identity=identity, info=info,
                          title=f"{args.bench} · {label}")
    except RunError as exc:
        return _fail(str(exc))
    except (OSError, RuntimeError) as exc:  # e.g. the server went away: what finished is kept
        return _fail(f"{exc} (finished items are saved in {out}: rerun with --resume to continue)")
    except KeyboardInterrupt:
        return _fail(f"interrupted; finished items are saved in {out}: rerun with --resume to continue")
    print(result.table)
    print(f"\n{len(result.predictions)} of {result.n_tasks} items in {out} (report: {Path(out) / 'report.html'})",
          flush=True)
    if scores_file is not None:
        scores_file.write_text(json.dumps({"model": args.model, "bench": args.bench, "scores": result.summary},
                                          indent=2) + "\n")
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (transformers backend)",
                       description="Serve a model at http://HOST:PORT/v1/chat/completions, OpenAI-style (text, "
                                   "images and videos as base64 data URLs; stream=true as server-sent events), "
                                   "over the transformers backend; `mmagent eval --backend openai --base-url "
                                   "http://HOST:PORT/v1` talks to it. Requests that arrive together generate in "
                                   "one batch; past --max-queue waiting ones, new ones get 503 with Retry-After. "
                                   "Episodes keep their KV cache between turns. GET /health and /metrics show "
                                   "requests, queue depth, tokens/s and cache bytes.")
    p.add_argument("--model", help="hub id or local folder (default: the built-in toy-world model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--served-model-name", help="the name clients send as \"model\" (default: --model)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--max-batch", type=int, default=16, help="requests generated together (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for the batch; more get 503 "
                                                             "with Retry-After (default: %(default)s)")
    p.add_argument("--max-sessions", type=int, default=64, help="episodes whose KV cache is kept between turns "
                                                                "(default: %(default)s)")
    p.add_argument("--max-cache-mb", type=float, default=1024, help="memory the kept KV caches may take together "
                                                                    "(default: %(default)s)")
    p.add_argument("--session-ttl", type=float, default=600, help="seconds a kept episode may sit idle before its "
                                                                  "cache is freed (default: %(default)s)")
    p.add_argument("--max-request-mb", type=float, default=64, help="largest request body, media included "
                                                                    "(default: %(default)s)")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from mmagent.serve import EngineConfig, Server, load_engine

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"Note: binding {args.host}: anyone who can reach this machine can use the model.", flush=True)
    try:
        config = EngineConfig(max_batch=args.max_batch, max_queue=args.max_queue, max_sessions=args.max_sessions,
                              cache_bytes=int(args.max_cache_mb * 2 ** 20), session_ttl_s=args.session_ttl)
        if args.max_request_mb <= 0 or args.session_ttl <= 0 or args.max_cache_mb < 0 or args.max_sessions < 0:
            raise ValueError("--max-request-mb and --session-ttl must be positive, --max-cache-mb and "
                             "--max-sessions at least 0")
        model = _model_or_default(args.model)
        engine = load_engine(model, device=args.device, served_name=args.served_model_name, config=config)
    except (OSError, ValueError) as exc:
        return _fail(str(exc).strip("'\""))
    try:
        server = Server(engine, args.host, args.port, max_request_bytes=int(args.max_request_mb * 2 ** 20),
                        verbose=args.verbose)
    except OSError as exc:
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc} (pick another --port)")
    print(f"Serving {engine.model_name} at {server.url} (Ctrl-C stops)", flush=True)
    server.run()
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="open the Gradio demo: upload a video or image, ask, watch every step",
                       description="Serve the Gradio demo at http://HOST:PORT: upload a video or an image (or pick "
                                   "a toy-world example), ask a question and watch the agent's thoughts, tool calls "
                                   "and the images the tools return; download the trajectory. Needs "
                                   "`pip install 'mmagent[demo]'`.")
    p.add_argument("--model", help="hub id or local folder (default: the built-in tiny model, trained on the toy "
                                   "world only)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only; "
                                                       "0.0.0.0 lets other machines in)")
    p.add_argument("--port", type=int, default=7860, help="port (default: %(default)s)")
    p.add_argument("--tools", help="comma-separated tool names (default: the ones the model was trained with, "
                                   "else resample_frames,zoom)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="new tokens per turn (default: %(default)s)")
    p.add_argument("--max-video-mb", type=float, default=200, help="largest video upload (default: %(default)s)")
    p.add_argument("--max-image-mb", type=float, default=20, help="largest image upload (default: %(default)s)")
    p.add_argument("--max-video-seconds", type=float, default=600, help="longest video (default: %(default)s)")
    p.add_argument("--no-examples", action="store_true", help="do not build the toy-world examples")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        import gradio  # noqa: F401
    except ImportError:
        return _fail("the demo needs Gradio, which is not installed: pip install 'mmagent[demo]'")
    from mmagent.demo.app import DemoRunner, build_app, default_work_dir, launch
    from mmagent.demo.examples import toy_examples
    from mmagent.demo.uploads import UploadLimits
    from mmagent.policy.loading import load_policy
    from mmagent.policy.sampling import SamplingConfig

    try:
        limits = UploadLimits(max_video_mb=args.max_video_mb, max_image_mb=args.max_image_mb,
                              max_video_s=args.max_video_seconds)
        model = _model_or_default(args.model)
        if args.model is None:
            from mmagent.default_model import LABEL as label
        else:
            label = args.model
        tools = _tool_names(args.tools, model)
        print(f"Loading {model} ...", flush=True)
        policy = load_policy(model, "hf", device=args.device, sampling=SamplingConfig(temperature=args.temperature))
        work = default_work_dir()
        runner = DemoRunner(policy, tools, work, limits=limits, max_new_tokens=args.max_new_tokens,
                            model_label=label)
    except (OSError, KeyError, ValueError) as exc:
        return _fail(str(exc).strip("'\""))
    examples = [] if args.no_examples else toy_examples(work / "examples")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"Note: binding {args.host}: anyone who can reach this machine can use the demo.", flush=True)
    try:
        launch(build_app(runner, examples), host=args.host, port=args.port, limits=limits, allowed_paths=[str(work)])
    except OSError as exc:
        return _fail(f"cannot serve on {args.host}:{args.port}: {exc} (pick another --port)")
    except KeyboardInterrupt:
        pass
    return 0


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a policy: sft (cold start) or rl (GRPO / DGRPO)",
                       description="Train a policy. `mmagent train sft --config training/configs/sft_synth.yaml` "
                                   "fine-tunes on trajectories; `mmagent train rl --config "
                                   "training/configs/rl_synth.yaml` runs GRPO/DGRPO over live rollouts. "
                                   "Any config key can be overridden as key=value (nested: advantage.mode=grpo). "
                                   "For several processes run the same command under `accelerate launch`.")
    p.add_argument("stage", choices=["sft", "rl"], help="which trainer")
    p.add_argument("--config", help="YAML file of the stage's config (see training/configs/)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config values to set")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from mmagent.policy.vllm_engine import VLLMUnavailable
    from mmagent.training.config import ConfigError, load_config

    if args.stage == "sft":
        from mmagent.training.sft import SFTConfig as Config, train_sft as train
    else:
        from mmagent.training.rl import RLConfig as Config, train_rl as train  # type: ignore[assignment]
    try:
        cfg = load_config(Config, args.config, args.overrides)
        if not cfg.model:
            raise ConfigError("set model: a hub id or a local folder (in the config or as model=...)")
        summary = train(cfg, progress=not args.quiet)
    except (ConfigError, FileNotFoundError, ValueError, OSError, VLLMUnavailable) as exc:
        return _fail(str(exc))
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # under `accelerate launch`
            dist.destroy_process_group()
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmagent", description="Multimodal agents that think with tools.")
    sub = parser.add_subparsers(title="commands", metavar="<command>")
    _add_run(sub)
    _add_tools(sub)
    _add_make_tiny(sub)
    _add_synth(sub)
    _add_eval(sub)
    _add_serve(sub)
    _add_demo(sub)
    _add_train(sub)
    return parser


def _model_or_default(model: str | None) -> str:
    """``model``, or the built-in toy-world model's folder when it is None (FileNotFoundError if not installed)."""
    if model is not None:
        return model
    from mmagent.default_model import default_model_path

    return str(default_model_path())


def _tool_names(option: str | None, model: str) -> list[str]:
    """``--tools a,b`` as a list, else the tools ``model`` was trained with, else the agent's defaults."""
    from mmagent.agent import DEFAULT_TOOLS
    from mmagent.policy.checkpoint import saved_policy_record

    names = option or ",".join(saved_policy_record(model).get("tools", DEFAULT_TOOLS))
    return [t.strip() for t in names.split(",") if t.strip()]


def _fail(message: str) -> int:
    print(f"mmagent: error: {message}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # `train` takes key=value overrides anywhere after its stage (argparse alone would refuse them after --config).
    args, extra = parser.parse_known_args(argv)
    if extra:
        is_train = getattr(args, "func", None) is cmd_train
        bad = [x for x in extra if x.startswith("-") or "=" not in x] if is_train else extra
        if bad:
            parser.error(f"unrecognized arguments: {' '.join(bad)}")
        args.overrides = list(args.overrides) + extra
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
