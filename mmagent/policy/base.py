"""What the agent loop needs from a policy backend, and the per-episode state a backend keeps.

The agent renders every step of an episode (:mod:`mmagent.policy.render`) and hands the :class:`View` to
its policy, which implements :class:`Policy`:

* ``start(view, seed, task)`` maps the first prompt to the backend's input (token ids and pixel tensors,
  a prompt string, chat messages) in a new :class:`Session`;
* ``generate`` continues a batch of sessions until a stop string, end of turn or the token limit;
* ``observe(session, view)`` appends a tool's observation as new prompt tokens.

A backend never samples frames, fits images or counts visual tokens itself: the view carries them, so
every backend shows the model the same thing, and the agent records the view sizes tools read boxes in.

The session holds the conversation as token ids, never as text: generated ids and encoded
observation ids are concatenated as they come (token-in/token-out), so the ids that training later
sees are exactly the ones the policy produced, and ``loss_mask`` marks which of them it produced.
Backends that only see text (``openai_http``, ``vllm_engine``) keep the conversation as messages or a
prompt string instead and leave the token-level fields empty: their trajectories are for evaluation,
not for training. The agent's context budget reads :attr:`Session.num_tokens`, which such backends
fill from the counts their engine reports.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Sequence

from mmagent.policy.families import DEFAULT_FAMILY, Family
from mmagent.policy.render import MediaBudget, Renderer, View
from mmagent.policy.sampling import SamplingConfig
from mmagent.trajectory import Task


@dataclass
class Generation:
    """One turn of generated text and its tokens."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    #: the turn hit max_new_tokens before a stop string or end of turn
    truncated: bool
    #: tokens run through the model before this turn's first new token (the prompt the turn needed)
    prefill_tokens: int
    seconds: float = 0.0
    #: tokens generated; defaults to ``len(token_ids)`` (HTTP backends, which get no ids, give the count)
    num_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_tokens is None:
            self.num_tokens = len(self.token_ids)


@dataclass
class Session:
    """One episode's conversation inside a policy. Backends subclass it to add their caches."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    #: seeds the session's sampling (a sampled episode is reproducible on its own, whatever its batch)
    seed: int = 0
    #: the episode's task, for policies that play from a plan or a script (the toy world's oracle, replayed
    #: turns); a model ignores it
    task: Task | None = None
    #: how this session's next tokens are picked; None: the policy's own setting (``mmagent serve`` sets it
    #: per request)
    sampling: SamplingConfig | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens in the conversation so far: what the context budget counts. Backends that hold the
        conversation as text (HTTP, vLLM) have no ids and override this with the count they know."""
        return len(self.token_ids)

    def _append(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1 if policy else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))


class TurnStream:
    """The turns being generated for a changing set of sessions (what :meth:`Policy.stream` returns).

    The agent adds (:meth:`add`) a session whenever it is ready for its next turn (its first prompt encoded, or
    its last observation appended) and calls :meth:`step` over and over; each call advances the sessions in
    flight and returns the turns that ended, which leave the stream at once. A backend that can let
    sessions join a running batch (the transformers one) overrides this; this default runs one
    ``policy.generate`` over everything added since the last step, so each step returns whole turns.
    """

    #: True when sessions added while others are mid-turn join them; False (lock-step) makes the agent
    #: gather every pending tool result before each step, so each batch is as large as it can be
    joins_running: bool = False

    def __init__(self, policy: "Policy", max_new_tokens: int) -> None:
        self.policy = policy
        self.max_new_tokens = max_new_tokens
        self.waiting: list[Session] = []

    def add(self, session: Session) -> None:
        self.waiting.append(session)

    def __len__(self) -> int:
        """Sessions in flight (added and not yet returned by :meth:`step`)."""
        return len(self.waiting)

    def sessions(self) -> list[Session]:
        return list(self.waiting)

    def step(self) -> list[tuple[Session, Generation]]:
        batch, self.waiting = self.waiting, []
        return list(zip(batch, self.policy.generate(batch, self.max_new_tokens))) if batch else []

    def close(self) -> None:
        """Release what the stream holds (called when the agent's run ends, also on errors)."""


class Policy(abc.ABC):
    """A vision-language model that can hold several episodes open at once."""

    #: the pixel budget every view of this policy is rendered within
    media_budget: MediaBudget
    #: the model family views are rendered for (chat format, visual-token size, timestamps)
    family: Family = DEFAULT_FAMILY
    #: pixels per visual token side of the model; None: the family's (Qwen2.5-VL 28, Qwen3-VL 32)
    patch_factor: int | None = None
    #: True when ``start`` may run in a worker thread while other sessions generate (it reads shared state
    #: only), so opening media overlaps with generation; the built-in backends set it
    thread_safe_start: bool = False
    #: the most images one episode may show (a limit of the backend's engine, e.g. vLLM's
    #: ``limit_mm_per_prompt``); the agent turns images past it into a text note. None: no limit
    max_images: int | None = None

    @property
    def renderer(self) -> Renderer:
        """What renders this policy's views: its pixel budget, patch size and model family."""
        return Renderer(self.media_budget, self.patch_factor, self.family)

    @abc.abstractmethod
    def start(self, view: View, seed: int = 0, task: Task | None = None) -> Session:
        """A new session holding the first prompt ``view`` (``task``: see :attr:`Session.task`)."""

    @abc.abstractmethod
    def generate(self, sessions: Sequence[Session], max_new_tokens: int) -> list[Generation]:
        """Generate the next turn of each session (appended to it) until a stop string."""

    @abc.abstractmethod
    def observe(self, session: Session, view: View) -> int:
        """Append an observation ``view`` as prompt tokens; return how many tokens it added."""

    def end(self, session: Session) -> None:
        """Free what the session holds (caches). The token ids stay readable."""

    def stream(self, max_new_tokens: int) -> TurnStream:
        """A :class:`TurnStream` for one ``run_batch``; the default generates in lock-step batches."""
        return TurnStream(self, max_new_tokens)

    def model_inputs(self, session: Session) -> Any:
        """The finished episode as one forward's inputs, for training to reuse instead of encoding it again
        (the transformers backend); None where the backend has none."""
        return None
