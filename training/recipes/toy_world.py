"""The toy-world recipe: from nothing to a tool-using policy on CPU, with every comparison the method needs.

Run it with ``python -m mmagent.training.recipes.toy_world runs/toy`` (its last run trained for 53.5 min on 2
CPU cores, against a 30-minute target; README); add ``--install`` to make the SFT+DGRPO result mmagent's
built-in default model. Stages, each skipped when its result is already in the output folder (so a killed run
continues where it stopped):

1. data — a training world (seed 0) and a held-out test world (seed 1) from :mod:`mmagent.eval.benchmarks.synth`;
   the tool oracle's episodes on the training world are the SFT data, the no-tool oracle's the baseline's;
2. vision — a tiny random Qwen2.5-VL (:func:`mmagent.tiny.build_tiny_qwen2_5_vl`, own tokenizer) whose vision
   tower and merger learn to tell apart what the toy world draws (:mod:`mmagent.training.vision_pretrain`:
   label heads on fresh images, as a real VLM's encoder is pre-trained before any words);
   base, base-2, base-3 — that model pre-trained on drills (:mod:`mmagent.training.pretrain`), each stage from
   the one before: fresh rounds every step that teach it to copy a window, name what a frame shows, pick the
   option, then a video-QA episode's last turn whole (never the evaluation items);
3. sft — the cold start on the tool oracle's episodes; sft_notools — the same on the no-tool episodes, from
   the same pre-trained base, run without tools: the comparison isolates the tools;
4. grpo and dgrpo — RL from the SFT model on the training world's tasks, GRPO vs DGRPO advantages,
   everything else equal (same seed, same prompts per step);
5. eval — greedy episodes on the test world for: no tools, SFT, SFT+GRPO, SFT+DGRPO; written as
   ``results.json`` and ``results.md`` (each score with its standard error) with the time of every stage.

The sizes below are the shipped default model's; ``--quick`` shrinks everything to check the recipe runs.
``--preset video_qa`` trains and evaluates video QA alone with the same stages (README, "One family, end to end").
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from mmagent.eval.benchmarks import synth
from mmagent.trajectory import save_jsonl
from mmagent.training.pretrain import PretrainConfig, drill_accuracy, pretrain
from mmagent.training.rl import RLConfig, train_rl
from mmagent.training.sft import SFTConfig, train_sft
from mmagent.training.synth_data import write_sft_data
from mmagent.training.vision_pretrain import VisionPretrainConfig, vision_pretrain


@dataclass
class RecipeSizes:
    """The recipe's sizes; the defaults are the full recipe's (every family), with the vision mix and the chain
    of drill stages under which video QA learned (README, "One family, end to end")."""

    #: the toy-world families trained and evaluated (``synth.FAMILIES``)
    families: tuple[str, ...] = tuple(synth.FAMILIES)
    train_per_family: int = 120
    test_per_family: int = 50
    hidden_size: int = 128
    num_layers: int = 4
    #: width of the vision tower (a probe: 32 wide it learned 6 shapes to 0.33, 64 wide to 0.73)
    vision_width: int = 64
    vision_depth: int = 2
    #: vision pre-training (:mod:`mmagent.training.vision_pretrain`); 0 skips it
    vision_steps: int = 600
    vision_rounds: int = 32
    vision_lr: float = 3e-3
    #: the vision stage's round mix (None: ``vision_pretrain.DEFAULT_MIX``): frames and screens, which every
    #: shape, colour and screen colour learned to 1.00 on; the zoom views' characters are not learned (README)
    vision_mix: dict[str, float] | None = field(default_factory=lambda: {"frames": 6.0, "screen": 0.5})
    #: steps of lone digits on small crops before the main vision mix (``drills.digit_glyph``), rounds a step
    vision_glyph_steps: int = 0
    vision_glyph_rounds: int = 4
    #: the tower's rate in the later stages (drills, SFT, RL): the language model's rates undo what it learned
    tower_lr: float = 1e-4
    #: drill pre-training (:mod:`mmagent.training.pretrain`): copy the window, name what a frame shows, pick the
    #: option
    pretrain_steps: int = 1000
    pretrain_rounds: int = 16
    pretrain_lr: float = 2e-3
    #: the first drill stage's mix (None: ``pretrain.DEFAULT_MIX``) and its language / vision-only shares
    pretrain_mix: dict[str, float] | None = field(
        default_factory=lambda: {"window": 1.0, "flash": 2.0, "option": 1.5})
    pretrain_shares: tuple[float, float] = (0.0, 0.0)
    #: further drill stages, each from the one before: (steps, mix), all phases mixed; here more options, then
    #: the video-QA episode's last turn whole
    drill_phases: tuple[tuple[int, dict[str, float]], ...] = (
        (900, {"window": 0.5, "flash": 1.0, "option": 4.0}),
        (400, {"video_answer": 3.0, "window": 0.5, "option": 0.5}))
    sft_epochs: int = 3
    sft_lr: float = 1e-3
    #: one episode per optimizer step: a tiny model learns faster from more, noisier steps
    sft_grad_accum: int = 1
    rl_steps: int = 24
    rl_prompts: int = 4
    rl_group: int = 4
    rl_lr: float = 1e-4
    #: sampling temperature of the RL rollouts (at 1.0 the SFT model's episodes lose the format)
    rl_temperature: float = 0.7
    #: new tokens per turn (the oracle's longest turns, a grounding look's, are up to 311: every frame held
    #: against the asked colour)
    max_new_tokens: int = 360
    #: test items of each family that are evaluated
    eval_per_family: int = 50
    #: fresh drill rounds per kind scored after pre-training (0: skip)
    drill_eval: int = 20


#: one family, video QA, at the full recipe's sizes: from chance to 0.64 with tools against 0.12 without (32 min on
#: 2 cores; README, "One family, end to end")
VIDEO_QA = RecipeSizes(families=("video_qa",))
PRESETS = {"full": RecipeSizes(), "video_qa": VIDEO_QA}

#: the sizes ``--quick`` runs a preset at (its families, mixes and stages kept: :func:`quick`)
QUICK = dict(train_per_family=3, test_per_family=2, hidden_size=64, num_layers=2, vision_width=32, vision_steps=2,
             vision_rounds=2, vision_glyph_rounds=1, pretrain_steps=4, pretrain_rounds=2, sft_epochs=1, rl_steps=2,
             rl_prompts=2, rl_group=2, eval_per_family=2, drill_eval=1)


def quick(sizes: RecipeSizes) -> RecipeSizes:
    """``sizes``'s shape (families, mixes, stages) at QUICK's sizes: ``--quick`` checks that a preset runs."""
    return replace(sizes, **QUICK, vision_glyph_steps=2 if sizes.vision_glyph_steps else 0,
                   drill_phases=tuple((2, mix) for _, mix in sizes.drill_phases))

PRETRAIN_FILE = "pretrain.json"
VISION_FILE = "vision.json"
#: test items of each family whose greedy answers the installed model records, for tests to reproduce
REFERENCE_PER_FAMILY = 3
TEST_WORLD_SEED = 1
RUNS = {"no tools": "sft_notools", "SFT": "sft", "SFT+GRPO": "grpo", "SFT+DGRPO": "dgrpo"}


def _stage(out: Path, name: str, done: Path, fn: Callable[[], Any], timings: dict[str, float]) -> None:
    if done.exists():
        print(f"[{name}] already done ({done})", flush=True)
        return
    print(f"[{name}] ...", flush=True)
    t0 = time.perf_counter()
    fn()
    timings[name] = round(time.perf_counter() - t0, 1)
    print(f"[{name}] {timings[name]:.0f} s", flush=True)
    (out / "timings.json").write_text(json.dumps(timings, indent=2))


def run_recipe(out: str | Path, sizes: RecipeSizes | None = None, device: str = "cpu", progress: bool = True
               ) -> dict[str, Any]:
    """Run (or continue) the recipe in ``out``; returns the results (also in ``out/results.json``)."""
    from mmagent.tiny import build_tiny_qwen2_5_vl

    sizes = sizes or RecipeSizes()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    train_dir, test_dir = out / "data" / "train", out / "data" / "test"
    sft_tools, sft_plain = out / "data" / "sft_tools.jsonl", out / "data" / "sft_notools.jsonl"

    def data() -> None:
        tasks = synth.build(train_dir, per_family=sizes.train_per_family, seed=0, families=sizes.families,
                            progress=progress)
        synth.build(test_dir, per_family=sizes.test_per_family, seed=TEST_WORLD_SEED, families=sizes.families,
                    progress=progress)
        write_sft_data(tasks, sft_tools, progress=progress)
        no_tools = synth.oracle_agent(use_tools=False, offer_tools=False)
        trajs, _, _ = synth.evaluate(no_tools, tasks, progress=progress)
        save_jsonl(trajs, sft_plain)  # every no-tool episode: a guess is what that policy can do

    _stage(out, "data", sft_plain, data, timings)
    def vision() -> None:
        build_tiny_qwen2_5_vl(out / "random", seed=0, hidden_size=sizes.hidden_size, num_layers=sizes.num_layers,
                              vision_width=sizes.vision_width, vision_depth=sizes.vision_depth)
        if not sizes.vision_steps:  # no vision stage: the drills start from the random model
            shutil.copytree(out / "random", out / "vision", dirs_exist_ok=True)
            (out / "vision" / VISION_FILE).write_text(json.dumps({"steps": 0}))
            return
        glyphs = ((sizes.vision_glyph_steps, sizes.vision_glyph_rounds, {"digit_glyph": 1.0}),)
        cfg = VisionPretrainConfig(model=str(out / "random"), output_dir=str(out / "vision"),
                                   steps=sizes.vision_steps, rounds_per_step=sizes.vision_rounds, lr=sizes.vision_lr,
                                   phases=glyphs if sizes.vision_glyph_steps else (), device=device)
        if sizes.vision_mix:
            cfg.mix = dict(sizes.vision_mix)
        result = vision_pretrain(cfg, progress=progress)
        print(f"[vision] label accuracy: {result['accuracy']}", flush=True)
        (out / "vision" / VISION_FILE).write_text(json.dumps(result, indent=2))

    _stage(out, "vision", out / "vision" / VISION_FILE, vision, timings)

    # The drill stages: "base" from the vision model, then "base-2", "base-3", ... each from the one before.
    stages = [(sizes.pretrain_steps, sizes.pretrain_mix, sizes.pretrain_shares)]
    stages += [(steps, mix, (0.0, 0.0)) for steps, mix in sizes.drill_phases]
    names = ["base"] + [f"base-{k}" for k in range(2, len(stages) + 1)]
    base_dir = out / names[-1]

    def base(k: int) -> Callable[[], None]:
        steps, mix, (language, vision_only) = stages[k]
        start, folder = out / (names[k - 1] if k else "vision"), out / names[k]

        def run() -> None:
            cfg = PretrainConfig(model=str(start), output_dir=str(folder), steps=steps,
                                 rounds_per_step=sizes.pretrain_rounds, lr=sizes.pretrain_lr, vision_lr=sizes.tower_lr,
                                 language_share=language, vision_share=vision_only, device=device)
            if mix:
                cfg.mix = dict(mix)
            result = pretrain(cfg, progress=progress)
            if sizes.drill_eval and k == len(stages) - 1:
                # every drill when a stage drew the default mix, else the drills the stages' mixes name
                custom = all(m for _, m, _ in stages)
                drilled = {"kinds": tuple(sorted({kind for _, m, _ in stages for kind in m}))} if custom else {}
                result["drill_accuracy"] = drill_accuracy(str(folder), per_kind=sizes.drill_eval, device=device,
                                                          max_new_tokens=sizes.max_new_tokens, **drilled)
                print(f"[{names[k]}] drill accuracy: {result['drill_accuracy']}", flush=True)
            (folder / PRETRAIN_FILE).write_text(json.dumps(result, indent=2))
        return run

    for k, name in enumerate(names):
        _stage(out, name, out / name / PRETRAIN_FILE, base(k), timings)

    def sft(name: str, data_path: Path) -> Callable[[], None]:
        cfg = SFTConfig(model=str(base_dir), data=[str(data_path)], output_dir=str(out / name),
                        epochs=sizes.sft_epochs, lr=sizes.sft_lr, warmup_steps=10, grad_accum=sizes.sft_grad_accum,
                        freeze_vision=False, vision_lr=sizes.tower_lr, cache_episodes=True, save_every=400, device=device)
        return lambda: train_sft(cfg, progress=progress)

    _stage(out, "sft", out / "sft" / "final" / "config.json", sft("sft", sft_tools), timings)
    _stage(out, "sft_notools", out / "sft_notools" / "final" / "config.json", sft("sft_notools", sft_plain), timings)

    def rl(mode: str) -> Callable[[], None]:
        cfg = RLConfig(model=str(out / "sft" / "final"), data=str(train_dir), output_dir=str(out / mode),
                       steps=sizes.rl_steps, prompts_per_step=sizes.rl_prompts, group_size=sizes.rl_group,
                       lr=sizes.rl_lr, max_new_tokens=sizes.max_new_tokens, advantage={"mode": mode},
                       temperature=sizes.rl_temperature,
                       freeze_vision=False, vision_lr=sizes.tower_lr,
                       save_every=10, device=device)
        return lambda: train_rl(cfg, progress=progress)

    _stage(out, "grpo", out / "grpo" / "final" / "config.json", rl("grpo"), timings)
    _stage(out, "dgrpo", out / "dgrpo" / "final" / "config.json", rl("dgrpo"), timings)

    results: dict[str, Any] = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    tasks = synth.load(test_dir, limit=sizes.eval_per_family)
    for label, folder in RUNS.items():
        if label in results.get("scores", {}):
            continue
        t0 = time.perf_counter()
        agent = synth.model_agent(str(out / folder / "final"), use_tools=label != "no tools", device=device,
                                  max_new_tokens=sizes.max_new_tokens)
        _, _, summary = synth.evaluate(agent, tasks, progress=progress)
        results.setdefault("scores", {})[label] = summary
        timings[f"eval {label}"] = round(time.perf_counter() - t0, 1)
        (out / "results.json").write_text(json.dumps(results, indent=2))
        (out / "timings.json").write_text(json.dumps(timings, indent=2))
    train_s = sum(v for k, v in timings.items() if k in ("vision", *names, "sft", "sft_notools", "grpo", "dgrpo"))
    results["timings_s"] = timings
    results["training_s"] = train_s
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = synth.format_table(results["scores"])
    (out / "results.md").write_text(table + f"\n\nTraining time (vision + base + both SFTs + both RLs): {train_s / 60:.1f} min\n")
    return results


RECIPE_COMMAND = "python -m mmagent.training.recipes.toy_world runs/toy --install"


def reference_answers(model_dir: str | Path, test_dir: str | Path, per_family: int = REFERENCE_PER_FAMILY
                      ) -> dict[str, Any]:
    """Greedy answers and scores of ``model_dir`` on the first ``per_family`` test items of each family."""
    tasks = synth.load(test_dir, limit=per_family)
    agent = synth.model_agent(str(model_dir), use_tools=True, max_new_tokens=RecipeSizes().max_new_tokens)
    trajs, scores, _ = synth.evaluate(agent, tasks, progress=False)
    return {"test_world_seed": TEST_WORLD_SEED, "per_family": per_family,
            "answers": {t.id: traj.answer for t, traj in zip(tasks, trajs)},
            "scores": {t.id: float(s["score"]) for t, s in zip(tasks, scores)}}


def install_default(out: str | Path, run: str = "SFT+DGRPO") -> Path:
    """Copy ``run``'s final model into mmagent's embedded default (``mmagent/assets/toy_policy``), labelled."""
    from mmagent.default_model import DEFAULT_MODEL_DIR
    from mmagent.policy.checkpoint import POLICY_FILE

    out = Path(out)
    source = out / RUNS[run] / "final"
    results = json.loads((out / "results.json").read_text())
    if DEFAULT_MODEL_DIR.exists():
        shutil.rmtree(DEFAULT_MODEL_DIR)
    shutil.copytree(source, DEFAULT_MODEL_DIR)
    record = json.loads((source / POLICY_FILE).read_text())
    record.update({
        "label": "tiny Qwen2.5-VL-architecture policy trained on the mmagent toy world ONLY (synthetic videos "
                 "and images); not a general model",
        "trained_on": "mmagent toy world (eval.benchmarks.synth), training world seed 0",
        "stage": run, "recipe": RECIPE_COMMAND,
        "test_scores": results["scores"][run], "training_s": results["training_s"],
    })
    record.setdefault("tools", list(synth.SYNTH_TOOLS))
    record["reference"] = reference_answers(DEFAULT_MODEL_DIR, out / "data" / "test")
    (DEFAULT_MODEL_DIR / POLICY_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return DEFAULT_MODEL_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train and evaluate the toy-world policies (see the module doc).")
    parser.add_argument("out", help="output folder (a killed run continues here)")
    parser.add_argument("--quick", action="store_true",
                        help="the preset at tiny sizes, to check that the recipe runs (1 min)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full",
                        help="full: every family (the default model's recipe); video_qa: video QA alone, the "
                             "one-family run whose tools-vs-no-tools gain README reports")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fresh", action="store_true", help="delete the output folder first")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--install", action="store_true",
                        help="then make the SFT+DGRPO model mmagent's built-in default (mmagent/assets/toy_policy)")
    args = parser.parse_args(argv)
    if args.install and args.preset != "full":
        parser.error(f"--install needs the full preset: a --preset {args.preset} model has only learned "
                     f"{', '.join(PRESETS[args.preset].families)}, and the built-in model answers every family")
    if args.fresh and Path(args.out).exists():
        shutil.rmtree(args.out)
    sizes = PRESETS[args.preset]
    results = run_recipe(args.out, quick(sizes) if args.quick else sizes, device=args.device,
                         progress=not args.quiet)
    print(synth.format_table(results["scores"]))
    print(f"training time: {results['training_s'] / 60:.1f} min")
    if args.install:
        print(f"installed the built-in model at {install_default(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
