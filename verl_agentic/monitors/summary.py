"""The per-step batch summary the monitors read: a flat dict of named statistics.

Both trainers build it the same way. ``main_ppo`` calls :func:`batch_summary` on a step's
trajectories and their rewards, then adds what only the trainer knows with :func:`from_metrics`
(entropy, KL to the reference, held-out accuracy); inside verl's trainer the plugin does the same
with the episodes its ``task_agent`` loop recorded (the ``agentic`` field of each sample) and
verl's metric names. A statistic a run cannot give is absent, and the monitors that need it stay
silent (they never guess).

Keys (``batch/*``: the training batch; ``heldout/*``: the held-out validation, at validation steps):

- ``batch/episodes``, ``batch/prompts`` (distinct prompts), ``batch/reward_mean``;
- ``batch/accuracy``: the share of episodes with a correct final answer (the scorer's ``acc``,
  else the task's ``final_correct``; absent when no episode reports either);
- ``batch/reward_without_correct``: the share of the batch's positive reward earned by episodes
  without a correct answer (format-only reward, a lenient scorer);
- ``batch/answer_top_share``: the share of episodes giving the batch's most common final answer
  (:func:`answer_key`), with ``batch/answer_top`` that answer (a string, for the warning only);
  ``batch/first_answer_top_share`` / ``batch/first_answer_top``: the same of the first answers;
- ``batch/gen_tokens_per_turn``: generated tokens per assistant turn; ``batch/clip_ratio``: the
  share of assistant turns cut at ``max_new_tokens``;
- ``batch/tool_calls_per_turn``: tool calls per assistant turn (absent when no episode had tools);
- ``batch/entropy`` (the policy's token entropy), ``batch/kl_ref`` (KL to the reference model);
- ``heldout/episodes``, ``heldout/accuracy``, ``heldout/answer_top_share``,
  ``heldout/first_answer_top_share`` (and their answers).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional, Sequence

TEXT_KEY_CHARS = 200  # a final answer without a task-read answer is keyed by its first 200 characters


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _assistant_turns(ep: dict) -> list[dict]:
    return [t for t in ep.get("turns") or () if t.get("role") == "assistant"]


def _final_text(ep: dict) -> str:
    for m in reversed(ep.get("messages") or ()):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return ""


def answer_key(ep: dict) -> str:
    """What an episode finally answered, as one comparable string: the scorer's reading (``pred`` in
    ``score_extra`` or verl's ``reward_extra_info``), else the answer the task read from its last
    assistant turn (``Observation.info["answer"]``, e.g. gsm8k's), else the final assistant text
    with whitespace collapsed (its first ``TEXT_KEY_CHARS`` characters). An answer nobody could read
    falls back to the text, so a batch of varied unreadable answers is not a collapse, and a batch
    of one repeated string (``#####...``) is."""
    for extra in (ep.get("score_extra"), ep.get("reward_extra_info")):
        if isinstance(extra, dict) and extra.get("pred") is not None:
            return str(extra["pred"])
    turns = _assistant_turns(ep)
    if turns:
        info = turns[-1].get("info") or {}
        if info.get("answer") is not None:
            return str(info["answer"])
    return " ".join(_final_text(ep).split())[:TEXT_KEY_CHARS]


def first_answer_key(ep: dict) -> str:
    """What an episode answered first: its first assistant turn's task-read answer, else that turn's
    text (as :func:`answer_key`). With feedback, a collapse can show in the first answer only: a
    policy that always guesses 12 and moves by one after "That is not right" splits its final answers."""
    turns = _assistant_turns(ep)
    if turns and (turns[0].get("info") or {}).get("answer") is not None:
        return str(turns[0]["info"]["answer"])
    first = next((m.get("content") or "" for m in ep.get("messages") or () if m.get("role") == "assistant"), "")
    return " ".join(first.split())[:TEXT_KEY_CHARS]


def answer_stats(episodes: Sequence[dict], prefix: str) -> dict[str, Any]:
    """``<prefix>answer_top_share`` / ``<prefix>answer_top`` (the final answers) and the same of the
    first answers (``<prefix>first_answer_top_share`` / ``<prefix>first_answer_top``)."""
    out: dict[str, Any] = {}
    for name, key in (("answer", answer_key), ("first_answer", first_answer_key)):
        keys = [key(ep) for ep in episodes]
        if keys:
            top, count = Counter(keys).most_common(1)[0]
            out.update({f"{prefix}{name}_top_share": count / len(keys), f"{prefix}{name}_top": top})
    return out


def _correct(ep: dict) -> Optional[float]:
    for extra in (ep.get("score_extra"), ep.get("reward_extra_info")):
        if isinstance(extra, dict) and _number(extra.get("acc")):
            return float(extra["acc"])
    value = (ep.get("metrics") or {}).get("final_correct")
    return float(value) if _number(value) else None


def batch_summary(episodes: Sequence[dict], rewards: Optional[Sequence[Optional[float]]] = None,
                  prefix: str = "batch/") -> dict[str, Any]:
    """The statistics of one batch of episodes (trajectory dicts, or the ``agentic`` records of
    verl's batch: each needs ``turns``, ``messages``, ``metrics`` and ``uid``). ``rewards``: the
    reward each episode was trained on (None: not scored); default: its ``score``, else ``reward``."""
    if not episodes:
        return {}
    if rewards is None:
        rewards = [ep.get("score", ep.get("reward")) for ep in episodes]
    out: dict[str, Any] = {f"{prefix}episodes": float(len(episodes)),
                           f"{prefix}prompts": float(len({str(ep.get("uid", ep.get("index"))) for ep in episodes}))}
    scored = [float(r) for r in rewards if _number(r)]
    if scored:
        out[f"{prefix}reward_mean"] = sum(scored) / len(scored)
    judged = [(c, float(r)) for ep, r in zip(episodes, rewards) if (c := _correct(ep)) is not None and _number(r)]
    if judged:
        out[f"{prefix}accuracy"] = sum(c for c, _ in judged) / len(judged)
        positive = sum(max(r, 0.0) for _, r in judged)
        wrong = sum(max(r, 0.0) for c, r in judged if c < 1.0)
        out[f"{prefix}reward_without_correct"] = wrong / positive if positive > 0 else 0.0
    out.update(answer_stats(episodes, prefix))
    turns = [t for ep in episodes for t in _assistant_turns(ep)]
    if turns:
        out[f"{prefix}gen_tokens_per_turn"] = sum(int(t["end"]) - int(t["start"]) for t in turns) / len(turns)
        out[f"{prefix}clip_ratio"] = sum(t.get("finish_reason") == "length" for t in turns) / len(turns)
        calls = sum(len((t.get("info") or {}).get("tool_calls") or ()) for t in turns)
        if calls or any(ep.get("tools") for ep in episodes):  # episodes offered no tools: no statistic
            out[f"{prefix}tool_calls_per_turn"] = calls / len(turns)
    return out


def heldout_summary(episodes: Sequence[dict]) -> dict[str, Any]:
    """``heldout/*`` of a validation's episodes: accuracy (as in :func:`batch_summary`) and the answers."""
    if not episodes:
        return {}
    out: dict[str, Any] = {"heldout/episodes": float(len(episodes))}
    correct = [c for ep in episodes if (c := _correct(ep)) is not None]
    if correct:
        out["heldout/accuracy"] = sum(correct) / len(correct)
    out.update(answer_stats(episodes, "heldout/"))
    return out


# Where the trainer-side statistics are in each trainer's metrics (first found wins).
OURS = {  # main_ppo's metrics.jsonl
    "batch/entropy": ("actor/entropy",),
    "batch/kl_ref": ("actor/kl_ref",),
    "heldout/accuracy": ("val/accuracy/final",),
    # only used when a step has no batch/* of its own (runs logged before the monitors existed)
    "batch/reward_mean": ("reward/mean",),
    "batch/accuracy": ("accuracy/mean",),
    "batch/clip_ratio": ("response_length/clip_ratio",),
}
VERL = {  # verl's trainer (v1): actor metrics, the in-reward KL, validation per data source
    "batch/entropy": ("actor/entropy",),
    "batch/kl_ref": ("actor/kl_loss", "actor/reward_kl_penalty"),
    "batch/reward_mean": ("critic/score/mean",),
}
VERL_HELDOUT = ("val-core/", "/acc/mean@")  # val-core/<data source>/acc/mean@N: averaged over data sources


def from_metrics(metrics: dict, names: str = "ours") -> dict[str, Any]:
    """The summary keys a trainer's own metrics give (``names``: ``"ours"`` for main_ppo's,
    ``"verl"`` for verl's). Keys already in ``batch/*`` form (what ``main_ppo`` logs since the
    monitors exist) are taken as they are. For older main_ppo logs without them,
    ``batch/gen_tokens_per_turn`` is ``response_length/mean / turns/mean`` and
    ``batch/reward_without_correct`` is ``max(0, reward - accuracy) / reward``: exact when a correct
    episode scores 1 and none scores below 0 (the word-problem runs), a lower bound otherwise."""
    out = {k: v for k, v in metrics.items() if k.startswith(("batch/", "heldout/")) and (_number(v) or isinstance(v, str))}
    table = OURS if names == "ours" else VERL
    for key, sources in table.items():
        if key in out:
            continue
        for source in sources:
            if _number(metrics.get(source)):
                out[key] = float(metrics[source])
                break
    if names == "verl":
        accs = [float(v) for k, v in metrics.items() if k.startswith(VERL_HELDOUT[0]) and VERL_HELDOUT[1] in k
                and _number(v)]
        if accs and "heldout/accuracy" not in out:
            out["heldout/accuracy"] = sum(accs) / len(accs)
        return out
    length, turns = metrics.get("response_length/mean"), metrics.get("turns/mean")
    if "batch/gen_tokens_per_turn" not in out and _number(length) and _number(turns) and turns > 0:
        out["batch/gen_tokens_per_turn"] = float(length) / float(turns)
    reward, acc = out.get("batch/reward_mean"), out.get("batch/accuracy")
    if "batch/reward_without_correct" not in out and _number(reward) and _number(acc):
        out["batch/reward_without_correct"] = max(0.0, reward - acc) / reward if reward > 0 else 0.0
    return out


def numeric(summary: dict) -> dict[str, float]:
    """The summary without its strings (what goes into a trainer's metrics)."""
    return {k: float(v) for k, v in summary.items() if _number(v)}


def merge(*parts: Iterable[tuple[str, Any]] | dict) -> dict[str, Any]:
    """Summaries merged left to right, the first value of a key kept (episode statistics before
    those read from metrics)."""
    out: dict[str, Any] = {}
    for part in parts:
        for k, v in (part.items() if isinstance(part, dict) else part):
            out.setdefault(k, v)
    return out
