"""Repeated frame re-sampling on a long video: our tool vs qwen-vl-utils per call vs a decode floor.

An agent calls ``resample_frames`` many times on the same video. This script writes a long synthetic
video (10 minutes by default), draws a fixed set of random windows, and times three ways to get
``num_frames`` frames from each window, all in this run:

* ``resample_frames``: the tool through ``EpisodeMedia`` (one reader opened per episode, reused);
* ``fetch_video`` per call: qwen_vl_utils.fetch_video with video_start/video_end/nframes, which opens
  and indexes the file on every call (what a tool server built on it does);
* floor: the same frame indices decoded with the same backend's reader already open, straight to
  NumPy arrays, with no timestamps drawn and no PIL images.

    python benchmarks/frames.py                    # ~1-2 minutes on 2 CPU cores
    python benchmarks/frames.py --minutes 2 --calls 10 --codec mp4v
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from mmagent.media import EpisodeMedia, open_video
from mmagent.tiny import write_synthetic_video
from mmagent.toolbox.frames import ResampleFrames, window_times


def _windows(duration: float, calls: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(calls):
        span = rng.uniform(5.0, 30.0)
        start = rng.uniform(0.0, duration - span)
        out.append((start, start + span))
    return out


def time_tool(path: Path, windows, num_frames: int, backend: str) -> float:
    tool = ResampleFrames(max_frames=num_frames)
    media = EpisodeMedia(video=path, video_backends=(backend,))
    assert media.video is not None  # opened once per episode, before the calls (the floor is timed the same way)
    t0 = time.perf_counter()
    for start, end in windows:
        obs = tool({"start": start, "end": end, "num_frames": num_frames}, media)
        assert len(obs.images) == num_frames, obs.text
    elapsed = time.perf_counter() - t0
    media.close()
    return elapsed


def time_fetch_video(path: Path, windows, num_frames: int) -> float:
    from qwen_vl_utils import fetch_video

    t0 = time.perf_counter()
    for start, end in windows:
        video = fetch_video({"video": str(path), "video_start": start, "video_end": end, "nframes": num_frames})
        assert video.shape[0] == num_frames
    return time.perf_counter() - t0


def time_floor(path: Path, windows, num_frames: int, backend: str) -> float:
    reader = open_video(path, backends=(backend,))
    idx = [[reader.index_at(t) for t in window_times(s, e, num_frames)] for s, e in windows]
    if backend == "decord":  # decord's own reader, opened as mmagent's decord reader opens it
        import decord

        vr = decord.VideoReader(str(path), num_threads=1)
        t0 = time.perf_counter()
        for ids in idx:
            vr.get_batch(ids).asnumpy()
    else:  # the reader itself, minus nothing we can strip: its frames_at is the floor
        t0 = time.perf_counter()
        for (s, e) in windows:
            reader.frames_at(window_times(s, e, num_frames))
    elapsed = time.perf_counter() - t0
    reader.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--fps", type=int, default=24)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--codec", default="mp4v", help="fourcc OpenCV writes with (mp4v = MPEG-4 Part 2)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--num-frames", type=int, default=8)
    ap.add_argument("--backend", default="decord", choices=["decord", "pyav", "opencv"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        path = write_synthetic_video(Path(tmp) / "long.mp4", seconds=args.minutes * 60, fps=args.fps, size=(w, h),
                                     codec=args.codec, colors=[(40 * k % 256, 80 * k % 256, 120 * k % 256)
                                                               for k in range(30)])
        print(f"wrote {args.minutes:g} min {w}x{h} {args.fps} fps {args.codec} video in {time.perf_counter() - t0:.1f} s")
        duration = open_video(path, backends=(args.backend,)).duration
        windows = _windows(duration, args.calls, args.seed)
        # Best of a few alternating rounds, so neither side gets a warmer page cache.
        ours, floor, fetch = float("inf"), float("inf"), float("inf")
        for _ in range(args.rounds):
            ours = min(ours, time_tool(path, windows, args.num_frames, args.backend))
            floor = min(floor, time_floor(path, windows, args.num_frames, args.backend))
        fetch = time_fetch_video(path, windows, args.num_frames)
    n = args.calls
    print(f"{n} calls x {args.num_frames} frames, backend {args.backend}:")
    print(f"  resample_frames (reader reused) : {ours / n * 1000:8.1f} ms/call")
    print(f"  qwen_vl_utils.fetch_video       : {fetch / n * 1000:8.1f} ms/call")
    print(f"  decode floor                    : {floor / n * 1000:8.1f} ms/call")
    print(f"speed-up over fetch_video per call: {fetch / ours:.2f}x   (goal >= 5x)")
    print(f"cost over the decode floor        : {ours / floor:.2f}x   (goal <= 1.5x)")


if __name__ == "__main__":
    main()
