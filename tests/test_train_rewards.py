"""One scorer per task: the RL task reward is the task's own benchmark score, for every benchmark folder.

Tasks come from each benchmark's real loader on the tiny release-format folders the benchmark tests build.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import test_bench_charades as charades_release
import test_bench_geo as geo_release
import test_bench_videomme as videomme_release
import test_bench_vstar as vstar_release

from mmagent.eval import registry
from mmagent.eval.benchmarks import charades_sta, generic, geo, synth, videomme, vstar
from mmagent.eval.metrics import extract_option_letter
from mmagent.trajectory import Task, Trajectory, Turn
from mmagent.training.config import ConfigError, load_config
from mmagent.training.rewards import RewardConfig, geolocation_reward, reward_parts, task_reward
from mmagent.training.rl import RLConfig, load_tasks


def episode(task: Task, answer: str | None) -> Trajectory:
    """An episode that ended with ``answer`` after no tool calls."""
    turns = [Turn("assistant", f"<answer>{answer}</answer>")] if answer is not None else []
    stop = "answer" if answer is not None else "max_turns"
    return Trajectory(task=task, turns=turns, answer=answer, stop_reason=stop)


# ----- geolocation: a real-format item's answer is a dict, and it still earns its score -----------------------------


@pytest.fixture(scope="module")
def paris(tmp_path_factory: pytest.TempPathFactory) -> Task:
    """The Paris photo of a tiny IM2GPS3K release (true point 48.8566, 2.3522)."""
    tasks = geo.load(geo_release.im2gps3k(tmp_path_factory.mktemp("im2gps3k")))
    assert isinstance(tasks[0].answer, dict) and tasks[0].benchmark == "geo"
    return tasks[0]


def test_a_right_geo_answer_earns_the_task_reward_and_a_wrong_one_none(paris: Task) -> None:
    right = reward_parts(episode(paris, "48.8570, 2.3500"))  # 0.17 km away
    assert right["task"] == 1.0 and right["place"] == 0.0
    assert right["total"] == pytest.approx(1.0 + 0.5)  # + format 0.5 * 1; no call, no bonus
    sydney = reward_parts(episode(paris, "-33.8688, 151.2093"))  # another continent
    assert sydney["task"] == 0.0
    km = geo.score(paris, "-33.8688, 151.2093")["km"]
    assert km == pytest.approx(16960, rel=0.01)
    assert sydney["place"] == pytest.approx(0.2 * math.exp(-km / 1492.7))  # no tier: distance alone, ~2e-6


def test_a_geo_miss_in_the_right_country_beats_one_on_another_continent(paris: Task) -> None:
    lyon = reward_parts(episode(paris, "45.7640, 4.8357"))  # ~390 km: France, another region
    s = geo.score(paris, "45.7640, 4.8357")
    assert (s["score"], s["city"], s["region"], s["country"]) == (0.0, False, False, True)
    assert lyon["task"] == 0.0
    assert lyon["place"] == pytest.approx(geolocation_reward(s)) == pytest.approx(
        0.8 * 0.25 + 0.2 * math.exp(-s["km"] / 1492.7))
    sydney = reward_parts(episode(paris, "-33.8688, 151.2093"))
    assert lyon["place"] > 0.2 > sydney["place"] and lyon["total"] > sydney["total"]
    off = RewardConfig(place_weight=0.0)
    assert reward_parts(episode(paris, "45.7640, 4.8357"), off)["total"] == pytest.approx(0.5)  # format only


def test_a_geobench_item_is_scored_the_same_way(tmp_path: Path) -> None:
    root = geo_release.geobench(tmp_path, [geo_release.gb_row("u1", 35.6762, 139.6503, city="Tokyo",
                                                              country="Japan")])
    (tokyo,) = geo.load(root)
    assert task_reward(episode(tokyo, "35.68, 139.65")) == 1.0
    assert task_reward(episode(tokyo, "48.8566, 2.3522")) == 0.0


# ----- Video-MME: the reward reads the letter by the official rule, as eval does ------------------------------------


def test_the_videomme_reward_reads_the_letter_by_the_official_rule(tmp_path: Path) -> None:
    rows = [videomme_release.row("001-1", "vidA", answer="C"), videomme_release.row("001-2", "vidA", answer="B")]
    says_c, says_b = videomme.load(videomme_release.release(tmp_path, rows))
    text = "Best answer: C"
    # the official rule's missing comma leaves "Best answer:" in place, so it reads the B of "Best"
    assert extract_option_letter(text, official=True) == "B" and extract_option_letter(text, official=False) == "C"
    assert videomme.score(says_c, text)["score"] == reward_parts(episode(says_c, text))["task"] == 0.0
    assert videomme.score(says_b, text)["score"] == reward_parts(episode(says_b, text))["task"] == 1.0


# ----- every benchmark folder can be RL prompts ---------------------------------------------------------------------


def _right_and_wrong(task: Task) -> tuple[str, str]:
    if task.task_type == "grounding":
        start, end = task.answer
        return f"{start} - {end}", f"{end + 100} - {end + 110}"
    if task.task_type == "geolocation":
        lat, lon = task.answer["lat"], task.answer["lon"]
        return f"{lat}, {lon}", f"{-lat:.4f}, {lon + 180 if lon < 0 else lon - 180:.4f}"  # the antipode
    wrong = next(o[0] for o in task.options if o[0] != task.answer)
    return task.answer, wrong


def _folder(name: str, root: Path) -> Path:
    if name == "videomme":
        return videomme_release.release(root, [videomme_release.row("001-1", "vidA", answer="C"),
                                               videomme_release.row("002-1", "vidB", answer="A")])
    if name == "charades_sta":
        return charades_release.release(root)
    if name == "geo":
        return geo_release.im2gps3k(root)
    if name == "vstar":
        return vstar_release.release(root)
    synth.build(root, per_family=1, seed=0, progress=False)
    return root


MODULES = {"videomme": videomme, "charades_sta": charades_sta, "geo": geo, "vstar": vstar, "synth": synth}


@pytest.mark.parametrize("name", list(MODULES))
def test_every_benchmark_folder_can_be_rl_prompts_scored_by_its_own_score(name: str, tmp_path: Path) -> None:
    root = _folder(name, tmp_path / name)
    tasks = load_tasks(str(root), bench=name)
    assert tasks == MODULES[name].load(root) and {t.benchmark for t in tasks} == {name}
    for task in tasks:
        right, wrong = _right_and_wrong(task)
        for answer, expected in ((right, 1.0), (wrong, 0.0)):
            own = MODULES[name].score(task, answer)["score"]
            assert own == pytest.approx(expected), (task.id, answer)
            assert reward_parts(episode(task, answer))["task"] == own, (task.id, answer)
            assert registry.score(task, answer) == MODULES[name].score(task, answer)


def test_a_toy_world_folder_written_before_task_benchmark_loads_as_synth(tmp_path: Path) -> None:
    synth.build(tmp_path, per_family=1, seed=0, families=["image_qa"], progress=False)
    path = tmp_path / synth.TASKS_FILE
    lines = path.read_text().splitlines()
    assert all('"benchmark": "synth"' in line for line in lines)
    path.write_text("".join(line.replace(', "benchmark": "synth"', "") + "\n" for line in lines))
    assert "benchmark" not in path.read_text()
    (task,) = synth.load(tmp_path)
    assert task.benchmark == "synth" and task_reward(episode(task, task.answer)) == 1.0


def test_load_tasks_takes_families_only_for_the_toy_world(tmp_path: Path) -> None:
    root = _folder("synth", tmp_path / "toy")
    assert {t.task_type for t in load_tasks(str(root), ["grounding"])} == {"grounding"}
    with pytest.raises(ValueError, match="families .* needs bench=synth, not bench=vstar"):
        load_tasks(str(tmp_path), ["image_qa"], bench="vstar")
    with pytest.raises(ValueError, match="unknown bench 'mmmu'; use one of synth, videomme"):
        load_tasks(str(tmp_path), bench="mmmu")
    with pytest.raises(ConfigError, match="needs bench=synth, not bench=geo"):
        load_config(RLConfig, None, ["bench=geo", "families=[geolocation]"])
    assert load_config(RLConfig, None, ["bench=videomme", "data=./Video-MME"]).bench == "videomme"


# ----- the registry's one dispatch ----------------------------------------------------------------------------------


def test_a_task_of_your_own_is_scored_by_the_generic_rule() -> None:
    mcq = Task("Which colour?", task_type="video_qa", options=["A. red", "B. blue"], answer="B")
    assert registry.score(mcq, "The best option is B")["score"] == 1.0
    assert registry.score(mcq, "A")["score"] == 0.0
    when = Task("When?", task_type="grounding", answer=[2.0, 6.0])
    assert registry.score(when, "from 3 to 7 s")["score"] == pytest.approx(0.6)  # overlap 3 s over 5 s
    assert registry.score(Task("Say hi", answer="Hello"), " hello ")["score"] == 1.0
    assert registry.score(Task("Where?", task_type="geolocation", answer={"lat": 1.0}), "1, 2")["score"] == 0.0
    assert registry.score(mcq, None) == generic.score(mcq, None) == {"score": 0.0, "pred": None}
    assert "generic" not in registry.names()


def test_an_unknown_benchmark_name_is_refused_with_the_known_ones() -> None:
    task = Task("Q?", id="q7", answer="A", benchmark="mmmu")
    with pytest.raises(registry.UnknownBenchmark) as err:
        registry.score(task, "A")
    assert str(err.value).startswith("task 'q7' names an unknown benchmark 'mmmu'; known: synth, videomme")
