"""resample_frames and zoom called as the agent calls them, on real media; plus the tool registry."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmagent.media import EpisodeMedia
from mmagent.tiny import write_synthetic_video
from mmagent.toolbox import Observation, Tool, ToolError, available_tools, create_tool, register, resolve_tools
from mmagent.toolbox.frames import ResampleFrames, stamp_time, window_times
from mmagent.toolbox.zoom import Zoom, expand_box

RED, GREEN, BLUE, YELLOW = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0)
TOL = 40


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """4 s, 8 fps, 96x64: red, green, blue, yellow for one second each."""
    return write_synthetic_video(tmp_path_factory.mktemp("tools") / "clip.mp4", seconds=4.0, fps=8,
                                 size=(96, 64), colors=[RED, GREEN, BLUE, YELLOW])


@pytest.fixture
def video_ctx(clip):
    ctx = EpisodeMedia(video=clip)
    yield ctx
    ctx.close()


def quadrants(w: int = 200, h: int = 100) -> Image.Image:
    """Top-left red, top-right green, bottom-left blue, bottom-right yellow."""
    im = Image.new("RGB", (w, h))
    for x, y, c in [(0, 0, RED), (w // 2, 0, GREEN), (0, h // 2, BLUE), (w // 2, h // 2, YELLOW)]:
        im.paste(c, (x, y, x + w // 2, y + h // 2))
    return im


def patch_colour(image: Image.Image, ys: slice, xs: slice) -> np.ndarray:
    return np.asarray(image.convert("RGB"))[ys, xs].reshape(-1, 3).mean(0)


def close_to(got, rgb, tol=TOL) -> bool:
    return bool(np.all(np.abs(np.asarray(got) - np.array(rgb)) <= tol))


def top_right(image):
    """Away from the timestamp stamp (top-left), the moving square (middle rows) and the counter (bottom-left)."""
    return patch_colour(image, slice(2, 10), slice(84, 94))


# ----- resample_frames ------------------------------------------------------------------------------
def test_resample_window_inside_one_segment(video_ctx):
    obs = create_tool("resample_frames")({"start": 1, "end": 2}, video_ctx)
    assert isinstance(obs, Observation) and not obs.is_error
    assert obs.text == ("Video clip from 1.00 to 2.00 seconds: 4 frames at 1.12s, 1.38s, 1.62s, 1.88s "
                        "(times are seconds from the start of the video).")
    assert len(obs.images) == 4 and obs.image_labels == ["1.12s", "1.38s", "1.62s", "1.88s"]
    assert obs.data == {"start": 1.0, "end": 2.0, "timestamps": [1.125, 1.375, 1.625, 1.875]}
    for im in obs.images:
        assert im.size == (96, 64)
        assert close_to(top_right(im), GREEN)


def test_resample_frames_come_from_their_times(video_ctx):
    obs = ResampleFrames()({"start": 0.0, "end": 4.0, "num_frames": 4}, video_ctx)
    assert obs.data["timestamps"] == [0.5, 1.5, 2.5, 3.5]
    assert obs.image_labels == ["0.50s", "1.50s", "2.50s", "3.50s"]
    for im, rgb in zip(obs.images, [RED, GREEN, BLUE, YELLOW]):
        assert close_to(top_right(im), rgb)


def test_resample_draws_timestamp_in_top_left(video_ctx):
    stamped = ResampleFrames()({"start": 0, "end": 1, "num_frames": 1}, video_ctx).images[0]
    plain = ResampleFrames(draw_timestamps=False)({"start": 0, "end": 1, "num_frames": 1}, video_ctx).images[0]
    assert stamped.getpixel((0, 0)) == (0, 0, 0)  # the black label box
    assert np.asarray(stamped).astype(int)[:12, :40].max() == 255  # white text inside it
    assert close_to(plain.getpixel((1, 1)), RED)
    assert close_to(top_right(stamped), top_right(plain), tol=1)  # the rest of the frame is untouched


def test_stamp_time_returns_copy():
    im = Image.new("RGB", (96, 64), RED)
    out = stamp_time(im, 12.5)
    assert im.getpixel((0, 0)) == RED and out.getpixel((0, 0)) == (0, 0, 0) and out.size == im.size


def test_window_times_are_slice_centres():
    assert window_times(0, 4, 4) == [0.5, 1.5, 2.5, 3.5]
    assert window_times(10, 11, 1) == [10.5]
    assert window_times(1, 2, 2) == [1.25, 1.75]


def test_resample_clamps_window_and_says_so(video_ctx):
    obs = ResampleFrames()({"start": -1, "end": 10, "num_frames": 2}, video_ctx)
    assert obs.text == ("Video clip from 0.00 to 4.00 seconds: 2 frames at 1.00s, 3.00s (times are seconds from "
                        "the start of the video). Note: start -1.00s clamped to 0.00s; end 10.00s clamped to the "
                        "video duration 4.00s.")
    assert obs.data["start"] == 0.0 and obs.data["end"] == 4.0
    assert close_to(top_right(obs.images[0]), GREEN) and close_to(top_right(obs.images[1]), YELLOW)


def test_resample_default_num_frames_follows_max_frames(video_ctx):
    tool = create_tool("resample_frames", max_frames=2)
    props = tool.schema()["function"]["parameters"]["properties"]
    assert props["num_frames"]["maximum"] == 2 and "default 2" in props["num_frames"]["description"]
    assert len(tool({"start": 0, "end": 4}, video_ctx).images) == 2
    assert len(create_tool("resample_frames")({"start": 0, "end": 4}, video_ctx).images) == 4
    with pytest.raises(ValueError, match="max_frames must be >= 1"):
        ResampleFrames(max_frames=0)


@pytest.mark.parametrize("args,message", [
    ({"start": 4.0, "end": 5.0}, "start=4.00s is at or past the end of the video (4.00s)"),
    ({"start": 9, "end": 12}, "start=9.00s is at or past the end of the video (4.00s)"),
    ({"start": -3, "end": 0}, "end=0.00s is at or before the start of the video (0.00s)"),
    ({"start": 1, "end": 1.05},
     "the window must be at least 0.10s long with start < end (got start=1.00s, end=1.05s)"),
    ({"start": 3, "end": 1}, "the window must be at least 0.10s long with start < end (got start=3.00s, end=1.00s)"),
    ({"start": 3.95, "end": 9}, "the window must be at least 0.10s long with start < end (got start=3.95s, end=4.00s)"),
    ({"start": float("nan"), "end": 2}, "start and end must be finite numbers of seconds"),
    ({"start": 0, "end": float("inf")}, "start and end must be finite numbers of seconds"),
])
def test_resample_refuses_bad_windows(video_ctx, args, message):
    with pytest.raises(ToolError) as exc:
        ResampleFrames()(args, video_ctx)
    assert str(exc.value) == message


def test_resample_needs_a_video():
    with pytest.raises(ToolError, match="this episode has no video; resample_frames needs one"):
        ResampleFrames()({"start": 0, "end": 1}, EpisodeMedia(image=Image.new("RGB", (8, 8))))


@pytest.mark.parametrize("args,fragment", [
    ({"start": 0, "end": 1, "fps": 2}, "arguments: Additional properties are not allowed ('fps' was unexpected)"),
    ({"start": "0", "end": 1}, "start: '0' is not of type 'number'"),
    ({"start": True, "end": 1}, "start: True is not of type 'number'"),
    ({"start": 0, "end": 1, "num_frames": 2.5}, "num_frames: 2.5 is not of type 'integer'"),
    ({"start": 0, "end": 1, "num_frames": "4"}, "num_frames: '4' is not of type 'integer'"),
    ({"start": 0, "end": 1, "num_frames": 0}, "num_frames: 0 is less than the minimum of 1"),
    ({"start": 0, "end": 1, "num_frames": 9}, "num_frames: 9 is greater than the maximum of 8"),
    ({"start": 0}, "arguments: 'end' is a required property"),
])
def test_resample_schema_validation(video_ctx, args, fragment):
    with pytest.raises(ToolError) as exc:
        ResampleFrames()(args, video_ctx)
    assert str(exc.value) == f"invalid arguments for resample_frames: {fragment}"


def test_arguments_must_be_an_object(video_ctx):
    with pytest.raises(ToolError, match="arguments of resample_frames must be a JSON object, got list"):
        ResampleFrames()([0, 1], video_ctx)


# ----- zoom -----------------------------------------------------------------------------------------
@pytest.fixture
def quad_ctx():
    """A 200x100 quadrant image shown to the model at 100x50."""
    ctx = EpisodeMedia(image=quadrants())
    ctx.set_view_size("image", (100, 50))
    return ctx


def test_zoom_maps_view_box_to_source_pixels(quad_ctx):
    obs = Zoom(pad_ratio=0.0)({"bbox": [50, 0, 100, 25]}, quad_ctx)
    assert obs.data == {"source": "image", "box_view": [50, 0, 100, 25], "box_source": [100, 0, 200, 50]}
    assert obs.text == ("Zoomed into image box [50, 0, 100, 25] (pixels of the 100x50 view you saw; "
                        "[100, 0, 200, 50] in the source's own 200x100 pixels).")
    assert obs.image_labels == ["zoom [50, 0, 100, 25] of image"]
    (crop,) = obs.images
    # 100x50 crop upscaled to about 448*448 pixels, same aspect ratio
    assert crop.size == (634, 317)
    arr = np.asarray(crop).reshape(-1, 3).astype(int)
    assert np.abs(arr - np.array(GREEN)).max() <= 2  # the top-right quadrant and nothing else


@pytest.mark.parametrize("bbox,colour", [([0, 0, 50, 25], RED), ([50, 0, 100, 25], GREEN),
                                         ([0, 25, 50, 50], BLUE), ([50, 25, 100, 50], YELLOW)])
def test_zoom_each_quadrant(quad_ctx, bbox, colour):
    crop = Zoom(pad_ratio=0.0)({"bbox": bbox}, quad_ctx).images[0]
    assert close_to(patch_colour(crop, slice(None), slice(None)), colour, tol=2)


def test_zoom_default_padding(quad_ctx):
    obs = create_tool("zoom")({"bbox": [50, 0, 100, 25]}, quad_ctx)
    # 10% padding each side, shifted back inside the image: x 80..200, y 0..60
    assert obs.data["box_source"] == [80, 0, 200, 60] and obs.data["box_view"] == [40, 0, 100, 30]
    crop = obs.images[0]
    cw, ch = crop.size
    assert close_to(crop.getpixel((cw * 3 // 4, ch // 4)), GREEN, tol=2)  # the asked-for region dominates
    assert close_to(crop.getpixel((2, 2)), RED, tol=2)  # the padding shows a bit of the neighbour


def test_zoom_without_view_size_uses_source_pixels():
    ctx = EpisodeMedia(image=quadrants())
    obs = Zoom(pad_ratio=0.0)({"bbox": [100, 50, 200, 100]}, ctx)
    assert obs.data["box_source"] == [100, 50, 200, 100] and obs.data["box_view"] == [100, 50, 200, 100]
    assert close_to(patch_colour(obs.images[0], slice(None), slice(None)), YELLOW, tol=2)


def test_zoom_tiny_box_grows_to_min_side(quad_ctx):
    obs = Zoom(pad_ratio=0.0)({"bbox": [10, 10, 10.2, 10.3]}, quad_ctx)
    x1, y1, x2, y2 = obs.data["box_source"]
    assert 28 <= x2 - x1 <= 29 and 28 <= y2 - y1 <= 29  # min_side_px=28, rounded outwards
    assert x1 <= 20 <= x2 and y1 <= 20 <= y2  # still centred on the asked point (view 10 -> source 20)
    assert obs.images[0].size == (448, 448)
    assert close_to(patch_colour(obs.images[0], slice(None), slice(None)), RED, tol=2)


def test_zoom_min_side_near_corner_is_shifted_inside():
    ctx = EpisodeMedia(image=quadrants())
    obs = Zoom(pad_ratio=0.0)({"bbox": [198, 98, 200, 100]}, ctx)
    assert obs.data["box_source"] == [172, 72, 200, 100]


def test_zoom_clips_box_partly_outside_the_view(quad_ctx):
    obs = Zoom(pad_ratio=0.0)({"bbox": [-20, -20, 30, 10]}, quad_ctx)
    # clipped to [0, 0, 30, 10] in the view -> [0, 0, 60, 20] in source, height grown to 28
    assert obs.data["box_source"] == [0, 0, 60, 28]
    assert close_to(patch_colour(obs.images[0], slice(None), slice(None)), RED, tol=2)


def test_zoom_large_crop_is_not_upscaled():
    big = Image.new("RGB", (1000, 600), BLUE)
    obs = Zoom()({"bbox": [0, 0, 1000, 600]}, EpisodeMedia(image=big))
    assert obs.data["box_source"] == [0, 0, 1000, 600] and obs.images[0].size == (1000, 600)


@pytest.mark.parametrize("bbox,message", [
    ([10, 10, 10, 20], "bbox must have x1 < x2 and y1 < y2, got [10.0, 10.0, 10.0, 20.0]"),
    ([30, 10, 20, 20], "bbox must have x1 < x2 and y1 < y2, got [30.0, 10.0, 20.0, 20.0]"),
    ([0, 20, 10, 5], "bbox must have x1 < x2 and y1 < y2, got [0.0, 20.0, 10.0, 5.0]"),
    ([120, 0, 150, 20], "bbox [120.0, 0.0, 150.0, 20.0] lies outside the 100x50 view of image"),
    ([-30, -30, -1, -1], "bbox [-30.0, -30.0, -1.0, -1.0] lies outside the 100x50 view of image"),
    ([0, 0, float("nan"), 5], "bbox values must be finite numbers"),
])
def test_zoom_degenerate_boxes(quad_ctx, bbox, message):
    with pytest.raises(ToolError) as exc:
        Zoom()({"bbox": bbox}, quad_ctx)
    assert str(exc.value) == message


def test_zoom_refuses_a_too_thin_crop():
    strip = EpisodeMedia(image=Image.new("RGB", (3000, 20), RED))
    with pytest.raises(ToolError, match=r"the crop is too thin \(aspect ratio over 100\)"):
        Zoom()({"bbox": [0, 0, 3000, 20]}, strip)


@pytest.mark.parametrize("args,fragment", [
    ({"bbox": [0, 0, 10]}, "bbox: [0, 0, 10] is too short"),
    ({"bbox": [0, 0, 10, 10, 5]}, "bbox: [0, 0, 10, 10, 5] is too long"),
    ({"bbox": [0, "0", 10, 10]}, "bbox.1: '0' is not of type 'number'"),
    ({"bbox": "0,0,10,10"}, "bbox: '0,0,10,10' is not of type 'array'"),
    ({"bbox": [0, 0, 10, 10], "source": 1}, "source: 1 is not of type 'string'"),
    ({"bbox": [0, 0, 10, 10], "scale": 2}, "arguments: Additional properties are not allowed ('scale' was unexpected)"),
    ({}, "arguments: 'bbox' is a required property"),
])
def test_zoom_schema_validation(quad_ctx, args, fragment):
    with pytest.raises(ToolError) as exc:
        Zoom()(args, quad_ctx)
    assert str(exc.value) == f"invalid arguments for zoom: {fragment}"


def test_zoom_unknown_or_missing_source(quad_ctx):
    with pytest.raises(ToolError, match="unknown image handle 'photo'"):
        Zoom()({"bbox": [0, 0, 10, 10], "source": "photo"}, quad_ctx)
    with pytest.raises(ToolError, match="no image obs:1; no tool has returned an image yet"):
        Zoom()({"bbox": [0, 0, 10, 10], "source": "obs:1"}, quad_ctx)
    with pytest.raises(ToolError, match="this episode has no video"):
        Zoom()({"bbox": [0, 0, 10, 10], "source": "frame@1"}, quad_ctx)


def test_zoom_on_observation_image_with_its_own_view_size():
    ctx = EpisodeMedia()
    (handle,) = ctx.add_observation_images([quadrants(400, 200)])
    ctx.set_view_size(handle, (100, 50))
    obs = Zoom(pad_ratio=0.0)({"bbox": [0, 25, 50, 50], "source": handle}, ctx)
    assert handle == "obs:1" and obs.data["box_source"] == [0, 100, 200, 200]
    assert obs.image_labels == ["zoom [0, 25, 50, 50] of obs:1"]
    assert close_to(patch_colour(obs.images[0], slice(None), slice(None)), BLUE, tol=2)


def test_zoom_on_video_frame_uses_the_video_view_size(video_ctx):
    video_ctx.set_view_size("video", (48, 32))
    obs = Zoom(pad_ratio=0.0)({"bbox": [0, 0, 24, 16], "source": "frame@2.5"}, video_ctx)
    assert obs.data["box_source"] == [0, 0, 48, 32] and "48x32 view" in obs.text
    assert close_to(patch_colour(obs.images[0], slice(5, 60), slice(5, 60)), BLUE)


def test_zoom_source_handle_with_spaces_uses_the_recorded_view_size(quad_ctx):
    """' image ' resolves to the image, so its box must be read in the same 100x50 view as 'image'."""
    obs = Zoom(pad_ratio=0.0)({"bbox": [50, 0, 100, 25], "source": " image "}, quad_ctx)
    assert obs.data["box_source"] == [100, 0, 200, 50]


def test_expand_box_numbers():
    assert expand_box((10, 10, 20, 20), 0, 0.0, 100, 100) == (10, 10, 20, 20)
    assert expand_box((10, 10, 20, 20), 0, 0.5, 100, 100) == (5, 5, 25, 25)
    assert expand_box((0, 0, 10, 10), 28, 0.0, 100, 100) == (0, 0, 28, 28)
    assert expand_box((0, 0, 10, 10), 28, 0.0, 20, 15) == (0, 0, 20, 15)  # never larger than the image


# ----- registry -------------------------------------------------------------------------------------
def test_available_tools_includes_builtins_sorted():
    names = available_tools()
    assert {"resample_frames", "zoom"} <= set(names) and names == sorted(names)


def test_create_tool_returns_configured_instances():
    assert isinstance(create_tool("resample_frames"), ResampleFrames) and isinstance(create_tool("zoom"), Zoom)
    assert create_tool("zoom", min_side_px=10).min_side_px == 10
    assert create_tool("zoom") is not create_tool("zoom")
    schema = create_tool("zoom").schema()
    assert schema["type"] == "function" and schema["function"]["name"] == "zoom"
    assert schema["function"]["parameters"]["required"] == ["bbox"]


def test_create_tool_unknown_name_lists_tools():
    with pytest.raises(KeyError) as exc:
        create_tool("magnify")
    message = exc.value.args[0]
    assert message.startswith("unknown tool 'magnify'; available: ")
    assert "resample_frames" in message and "zoom" in message


def test_resolve_tools():
    custom = Zoom(min_side_px=5)
    tools = resolve_tools(["resample_frames", custom], default=lambda: ["zoom"])
    assert isinstance(tools[0], ResampleFrames) and tools[1] is custom
    assert [t.name for t in resolve_tools(None, default=lambda: ["zoom", "resample_frames"])] == \
        ["zoom", "resample_frames"]
    assert resolve_tools([], default=lambda: ["zoom"]) == []


def test_resolve_tools_duplicates():
    with pytest.raises(ValueError, match=r"duplicate tool names: \['zoom', 'resample_frames', 'zoom'\]"):
        resolve_tools(["zoom", "resample_frames", Zoom()], default=list)
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        resolve_tools(["nope"], default=list)


def test_register_refuses_nameless_and_conflicting_tools():
    class Nameless(Tool):
        def run(self, arguments, context):
            return Observation("")

    class OtherZoom(Tool):
        name = "zoom"

        def run(self, arguments, context):
            return Observation("")

    with pytest.raises(ValueError, match="Nameless has no name"):
        register(Nameless)
    with pytest.raises(ValueError, match="a different tool is already registered as 'zoom'"):
        register(OtherZoom)
    assert register(Zoom) is Zoom  # re-registering the same class is fine
    assert isinstance(create_tool("zoom"), Zoom)


def test_observation_checks_labels():
    with pytest.raises(ValueError, match="one label per image"):
        Observation("x", images=[Image.new("RGB", (2, 2))], image_labels=["a", "b"])
    err = Observation.error("bad")
    assert err.text == "Error: bad" and err.is_error and err.images == []
