"""Trajectories -> padded training tensors (verl's layout) and a ``DataProto``.

Layout, as in verl's rollout output: prompts left-padded to the longest prompt ``P``,
responses right-padded to the longest response ``R``; ``input_ids`` is ``[B, P + R]``.
``response_mask`` is the trajectory's own mask (1 exactly on generated tokens, 0 on
injected tool/user tokens and on padding), so the loss never touches what the model did
not generate. ``rollout_log_probs`` are the logprobs the backend returned with each
generated token (0 where the mask is 0). Token ids are the trajectory's ids, never
re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch

from verl_agentic.rollout.trajectory import turn_rewards as trajectory_turn_rewards


@dataclass
class TrainBatch:
    input_ids: torch.Tensor  # [B, P+R]
    attention_mask: torch.Tensor  # [B, P+R]
    position_ids: torch.Tensor  # [B, P+R]
    responses: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R] float
    rollout_log_probs: torch.Tensor  # [B, R] float (0 where masked)
    scores: torch.Tensor  # [B] sequence-level reward
    uids: np.ndarray  # [B] group ids (object): the prompt each episode answers
    prompt_len: int  # P
    #: more [B, R] tensors aligned with the responses (advantages, old_log_probs, ...)
    extra: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_len(self) -> int:
        return int(self.responses.shape[1])

    def token_level_scores(self) -> torch.Tensor:
        """The sequence reward on each episode's last generated token (zeros elsewhere), plus the
        earlier turns' rewards on their last tokens when the batch was built with ``turn_rewards``."""
        out = torch.zeros_like(self.response_mask)
        has = self.response_mask.sum(-1) > 0
        last = (self.response_mask * torch.arange(self.response_len, dtype=out.dtype)).argmax(-1)
        rows = torch.nonzero(has).flatten()
        out[rows, last[rows]] = self.scores[rows].to(out.dtype)
        if "turn_scores" in self.extra:
            out = out + self.extra["turn_scores"]
        return out

    def select(self, idx: Sequence[int] | torch.Tensor) -> "TrainBatch":
        """The rows ``idx`` (a mini/micro-batch), with the padding no selected row needs cut off."""
        idx_t = torch.as_tensor(idx, dtype=torch.long)
        attn = self.attention_mask[idx_t]
        prompt_cols = torch.nonzero(attn[:, :self.prompt_len].any(0)).flatten()
        start = int(prompt_cols[0]) if prompt_cols.numel() else self.prompt_len - 1
        keep = max(1, _last_nonpad(attn[:, self.prompt_len:]))
        cut = self.prompt_len + keep
        return TrainBatch(
            input_ids=self.input_ids[idx_t, start:cut], attention_mask=attn[:, start:cut],
            position_ids=self.position_ids[idx_t, start:cut], responses=self.responses[idx_t, :keep],
            response_mask=self.response_mask[idx_t, :keep], rollout_log_probs=self.rollout_log_probs[idx_t, :keep],
            scores=self.scores[idx_t], uids=self.uids[idx_t.numpy()], prompt_len=self.prompt_len - start,
            extra={k: v[idx_t, :keep] for k, v in self.extra.items()},
        )


def _last_nonpad(mask: torch.Tensor) -> int:
    """1 + the last column where any row has a real token (0 if none)."""
    cols = torch.nonzero(mask.any(0)).flatten()
    return int(cols[-1]) + 1 if cols.numel() else 0


def build_batch(trajectories: Sequence[dict], scores: Sequence[float], pad_id: int,
                uids: Optional[Sequence[str]] = None, turn_rewards: bool = False) -> TrainBatch:
    """Pad ``trajectories`` into a :class:`TrainBatch`; ``scores[i]`` is episode i's reward.

    ``turn_rewards``: also keep each assistant turn's own reward (the task's ``turn_reward``) on that
    turn's last token, for every assistant turn but the last, whose token carries the episode's score
    (``extra["turn_scores"]``, added by :meth:`TrainBatch.token_level_scores`). A turn-level estimator
    (``turn_loo``) then sees rewards per turn; an episode-level one sees their sum.

    Raises ValueError naming the episode when its mask or logprobs do not line up with its
    response ids (a trajectory that would train on the wrong tokens).
    """
    if not trajectories:
        raise ValueError("build_batch: no trajectories")
    if len(scores) != len(trajectories):
        raise ValueError(f"build_batch: {len(scores)} scores for {len(trajectories)} trajectories")
    for i, t in enumerate(trajectories):
        n = len(t["response_ids"])
        for key in ("response_mask", "response_logprobs"):
            if len(t[key]) != n:
                raise ValueError(f"episode {i} (uid {t.get('uid')}): {len(t[key])} {key} for {n} response ids")
    b = len(trajectories)
    p = max(len(t["prompt_ids"]) for t in trajectories)
    r = max(1, max(len(t["response_ids"]) for t in trajectories))
    input_ids = torch.full((b, p + r), pad_id, dtype=torch.long)
    attention = torch.zeros((b, p + r), dtype=torch.long)
    resp_mask = torch.zeros((b, r), dtype=torch.float32)
    logprobs = torch.zeros((b, r), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        prompt, resp = t["prompt_ids"], t["response_ids"]
        input_ids[i, p - len(prompt):p] = torch.tensor(prompt, dtype=torch.long)
        attention[i, p - len(prompt):p] = 1
        if resp:
            input_ids[i, p:p + len(resp)] = torch.tensor(resp, dtype=torch.long)
            attention[i, p:p + len(resp)] = 1
            resp_mask[i, :len(resp)] = torch.tensor(t["response_mask"], dtype=torch.float32)
            lp = [x if (x is not None and m) else 0.0 for x, m in zip(t["response_logprobs"], t["response_mask"])]
            logprobs[i, :len(resp)] = torch.tensor(lp, dtype=torch.float32)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    extra = {}
    if turn_rewards:
        turn_scores = torch.zeros((b, r), dtype=torch.float32)
        for i, t in enumerate(trajectories):
            for pos, reward in trajectory_turn_rewards(t):
                turn_scores[i, pos] += reward
        extra["turn_scores"] = turn_scores
    group = uids if uids is not None else [f"{t.get('uid')}#{t.get('index')}" for t in trajectories]
    return TrainBatch(
        input_ids=input_ids, attention_mask=attention, position_ids=position_ids, responses=input_ids[:, p:],
        response_mask=resp_mask, rollout_log_probs=logprobs,
        scores=torch.tensor([float(s) for s in scores], dtype=torch.float32),
        uids=np.array(list(group), dtype=object), prompt_len=p, extra=extra,
    )


def to_dataproto(batch: TrainBatch):
    """verl's ``DataProto`` of the batch (keys as verl's trainer names them)."""
    from verl import DataProto

    return DataProto.from_dict(
        tensors={
            "input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
            "position_ids": batch.position_ids, "responses": batch.responses,
            "response_mask": batch.response_mask, "rollout_log_probs": batch.rollout_log_probs,
            "token_level_scores": batch.token_level_scores(),
        },
        non_tensors={"uid": batch.uids},
    )
