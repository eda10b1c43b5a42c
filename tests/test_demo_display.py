"""The demo's display copies and messages, without a browser: an mp4v upload gets an H.264 copy for the player
(the agent keeps the upload), and errors come out as one line naming the user's file."""

from __future__ import annotations

from mmagent.demo.app import DemoRunner
from mmagent.demo.display import browser_playable
from mmagent.demo.errors import user_message
from mmagent.demo.uploads import UploadError, UploadLimits, check_video
from mmagent.tiny import write_synthetic_video

import pytest


class NoPolicy:
    """The runner's display work needs no model."""

    renderer = None


def test_an_unplayable_upload_gets_an_h264_copy_and_a_playable_one_is_shown_as_it_is(tmp_path):
    clip = write_synthetic_video(tmp_path / "my clip.mp4", seconds=1.0, fps=8, size=(96, 64))  # OpenCV mp4v
    assert not browser_playable(clip)
    runner = DemoRunner(NoPolicy(), [], tmp_path / "work")
    shown, note = runner.display_video(str(clip))
    assert shown != str(clip) and browser_playable(shown) and check_video(shown, UploadLimits()) == pytest.approx(1.0)
    assert note.startswith("ℹ️ my clip.mp4 is in a format browsers cannot play")
    assert runner.display_video(shown) == (shown, None)  # already playable: shown as it is
    assert runner.display_video(None) == (None, None)
    bad = tmp_path / "broken.avi"
    bad.write_bytes(b"not a video" * 50)
    assert runner.display_video(str(bad)) == (None, None)  # the upload check explains it when asked


def test_messages_name_the_users_file_in_one_line(tmp_path):
    upload = "/tmp/gradio/0a1b2c/holiday.mp4"
    raw = (f"cannot read video {upload}: decord: DECORDError: [07:12:01] /github/src/video_reader.cc:151: "
           f"ERROR opening: {upload},\nInvalid data found when processing input")
    msg = user_message(raw, [upload])
    assert "\n" not in msg and "/tmp" not in msg and "/github" not in msg and "holiday.mp4" in msg
    assert len(user_message("x" * 1000)) == 300
    fake = tmp_path / "holiday.mp4"
    fake.write_bytes(b"definitely not an mp4 file" * 100)
    with pytest.raises(UploadError) as info:
        check_video(fake, UploadLimits())
    assert str(info.value).startswith("holiday.mp4: cannot be read as a video") and str(tmp_path) not in str(info.value)
