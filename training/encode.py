"""Turn an episode into model inputs, teacher-forced: the bridge from trajectories to losses.

An episode the transformers backend rolled out with ``Agent(keep_model_inputs=True)`` (RL) carries the
inputs the rollout encoded (:attr:`~mmagent.trajectory.Trajectory.model_inputs`): they are used as they are,
checked against the recorded ids, with nothing opened or processed again.

Otherwise :func:`encode_trajectory` rebuilds the episode inside a :class:`~mmagent.policy.hf.HFPolicy`
session without generating anything, rendering it as the agent did (:mod:`mmagent.policy.render`): the
first prompt (the same frames are sampled again), each policy turn appended as tokens, and each
observation rendered from its saved images. The session's segments then give one forward's inputs (ids,
M-RoPE positions, every image and frame of every turn) and its ``loss_mask`` marks the policy's tokens.

Token-in/token-out: an episode the policy generated carries its token ids, and those are used as they
are (never re-tokenized from text, which can split differently); the rebuilt prompt and observations
must equal the recorded ones token for token, or :class:`EncodeError` says where they part. Episodes
without ids (the toy world's oracle SFT data) have their turns tokenized from text, exactly as
:class:`~mmagent.policy.replay.ReplayChooser` would force them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmagent.media import EpisodeMedia
from mmagent.policy.hf import HFPolicy, HFSession
from mmagent.policy.segments import on_device
from mmagent.trajectory import Trajectory


class EncodeError(ValueError):
    """A trajectory whose rebuilt tokens differ from the recorded ones (or that cannot be rebuilt)."""


@dataclass
class EncodedEpisode:
    """One episode as a single forward's inputs plus per-token training data."""

    inputs: dict[str, torch.Tensor]  # batch of one: input_ids, position_ids, mm_token_type_ids, vision inputs
    loss_mask: torch.Tensor  # (T,) 1 on policy tokens
    old_logprobs: torch.Tensor  # (T,) sampling log-probabilities recorded at rollout (0 where unknown)
    prompt_length: int

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.numel())

    @property
    def policy_tokens(self) -> int:
        return int(self.loss_mask.sum())


def _runs(mask: list[int], start: int) -> list[tuple[int, int, int]]:
    """(value, begin, end) of the constant runs of ``mask`` from ``start``."""
    runs = []
    k = start
    while k < len(mask):
        j = k
        while j < len(mask) and mask[j] == mask[k]:
            j += 1
        runs.append((mask[k], k, j))
        k = j
    return runs


def encode_trajectory(policy: HFPolicy, traj: Trajectory) -> EncodedEpisode:
    """``traj`` as one forward's inputs: the rollout's own, or rebuilt in ``policy`` (see the module docstring)."""
    if traj.model_inputs is not None:
        return _rollout_inputs(traj)
    if not traj.user_prompt:
        raise EncodeError(f"trajectory {traj.task.id!r} has no user_prompt: it was not written by the agent")
    media = EpisodeMedia(video=traj.task.video, image=traj.task.image)
    renderer = policy.renderer
    session: HFSession | None = None
    try:
        session = policy.start(renderer.prompt(traj.system_prompt, traj.user_prompt, media), task=traj.task)
        recorded = list(traj.token_ids)
        if recorded:
            _check(traj, session.token_ids, recorded[:traj.prompt_length], 0, "the first prompt")
            policy_runs = [(b, e) for v, b, e in _runs(list(traj.loss_mask), traj.prompt_length) if v == 1]
        else:
            policy_runs = []
        n_policy = 0
        for turn in traj.turns:
            if turn.role == "assistant":
                if recorded:
                    if n_policy >= len(policy_runs):
                        raise EncodeError(f"trajectory {traj.task.id!r}: more assistant turns than policy token runs")
                    b, e = policy_runs[n_policy]
                    ids = recorded[b:e]
                    logprobs = list(traj.logprobs[b:e]) if traj.logprobs else None
                else:
                    ids = policy.tokenizer.encode(turn.text, add_special_tokens=False)
                    logprobs = None
                n_policy += 1
                if ids:
                    policy.append_turn(session, ids, logprobs)
            elif turn.observation is not None:
                obs = turn.observation
                handles = media.add_observation_images(obs.images)  # obs:N numbering as in the episode
                if obs.images and not obs.handles:
                    obs.handles = handles
                before = len(session.token_ids)
                policy.observe(session, renderer.observation(obs))
                if recorded:
                    _check(traj, session.token_ids[before:], recorded[before:len(session.token_ids)], before,
                           "an observation")
        if recorded and len(session.token_ids) != len(recorded):
            raise EncodeError(f"trajectory {traj.task.id!r}: rebuilt {len(session.token_ids)} tokens, "
                              f"recorded {len(recorded)}")
        return EncodedEpisode(inputs=policy.model_inputs(session),
                              loss_mask=torch.tensor(session.loss_mask, dtype=torch.long),
                              old_logprobs=torch.tensor(session.logprobs, dtype=torch.float),
                              prompt_length=session.prompt_length)
    finally:
        if session is not None:
            policy.end(session)
        media.close()


def _check(traj: Trajectory, rebuilt: list[int], recorded: list[int], offset: int, what: str) -> None:
    if rebuilt != recorded:
        k = next((i for i, (a, b) in enumerate(zip(rebuilt, recorded)) if a != b), min(len(rebuilt), len(recorded)))
        raise EncodeError(f"trajectory {traj.task.id!r}: {what} re-encodes differently from the recorded tokens "
                          f"at token {offset + k} (was the model, processor or media budget changed?)")


def _rollout_inputs(traj: Trajectory) -> EncodedEpisode:
    """The inputs the rollout encoded, checked to hold exactly the episode's recorded ids."""
    inputs = traj.model_inputs
    if inputs["input_ids"][0].tolist() != traj.token_ids:
        raise EncodeError(f"trajectory {traj.task.id!r}: its model inputs do not hold its recorded token ids")
    return EncodedEpisode(inputs=inputs, loss_mask=torch.tensor(traj.loss_mask, dtype=torch.long),
                          old_logprobs=torch.tensor(traj.logprobs, dtype=torch.float),
                          prompt_length=traj.prompt_length)


def forward_logits(model: torch.nn.Module, episode: EncodedEpisode) -> torch.Tensor:
    """Logits (T, V) of one episode's forward, in float32 (``model`` may be a wrapped/prepared copy)."""
    return model(**on_device(model, episode.inputs), use_cache=False).logits[0].float()


def next_token_targets(episode: EncodedEpisode) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets, mask) aligned with logits[:-1]: position t predicts token t+1, trained where t+1 is the policy's."""
    ids = episode.inputs["input_ids"][0]
    return ids[1:], episode.loss_mask[1:]
