"""Vision pre-training: labelled images that are true of their pixels, a tower that learns to name them, and
the optimizer's separate rate for the vision tower."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mmagent.eval.synth.drills import LABELLED, NONE, image_heads, make_round
from mmagent.eval.synth.families import SynthConfig
from mmagent.eval.synth.perception import blob_colour, classify_shape, find_shape, frame_colour, read_label_sharp
from mmagent.eval.synth import render
from mmagent.eval.synth.render import SHAPES

CFG = SynthConfig()


def test_every_labelled_round_labels_each_image_with_known_classes() -> None:
    heads = image_heads()
    rng = np.random.default_rng(5)
    for kind in LABELLED:
        for _ in range(3):
            r = make_round(kind, rng)
            labels = r.meta["images"]
            assert len(labels) == len(r.observation.images) >= 1, kind
            for lab in labels:
                assert lab and all(value in heads[name] for name, value in lab.items()), (kind, lab)


def test_frame_labels_are_what_the_frames_show() -> None:
    rng = np.random.default_rng(11)
    checked = blank = 0
    for _ in range(6):
        r = make_round("frames", rng)
        for image, lab in zip(r.observation.images, r.meta["images"]):
            arr = np.asarray(image)[:96]  # above the time stamp
            mask = find_shape(arr)
            if lab["shape"] == NONE:
                assert mask is None
                blank += 1
                continue
            assert mask is not None
            assert blob_colour(arr, mask) == lab["colour"]
            assert classify_shape(mask, SHAPES) == lab["shape"]
            checked += 1
    assert checked >= 30 and blank >= 1


def test_screen_tag_and_sign_labels_are_what_the_images_show() -> None:
    rng = np.random.default_rng(12)
    for _ in range(3):
        r = make_round("screen", rng)
        for image, lab in zip(r.observation.images, r.meta["images"]):
            assert frame_colour(image) == lab["screen"]
    heads = image_heads()
    for kind, head in (("tag", "digit"), ("sign", "sign")):
        for _ in range(3):
            r = make_round(kind, rng)
            obs = r.observation
            zoomed = obs.images[0]
            bx1, by1, bx2, by2 = obs.data["box_source"]
            sx, sy = zoomed.width / (bx2 - bx1), zoomed.height / (by2 - by1)
            x, y, w, h = r.meta["label_box"]
            box = ((x - bx1) * sx, (y - by1) * sy, (x + w - bx1) * sx, (y + h - by1) * sy)
            read, _ = read_label_sharp(zoomed, box, (w, h), list(heads[head]), tuple(r.meta["background"]))
            assert read == r.meta["images"][0][head], kind


def test_glyph_crops_show_the_character_they_are_labelled_with() -> None:
    """Every lone-character crop reads back (template matching on its pixels) as its label, among all 36;
    ``digit_glyph`` crops hold digits only."""
    from mmagent.eval.synth.drills import GLYPH_CHARS, GLYPH_SIDE

    rng = np.random.default_rng(13)
    for kind in ("digit_glyph", "glyph"):
        read_right = 0
        for _ in range(3):
            r = make_round(kind, rng)
            assert len(r.observation.images) == 16
            for image, lab, where in zip(r.observation.images, r.meta["images"], r.meta["labels"]):
                assert image.size == (GLYPH_SIDE, GLYPH_SIDE)
                read, _ = read_label_sharp(image, tuple(where["box"]), render.label_size(1), list(GLYPH_CHARS),
                                           tuple(where["background"]))
                read_right += read == lab["glyph"]
                assert kind == "glyph" or lab["glyph"].isdigit()
        assert read_right == 48, kind


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmagent.tiny import build_tiny_qwen2_5_vl

    path = tmp_path_factory.mktemp("vision") / "random"
    build_tiny_qwen2_5_vl(path, seed=0, hidden_size=64, num_layers=2, vision_width=32)
    (path / "mmagent.json").write_text(json.dumps({"media_budget": CFG.media_budget().__dict__}))
    return path


def test_the_tower_learns_screen_colours_and_nothing_else_changes(random_model: Path, tmp_path: Path) -> None:
    """Fifteen steps of screens (32 frames a step): the heads name a screen's colour on fresh rounds far above
    chance (1/7); only the vision tower and merger moved; the saved model loads."""
    from transformers import AutoModelForImageTextToText

    from mmagent.training.vision_pretrain import VisionPretrainConfig, vision_pretrain

    cfg = VisionPretrainConfig(model=str(random_model), output_dir=str(tmp_path / "out"), steps=15,
                               rounds_per_step=4, lr=1e-2, mix={"screen": 1.0}, phases=())
    result = vision_pretrain(cfg, progress=False)
    assert result["accuracy"]["screen"] >= 0.9, result
    before = AutoModelForImageTextToText.from_pretrained(random_model).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(tmp_path / "out").state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(".visual." in f".{k}" for k in moved)
    assert any("merger" in k for k in moved) and any("blocks.0." in k for k in moved)
    saved = json.loads((tmp_path / "out" / "mmagent.json").read_text())
    assert saved["vision"]["accuracy"] == result["accuracy"]
    with pytest.raises(ValueError, match="without image labels"):
        vision_pretrain(VisionPretrainConfig(model=str(random_model), mix={"where": 1.0}), progress=False)


def test_the_rate_holds_then_decays() -> None:
    from mmagent.training.pretrain import warmup_then_decay

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_then_decay(opt, 100, hold=0.5)
    rates = []
    for _ in range(100):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] == pytest.approx(0.1) and rates[9] == rates[49] == 1.0  # ten warm-up steps, then held
    assert rates[75] == pytest.approx(0.5) and rates[99] == pytest.approx(0.05)
    plain = warmup_then_decay(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 100)
    assert plain.lr_lambdas[0](50) == pytest.approx(0.5)  # hold=0: the decay starts at once, as before


def test_the_vision_tower_gets_its_own_learning_rate(random_model: Path) -> None:
    from transformers import AutoModelForImageTextToText

    from mmagent.training.common import parameter_groups

    model = AutoModelForImageTextToText.from_pretrained(random_model)
    one = parameter_groups(model, 1e-3)
    assert len(one) == 1 and len(one[0]["params"]) == len(list(model.parameters()))
    text, vision = parameter_groups(model, 1e-3, 3e-4)
    assert (text["lr"], vision["lr"]) == (1e-3, 3e-4)
    assert {id(p) for p in vision["params"]} == {id(p) for p in model.model.visual.parameters()}
    assert len(text["params"]) + len(vision["params"]) == len(list(model.parameters()))
    opt = torch.optim.AdamW(parameter_groups(model, 1e-3, 3e-4), lr=1e-3)
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 3e-4]


def test_images_without_labels_are_refused(random_model: Path) -> None:
    from mmagent.training.common import load_policy
    from mmagent.training.vision_pretrain import _images_and_labels

    r = make_round("tag", np.random.default_rng(0))
    r.meta["images"] = []
    with pytest.raises(ValueError, match="labels 0 of its 1 images"):
        _images_and_labels(load_policy(str(random_model)), [r])
