"""Media I/O: every video backend answers in seconds with the right frames; images; episode handles."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmagent import media as media_mod
from mmagent.media import BACKENDS, EpisodeMedia, MediaError, frames_to_array, load_image, open_video
from mmagent.tiny import write_synthetic_video
from mmagent.toolbox import ToolError

RED, GREEN, BLUE, YELLOW = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)
COLORS = [RED, GREEN, BLUE, YELLOW]
FPS, SECONDS, W, H = 8, 4.0, 96, 64
N = int(SECONDS * FPS)  # 32 frames, 8 per colour segment
TOL = 40  # codec tolerance per channel


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """4 s, 8 fps, 96x64: red, green, blue, yellow for one second each."""
    return write_synthetic_video(tmp_path_factory.mktemp("media") / "clip.mp4", seconds=SECONDS, fps=FPS,
                                 size=(W, H), colors=COLORS)


def corner_colour(image: Image.Image) -> np.ndarray:
    """Mean RGB of a patch in the top-left area, away from the moving square and the counter text."""
    return np.asarray(image.convert("RGB"))[2:10, 2:12].reshape(-1, 3).mean(0)


def expected_colour(index: int) -> tuple[int, int, int]:
    return COLORS[index * len(COLORS) // N]


def square_frame_index(image: Image.Image) -> int:
    """Which frame this is, from the position of the white square in the middle row (x = 84*i/31)."""
    row = np.asarray(image.convert("RGB")).astype(int)[H // 2]
    white = np.where((row > 200).all(axis=1))[0]
    left = (white.min() + white.max() + 1) / 2 - 6
    return int(np.argmin(np.abs(np.array([(W - 12) * i / (N - 1) for i in range(N)]) - left)))


def assert_colour(image, rgb):
    got = corner_colour(image)
    assert np.all(np.abs(got - np.array(rgb)) <= TOL), f"expected ~{rgb}, got {got.round()}"


# ----- readers -------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=BACKENDS)
def reader(request, clip):
    r = open_video(clip, backends=(request.param,))
    yield r
    r.close()


def test_reader_metadata(reader):
    assert reader.backend in BACKENDS
    assert reader.fps == pytest.approx(8.0)
    assert reader.num_frames == 32
    assert reader.duration == pytest.approx(4.0)
    assert (reader.width, reader.height) == (96, 64)


def test_open_video_uses_the_requested_backend(clip):
    for name in BACKENDS:
        r = open_video(clip, backends=(name,))
        assert r.backend == name
        r.close()


@pytest.mark.parametrize("t,index", [(0.0, 0), (0.5, 4), (0.99, 7), (1.0, 8), (1.5, 12), (2.6, 20),
                                     (3.2, 25), (3.99, 31)])
def test_frames_at_returns_frame_on_screen(reader, t, index):
    (frame,) = reader.frames_at([t])
    assert frame.timestamp == pytest.approx(index / 8)
    assert 0 <= t - frame.timestamp < 1 / 8
    assert frame.image.size == (96, 64) and frame.image.mode == "RGB"
    assert_colour(frame.image, expected_colour(index))
    assert square_frame_index(frame.image) == index


def test_frames_at_keeps_requested_order_and_duplicates(reader):
    times = [3.5, 0.25, 2.0, 0.25, 1.125]
    frames = reader.frames_at(times)
    assert [f.timestamp for f in frames] == pytest.approx([3.5, 0.25, 2.0, 0.25, 1.125])
    assert [square_frame_index(f.image) for f in frames] == [28, 2, 16, 2, 9]
    for f, rgb in zip(frames, [YELLOW, RED, BLUE, RED, GREEN]):
        assert_colour(f.image, rgb)


def test_every_frame_in_shuffled_order(reader):
    order = list(np.random.default_rng(0).permutation(N))
    frames = reader.frames_at([i / FPS + 0.01 for i in order])
    assert [square_frame_index(f.image) for f in frames] == order
    assert [round(f.timestamp * FPS) for f in frames] == order


def test_frames_at_clamps_outside_times(reader):
    before, after = reader.frames_at([-2.0, 10.0])
    assert before.timestamp == 0.0 and after.timestamp == pytest.approx(31 / 8)
    assert_colour(before.image, RED)
    assert_colour(after.image, YELLOW)


def test_frames_at_empty(reader):
    assert reader.frames_at([]) == []


@pytest.mark.parametrize("n,times", [(1, [2.0]), (4, [0.5, 1.5, 2.5, 3.5]),
                                     (5, [0.375, 1.125, 2.0, 2.75, 3.5])])
def test_sample_uniform(reader, n, times):
    frames = reader.sample_uniform(n)
    ts = [f.timestamp for f in frames]
    assert len(frames) == n
    assert ts == pytest.approx(times)
    assert all(a < b for a, b in zip(ts, ts[1:]))
    if n == 4:  # one frame per colour segment
        for f, rgb in zip(frames, COLORS):
            assert_colour(f.image, rgb)


def test_frames_to_array(reader):
    arr = frames_to_array(reader.frames_at([0.0, 1.0, 2.0]))
    assert arr.shape == (3, 64, 96, 3) and arr.dtype == np.uint8


def test_index_at(reader):
    assert [reader.index_at(t) for t in (-1, 0, 0.124, 0.125, 3.875, 100)] == [0, 0, 0, 1, 31, 31]


# ----- open_video errors ----------------------------------------------------------------------------
def test_missing_video(tmp_path):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(MediaError, match="video not found") as exc:
        open_video(missing)
    assert str(missing) in str(exc.value)


def test_empty_video(tmp_path):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    with pytest.raises(MediaError, match="empty") as exc:
        open_video(empty)
    assert str(empty) in str(exc.value)


@pytest.mark.parametrize("backends", [(name,) for name in BACKENDS] + [BACKENDS])
def test_garbage_video_names_file_and_each_backend(tmp_path, backends):
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with pytest.raises(MediaError) as exc:
        open_video(garbage, backends=backends)
    msg = str(exc.value)
    assert msg.startswith(f"cannot read video {garbage}: ")
    for name in backends:
        assert f"{name}: " in msg


def test_unknown_backend(clip):
    with pytest.raises(ValueError, match="unknown video backend 'vlc'; choose from decord, pyav, opencv"):
        open_video(clip, backends=("vlc",))


def test_fallback_to_next_backend(clip, monkeypatch):
    """A backend that fails to open is skipped, and the next one is used."""
    class Broken(media_mod.VideoReader):
        def __init__(self, path):
            raise RuntimeError("boom")

    monkeypatch.setitem(media_mod._READERS, "decord", Broken)
    r = open_video(clip, backends=("decord", "opencv"))
    assert r.backend == "opencv"
    r.close()


# ----- images -------------------------------------------------------------------------------------
def test_load_image_rgba_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (4, 2), (0, 0, 255, 0))
    rgba.putpixel((1, 0), (255, 0, 0, 255))
    rgba.putpixel((2, 0), (0, 0, 0, 128))
    for source in (rgba, tmp_path / "a.png"):
        if isinstance(source, Path):
            rgba.save(source)
        im = load_image(source)
        assert im.mode == "RGB" and im.size == (4, 2)
        assert im.getpixel((0, 0)) == (255, 255, 255)  # fully transparent -> white
        assert im.getpixel((1, 0)) == (255, 0, 0)  # opaque -> its colour
        assert all(abs(c - 127) <= 1 for c in im.getpixel((2, 0)))  # half black on white -> grey


def test_load_image_palette_with_transparency(tmp_path):
    p = Image.new("P", (2, 1))
    p.putpalette([0, 255, 0, 10, 20, 30] + [0] * 762)
    p.putpixel((0, 0), 0)
    p.putpixel((1, 0), 1)
    p.info["transparency"] = 1
    path = tmp_path / "p.png"
    p.save(path, transparency=1)
    im = load_image(path)
    assert im.mode == "RGB" and im.getpixel((0, 0)) == (0, 255, 0) and im.getpixel((1, 0)) == (255, 255, 255)


def test_load_image_converts_grey_and_keeps_pixels(tmp_path):
    grey = Image.new("L", (3, 3), 77)
    path = tmp_path / "g.jpg"
    Image.new("RGB", (5, 4), (10, 200, 30)).save(tmp_path / "c.png")
    assert load_image(grey).getpixel((1, 1)) == (77, 77, 77)
    assert load_image(str(tmp_path / "c.png")).getpixel((4, 3)) == (10, 200, 30)
    grey.save(path)
    assert load_image(path).mode == "RGB"


def test_load_image_missing_and_corrupt(tmp_path):
    with pytest.raises(MediaError, match="image not found") as exc:
        load_image(tmp_path / "missing.png")
    assert "missing.png" in str(exc.value)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image at all")
    with pytest.raises(MediaError, match="cannot read image") as exc:
        load_image(bad)
    assert str(bad) in str(exc.value)
    with pytest.raises(MediaError, match="image not found"):
        load_image(tmp_path)  # a directory is not a file


def test_load_image_refuses_oversized(tmp_path, monkeypatch):
    monkeypatch.setattr(media_mod, "MAX_IMAGE_PIXELS", 100)
    path = tmp_path / "big.png"
    Image.new("RGB", (20, 10)).save(path)
    with pytest.raises(MediaError, match="20x10 is over 100 pixels"):
        load_image(path)
    with pytest.raises(MediaError, match="image of 20x10 is over 100 pixels"):
        load_image(Image.new("RGB", (20, 10)))
    assert load_image(Image.new("RGB", (10, 10))).size == (10, 10)


# ----- EpisodeMedia ---------------------------------------------------------------------------------
def test_episode_video_opened_lazily_once(clip):
    m = EpisodeMedia(video=clip)
    assert m._video is None and m.video_path == str(clip)
    v = m.video
    assert v is m.video and v.num_frames == 32
    m.close()
    assert m._video is None


def test_episode_without_media():
    m = EpisodeMedia()
    assert m.video is None and m.image is None
    with pytest.raises(ToolError, match="this episode has no image"):
        m.resolve_image("image")
    with pytest.raises(ToolError, match="this episode has no video"):
        m.resolve_image("frame@1.0")


def test_episode_missing_video_raises_media_error_on_access(tmp_path):
    m = EpisodeMedia(video=tmp_path / "gone.mp4")
    with pytest.raises(MediaError, match="gone.mp4"):
        m.video


def test_image_handle_and_view_size():
    img = Image.new("RGBA", (40, 30), (0, 255, 0, 255))
    m = EpisodeMedia(image=img)
    assert m.resolve_image("image").mode == "RGB" and m.resolve_image("image").getpixel((0, 0)) == (0, 255, 0)
    assert m.resolve_image("  image ").size == (40, 30)
    assert m.view_size("image") == (40, 30)
    m.set_view_size("image", (20.0, 15.9))
    assert m.view_size("image") == (20, 15)


def test_view_size_ignores_surrounding_whitespace_like_resolve_image(clip):
    """resolve_image strips the handle, so view_size must find the recorded size for the same handle."""
    m = EpisodeMedia(video=clip, image=Image.new("RGB", (40, 30)))
    m.set_view_size("image", (20, 15))
    m.set_view_size("video", (48, 32))
    assert m.view_size(" image ") == (20, 15)
    assert m.view_size(" frame@1.5 ") == (48, 32)
    m.close()


def test_frame_handles(clip):
    m = EpisodeMedia(video=clip)
    for handle, rgb, index in [("frame@1.5", GREEN, 12), ("frame@0", RED, 0), ("frame@2.5s", BLUE, 20),
                               ("frame@4.0", YELLOW, 31), ("frame@3", YELLOW, 24)]:
        im = m.resolve_image(handle)
        assert im.size == (96, 64)
        assert_colour(im, rgb)
        assert square_frame_index(im) == index
    assert m.view_size("frame@1.5") == (96, 64)
    m.set_view_size("video", (48, 32))
    assert m.view_size("frame@1.5") == (48, 32) and m.view_size("frame@0.25s") == (48, 32)
    m.close()


@pytest.mark.parametrize("handle,message", [
    ("frame@4.5", "frame time 4.50s is outside the video (0.00s to 4.00s)"),
    ("frame@-1", "frame time -1.00s is outside the video (0.00s to 4.00s)"),
])
def test_frame_handle_out_of_range(clip, handle, message):
    m = EpisodeMedia(video=clip)
    with pytest.raises(ToolError) as exc:
        m.resolve_image(handle)
    assert str(exc.value) == message
    m.close()


def test_observation_handles():
    m = EpisodeMedia()
    with pytest.raises(ToolError, match="no image obs:1; no tool has returned an image yet"):
        m.resolve_image("obs:1")
    a, b, c = (Image.new("RGB", (8 + k, 8), (k * 100, 0, 0)) for k in range(3))
    assert m.add_observation_images([a, b]) == ["obs:1", "obs:2"]
    assert m.add_observation_images([c]) == ["obs:3"]
    assert m.add_observation_images([]) == []
    assert m.resolve_image("obs:1") is a and m.resolve_image("obs:3") is c
    assert m.view_size("obs:2") == (9, 8)
    m.set_view_size("obs:2", (18, 16))
    assert m.view_size("obs:2") == (18, 16) and m.view_size("obs:1") == (8, 8)
    for bad in ("obs:0", "obs:4"):
        with pytest.raises(ToolError) as exc:
            m.resolve_image(bad)
        assert str(exc.value) == f"no image {bad}; tool images so far: obs:1 to obs:3"


@pytest.mark.parametrize("handle", ["video", "img", "frame@abc", "frame@", "obs:x", "obs:-1", "/etc/passwd",
                                    "frame@1e3"])
def test_unknown_handles(handle):
    m = EpisodeMedia(image=Image.new("RGB", (4, 4)))
    with pytest.raises(ToolError) as exc:
        m.resolve_image(handle)
    assert str(exc.value) == f"unknown image handle {handle!r}; use 'image', 'frame@<seconds>' or 'obs:<n>'"


def test_non_string_handle():
    with pytest.raises(ToolError, match="must be a string"):
        EpisodeMedia().resolve_image(3)


def test_episode_image_from_path(tmp_path):
    path = tmp_path / "x.png"
    Image.new("RGB", (7, 5), (1, 2, 3)).save(path)
    m = EpisodeMedia(image=str(path))
    assert m.image.size == (7, 5) and m.resolve_image("image").getpixel((6, 4)) == (1, 2, 3)
    with pytest.raises(MediaError, match="image not found"):
        EpisodeMedia(image=os.fspath(tmp_path / "none.png"))
