"""Shared fixtures: tiny random Qwen2.5-VL and Qwen3-VL checkpoints built in code, and synthetic videos.

Nothing here downloads anything: the checkpoints are written by ``mmagent.tiny`` into pytest's
temporary folders once per test session and loaded back with ``from_pretrained``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The suite must never reach a model hub: fail at once instead of retrying for minutes.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# `python -m pytest` puts the checkout's root first on sys.path, where toolbox/, eval/, training/ and demo/
# would import under their bare folder names. Installed, they exist only as mmagent.toolbox, mmagent.eval, ...
# Taking the root off makes a stray `import eval...` fail here as it would for a user.
_ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != _ROOT]

import pytest  # noqa: E402
import torch  # noqa: E402

#: torch's intra-op threads in every test: float sums depend on how work is split, so a test that trains or
#: samples gives the same numbers only at one thread count, whatever the machine or the tests before it
TEST_THREADS = int(os.environ.get("MMAGENT_TEST_THREADS", "2"))
torch.set_num_threads(TEST_THREADS)  # for the session fixtures too, which are built before any test's fixtures


@pytest.fixture(autouse=True)
def _fixed_threads():
    """Every test starts at TEST_THREADS threads, and one that changes the count does not leak it."""
    torch.set_num_threads(TEST_THREADS)
    yield
    torch.set_num_threads(TEST_THREADS)

from mmagent.tiny import build_tiny, build_tiny_qwen2_5_vl, imprint, write_synthetic_video  # noqa: E402

#: the model families whose family-dependent tests run (``family_model_dir``)
FAMILIES = ("qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen2.5-VL (64 wide) with its own tokenizer and the real processors."""
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen"), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen3_vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer dense Qwen3-VL (64 wide, DeepStack into both layers) with the real Qwen3-VL processor."""
    return build_tiny(tmp_path_factory.mktemp("tiny-qwen3-vl"), "qwen3_vl", seed=0)


@pytest.fixture(scope="session", params=FAMILIES)
def family_model_dir(request: pytest.FixtureRequest) -> Path:
    """The tiny checkpoint of each family in turn: tests that use it run for Qwen2.5-VL and for Qwen3-VL."""
    return request.getfixturevalue("tiny_model_dir" if request.param == "qwen2_5_vl" else "tiny_qwen3_vl_dir")


@pytest.fixture(scope="session")
def imprinted_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model trained for a few seconds to call resample_frames once and then answer "A"."""
    path = build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen-imprinted"), seed=0, hidden_size=128)
    return imprint(path)


@pytest.fixture(scope="session")
def video_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4 s, 8 fps, 96x64 MP4: red, green, blue, yellow for one second each."""
    return write_synthetic_video(tmp_path_factory.mktemp("media") / "clip.mp4", seconds=4.0, fps=8, size=(96, 64))
