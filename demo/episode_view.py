"""How the demo draws an episode: turns as chat messages, tool images as captioned gallery items, and the export.

Nothing here imports Gradio: the functions take the agent's :class:`~mmagent.trajectory.Turn` objects
as they stream in and return plain data (message dicts in Gradio's ``messages`` format, ``(image,
caption)`` pairs, file paths), so they are tested without a browser. Gallery images are display copies
(:func:`mmagent.demo.display.display_image`): any image the agent accepted fits the browser. Model text
is shown as text: the chatbot escapes and sanitises it, and the tags of the tool protocol are taken apart here instead of
being left for the HTML sanitiser to strip.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from PIL import Image

from mmagent.demo.display import display_image
from mmagent.protocol import parse_turn
from mmagent.trajectory import Trajectory, Turn

Message = dict[str, Any]
GalleryItem = tuple[Image.Image, str]


def _block(text: str, lang: str = "") -> str:
    """``text`` as a fenced block that nothing inside it can close."""
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}{lang}\n{text}\n{fence}"


def question_message(question: str, options: Sequence[str] | None = None) -> Message:
    text = question
    if options:
        text += "\n\n" + "\n".join(f"- {o}" for o in options)
    return {"role": "user", "content": text}


@dataclass
class EpisodeView:
    """The UI state of one episode, grown one turn at a time by :meth:`add`."""

    messages: list[Message] = field(default_factory=list)
    gallery: list[GalleryItem] = field(default_factory=list)
    policy_turns: int = 0
    tool_calls: int = 0
    answer: str | None = None
    last_call: str | None = None

    def add(self, turn: Turn) -> None:
        if turn.role == "assistant":
            self._add_policy_turn(turn)
        else:
            self._add_observation(turn)

    def _say(self, title: str, body: str) -> None:
        # A bold first line instead of Gradio's collapsible "metadata" boxes: every step stays in view.
        self.messages.append({"role": "assistant", "content": f"**{title}**\n\n{body}" if body else f"**{title}**"})

    def _add_policy_turn(self, turn: Turn) -> None:
        self.policy_turns += 1
        parsed = parse_turn(turn.text)
        n = self.policy_turns
        thoughts = "\n\n".join(t.strip() for t in parsed.thoughts if t.strip())
        if thoughts:
            self._say(f"💭 Turn {n}: thinking", _quote(thoughts))
        if turn.tool_call is not None:
            self.tool_calls += 1
            self.last_call = turn.tool_call.name
            args = json.dumps(turn.tool_call.arguments, ensure_ascii=False, indent=1)
            self._say(f"🔧 Turn {n}: calls {turn.tool_call.name}", _block(args, "json"))
        elif turn.error is not None:
            self._say(f"⚠️ Turn {n}: not understood ({turn.error})", _block(turn.text.strip() or "(empty turn)"))
        else:
            self.answer = getattr(parsed.action, "text", None)
            shown = self.answer if self.answer is not None else turn.text.strip()
            self._say(f"Answer: {_inline(shown)}", "")

    def _add_observation(self, turn: Turn) -> None:
        obs = turn.observation
        name = turn.tool_call.name if turn.tool_call is not None else None
        images = obs.images if obs is not None else []
        handles = obs.handles if obs is not None and obs.handles else [""] * len(images)
        labels = obs.image_labels if obs is not None and obs.image_labels else [""] * len(images)
        if name is None:  # no tool ran: the agent tells the model what was wrong with its turn
            title = "↩️ the agent's reply to the model"
        elif turn.error is not None:
            title = f"❌ {name}: {'timed out' if turn.error == 'timeout' else 'error'}"
        else:
            title = f"📎 {name} returned {len(images)} image{'s' if len(images) != 1 else ''}"
            if handles and handles[0]:
                title += f" ({handles[0]}" + (f" … {handles[-1]})" if len(handles) > 1 else ")")
        self._say(title, _block(turn.text.strip()))
        for im, handle, label in zip(images, handles, labels):
            caption = " · ".join(p for p in (f"turn {self.policy_turns}", name or "", handle, label) if p)
            self.gallery.append((display_image(im), caption))


def title_of(message: Message) -> str:
    """The bold first line of a message written by :class:`EpisodeView` ('' for the question)."""
    first = str(message.get("content", "")).split("\n", 1)[0]
    return first[2:-2] if first.startswith("**") and first.endswith("**") else ""


def _plain(text: str) -> str:
    """Model-written text for markdown: no raw HTML and no images or links that would fetch a URL."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("](", "]\\(")


def _quote(text: str) -> str:
    return "\n".join(f"> {_plain(line)}" if line.strip() else ">" for line in text.splitlines())


def _inline(text: str) -> str:
    return _plain(text.replace("\n", " ").strip()) or "(empty)"


def prompt_items(video_frames: Sequence[tuple[Image.Image, float]] = (), image: Image.Image | None = None
                 ) -> list[GalleryItem]:
    """Gallery items for what the model saw in its first prompt: the question image and the sampled frames."""
    items: list[GalleryItem] = []
    if image is not None:
        items.append((display_image(image), "question image"))
    items += [(display_image(im), f"prompt frame · {t:.2f}s") for im, t in video_frames]
    return items


def export_trajectory(traj: Trajectory, folder: str | Path) -> tuple[Path, Path]:
    """Write ``trajectory.json`` (images as PNGs in ``images/`` beside it) and a zip of both; return the two paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = traj.to_dict(image_dir=folder / "images", relative_to=folder)
    json_path = folder / "trajectory.json"
    json_path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    zip_path = folder / "trajectory.zip"
    with zipfile.ZipFile(zip_path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.write(json_path, "trajectory.json")
        for png in sorted((folder / "images").glob("*.png")):
            zf.write(png, f"images/{png.name}")
    return json_path, zip_path
