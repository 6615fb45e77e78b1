"""Our trajectories <-> verl's agent-loop outputs.

``to_agent_loop_output`` turns one trajectory dict (``verl_agentic.rollout.trajectory``) into
verl's ``AgentLoopOutput``; ``trajectories_from_batch`` turns the padded batch verl's
``AgentLoopWorker.generate_sequences`` returns back into trajectory dicts, so that
``check_drift``, the reward managers and the inspector work on what verl trains on.

What goes where in ``AgentLoopOutput``:

- ``prompt_ids``, ``response_ids``, ``response_mask`` (1 exactly on generated tokens),
  ``response_logprobs`` (the generated tokens' logprobs; 0.0 on injected tokens, as verl pads;
  None when the rollout asked for no logprobs), all cut together to ``response_length``.
- ``num_turns``: verl's count, every message after the system prompt: the prompt, then each
  assistant turn and each injected (user / tool) turn, i.e. ``len(turns) + 1``.
- ``extra_fields`` (each key becomes a column of verl's batch, so the set of keys is fixed):

  - ``turn_scores``: the per-assistant-turn rewards of the task (None where a turn has none);
    ``tool_rewards``: each tool call's step reward (``execute``'s), in order, as verl's tool agent
    reports them (from the turns' ``info``; the tools' rewards are in the task reward too);
  - ``agentic_response_mask`` (``RESPONSE_MASK_FIELD``): the response mask as a list, for
    reward managers on verl's streaming reward path, which sends no mask tensor. It cannot be
    named ``response_mask``: verl's batch already holds a ``response_mask`` tensor, and
    ``DataProto.to_tensordict`` (called by the trainer before every log-prob pass) refuses a
    non-tensor column of the same name;
  - ``agentic`` (``AGENTIC_FIELD``): the rest of the episode, one dict: ``uid``, ``task_type``,
    ``sample_id``, ``reward`` (the task's own reward), ``num_assistant_turns``,
    ``finish_reason``, ``error`` ({type, message} or None), ``metrics`` (the task's per-episode
    metrics: feedback turns, flips, tool calls, ...), ``turns``, ``messages``, ``tools`` and
    ``extra_info`` (the episode's: the row's plus what the task added, e.g. a swedev submission),
    ``truncated_tokens`` (response tokens cut to fit ``response_length``; 0 when the loop's
    budget kept it in, which ``ids_agent_loop`` always does) and, for an episode of several
    training rows (one output each), ``row`` (this one's position), ``rows`` (how many) and
    ``split_reason`` (why the row after this one started; None on the last); ``turns`` and
    ``messages`` are this row's;
  - ``min_global_steps`` / ``max_global_steps``: the oldest and newest policy version the
    episode's tokens came from, as the server reported them (verl's off-policy bookkeeping);
  - ``agentic_turn_rewards`` (``TURN_REWARDS_FIELD``): ``[[position, reward], ...]``, each earlier
    assistant turn's reward on its last token when ``agentic.turn_rewards`` is on (else ``[]``); on an
    episode's earlier row its last turn's too (``row_turn_rewards``); ``verl_plugin/turn_rewards.py`` adds
    them to verl's token-level scores.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from verl_agentic.interfaces import FINISH_INVALID_TOOL_CALLS
from verl_agentic.rollout.trajectory import row_turn_rewards

RESPONSE_MASK_FIELD = "agentic_response_mask"
AGENTIC_FIELD = "agentic"
TURN_REWARDS_FIELD = "agentic_turn_rewards"


def truncate_trajectory(traj: dict, max_response_tokens: int) -> dict:
    """A copy of ``traj`` whose response holds at most ``max_response_tokens`` tokens.

    Ids, mask and logprobs are cut together; turns past the cut are dropped and the turn it
    falls into is shortened (with the messages that belong to the dropped turns), so the
    trajectory stays consistent for ``check_drift``. A cut trajectory ends with
    ``finish_reason="length"`` and, unless it already failed, a ``context_overflow`` error.
    """
    n = len(traj["response_ids"])
    if n <= max_response_tokens:
        return traj
    cut = max_response_tokens
    out = dict(traj)
    out["response_ids"] = traj["response_ids"][:cut]
    out["response_mask"] = traj["response_mask"][:cut]
    out["response_logprobs"] = traj["response_logprobs"][:cut]
    turns, dropped_messages = [], 0
    for t in traj["turns"]:
        if t["start"] >= cut:
            dropped_messages += t.get("num_messages", 1)
            continue
        if t["end"] > cut and t["role"] == "assistant":
            t = dict(t, finish_reason="length")
        turns.append(dict(t, end=min(t["end"], cut)))
    out["turns"] = turns
    if dropped_messages:
        out["messages"] = traj["messages"][:len(traj["messages"]) - dropped_messages]
    out["num_turns"] = sum(t["role"] == "assistant" for t in turns)
    out["finish_reason"] = "length"
    if out.get("error") is None:
        out["error"] = {"type": "context_overflow",
                        "message": f"response of {n} tokens cut to response_length={max_response_tokens}"}
    out["truncated_tokens"] = n - cut
    return out


def _logprobs_for_verl(traj: dict, logprobs_expected: bool) -> Optional[list[float]]:
    if not logprobs_expected:
        return None
    values = []
    for i, (m, lp) in enumerate(zip(traj["response_mask"], traj["response_logprobs"])):
        if m and lp is None:
            raise ValueError(f"episode {traj['uid']}: generated token {i} has no logprob, but the rollout asks for "
                             "them (actor_rollout_ref.rollout.calculate_log_probs=true): the server returned none")
        values.append(float(lp) if m else 0.0)
    return values


def to_agent_loop_output(traj: dict, *, prompt_length: int, response_length: int, logprobs_expected: bool,
                         metrics: Any, extra_fields: Optional[dict] = None, turn_rewards: bool = False) -> Any:
    """verl's ``AgentLoopOutput`` for one trajectory (see the module docstring for the fields).

    ``prompt_length`` / ``response_length``: verl's ``rollout.prompt_length`` and
    ``rollout.response_length`` (a prompt longer than ``prompt_length`` only comes with an
    episode that failed on it; it is left-truncated as verl does, and its response is empty).
    ``metrics``: an ``AgentLoopMetrics``. ``extra_fields`` are added to ours. ``turn_rewards``:
    fill ``agentic_turn_rewards`` (``rollout.trajectory.turn_rewards``, the rule main_ppo uses).
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    traj = truncate_trajectory(traj, response_length)
    prompt_ids = list(traj["prompt_ids"])
    if len(prompt_ids) > prompt_length:
        prompt_ids = prompt_ids[-prompt_length:]
    turns = traj["turns"]
    agentic = {
        "uid": traj["uid"], "task_type": traj["task_type"], "sample_id": traj["sample_id"],
        "reward": traj["reward"], "scorer": traj.get("scorer"), "num_assistant_turns": traj["num_turns"],
        "finish_reason": traj["finish_reason"], "error": traj["error"], "metrics": dict(traj["metrics"]),
        "turns": turns, "messages": traj["messages"], "tools": traj.get("tools"),
        "extra_info": traj.get("extra_info") or {},
        "truncated_tokens": traj.get("truncated_tokens", 0),
        "row": traj.get("row", 0), "rows": traj.get("rows", 1), "split_reason": traj.get("split_reason"),
    }
    fields = {
        "turn_scores": [t.get("reward") for t in turns if t["role"] == "assistant"],
        "tool_rewards": [float(call.get("reward", 0.0)) for t in turns
                         for call in (t.get("info") or {}).get("tool_calls", ())],
        RESPONSE_MASK_FIELD: list(traj["response_mask"]),
        AGENTIC_FIELD: agentic,
        TURN_REWARDS_FIELD: [list(p) for p in row_turn_rewards(traj)] if turn_rewards else [],
        **(extra_fields or {}),
    }
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=list(traj["response_ids"]),
        response_mask=list(traj["response_mask"]),
        response_logprobs=_logprobs_for_verl(traj, logprobs_expected),
        num_turns=len(turns) + 1,
        metrics=metrics,
        extra_fields=fields,
    )


def _row_value(batch: Any, key: str, i: int) -> Any:
    column = batch.non_tensor_batch.get(key)
    return None if column is None else column[i]


def trajectories_from_batch(batch: Any) -> list[dict]:
    """Trajectory dicts (the dump schema) from the ``DataProto`` that verl's
    ``AgentLoopWorker.generate_sequences`` returns for our ``task_agent`` loop.

    Padding is removed with the attention mask; logprobs (``rollout_log_probs``, float32) are
    None on injected tokens. ``data_source``, ``reward_model`` and ``extra_info`` come from
    the batch's columns when it has them (verl keeps the dataset columns when it scores after
    the rollout). Raises ``ValueError`` for a batch without our ``agentic`` column.
    """
    if AGENTIC_FIELD not in batch.non_tensor_batch:
        raise ValueError(f"the batch has no {AGENTIC_FIELD!r} column: it was not produced by the task_agent "
                         f"loop (columns: {sorted(batch.non_tensor_batch)})")
    prompts, responses = batch.batch["prompts"], batch.batch["responses"]
    attention, response_mask = batch.batch["attention_mask"], batch.batch["response_mask"]
    logprobs = batch.batch["rollout_log_probs"] if "rollout_log_probs" in batch.batch.keys() else None
    width = prompts.shape[1]
    out = []
    for i in range(len(batch)):
        agentic = batch.non_tensor_batch[AGENTIC_FIELD][i]
        prompt_ids = prompts[i][attention[i, :width].bool()].tolist()
        n = int(attention[i, width:].sum())
        mask = response_mask[i, :n].tolist()
        lps = [None] * n
        if logprobs is not None:
            lps = [float(x) if m else None for x, m in zip(logprobs[i, :n].tolist(), mask)]
        reward_model = _row_value(batch, "reward_model", i) or {}
        out.append({
            "uid": agentic["uid"], "task_type": agentic["task_type"],
            "index": int(_row_value(batch, "index", i) or 0), "sample_id": agentic["sample_id"],
            "data_source": _row_value(batch, "data_source", i),
            "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            "extra_info": _row_value(batch, "extra_info", i) or {},
            "prompt_ids": prompt_ids, "response_ids": responses[i, :n].tolist(), "response_mask": mask,
            "response_logprobs": lps, "messages": list(agentic["messages"]), "turns": list(agentic["turns"]),
            "reward": agentic["reward"], "num_turns": agentic["num_assistant_turns"],
            "finish_reason": agentic["finish_reason"], "error": agentic["error"], "metrics": dict(agentic["metrics"]),
            **({"tools": agentic["tools"]} if agentic.get("tools") else {}),
        })
    return out


def plain(value: Any) -> Any:
    """numpy arrays / scalars and OmegaConf containers -> plain Python, recursively (dataset rows
    reach an agent loop as numpy objects on some paths)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


# The episode metrics every scored sample carries into verl's ``reward_extra_info`` (verl gathers
# extra info key by key across a batch, so every sample has every key): verl logs them per data
# source in validation (``val-aux/<data_source>/<name>/mean@N``). 0.0 where the task does not
# report the metric (e.g. ``first_correct`` for a tool task).
EPISODE_METRICS = ("turns", "task_reward", "first_correct", "final_correct", "flips_wrong_to_right",
                   "flips_right_to_wrong", "answered", "tool_calls", "tool_ok", "invalid_tool_calls",
                   "invalid_tool_call_stop", "episode_error")


def episode_metrics(agentic: Optional[dict]) -> dict[str, float]:
    """``EPISODE_METRICS`` of one episode from the ``agentic`` extra field ``task_agent`` records
    (all 0.0 for a sample that did not come from ``task_agent``)."""
    out = dict.fromkeys(EPISODE_METRICS, 0.0)
    if not isinstance(agentic, dict):
        return out
    metrics = agentic.get("metrics") or {}
    for key in ("first_correct", "final_correct", "flips_wrong_to_right", "flips_right_to_wrong", "answered",
                "invalid_tool_calls"):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    calls = [c for t in agentic.get("turns") or () for c in ((t.get("info") or {}).get("tool_calls") or ())]
    out.update(turns=float(agentic.get("num_assistant_turns") or 0), task_reward=float(agentic.get("reward") or 0.0),
               tool_calls=float(len(calls)), tool_ok=float(sum(c.get("status") == "ok" for c in calls)),
               invalid_tool_call_stop=float(agentic.get("finish_reason") == FINISH_INVALID_TOOL_CALLS),
               episode_error=float(agentic.get("error") is not None))
    return out
