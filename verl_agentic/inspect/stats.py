"""Per-episode numbers and their aggregates, under the key names of the trainer's ``metrics.jsonl``.

One aggregation serves three places: per-step values a training dir's ``metrics.jsonl`` lacks are
derived from its ``rollouts/`` with it, the comparison view's per-task deltas use it, and so does
the per-task part of the plots. Keys without data are left out (never reported as 0).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Optional


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def accuracy_of(t: dict) -> Optional[float]:
    """The episode's accuracy: the task's ``final_correct`` (as the trainer logs it), else the reward
    manager's ``score_extra.acc``."""
    fc = (t.get("metrics") or {}).get("final_correct")
    if _num(fc):
        return float(fc)
    acc = (t.get("score_extra") or {}).get("acc")
    return float(acc) if _num(acc) else None


def logprob_gaps(t: dict) -> Optional[list[float]]:
    """|rollout logprob - trainer logprob| on every trained token that has both; None without trainer logprobs."""
    tl = t.get("trainer_logprobs")
    if not tl:
        return None
    rl = t.get("response_logprobs") or []
    return [abs(a - b) for a, b, m in zip(rl, tl, t["response_mask"]) if m and _num(a) and _num(b)]


def aggregate(trajectories: Iterable[dict], per_task: bool = True) -> dict[str, float]:
    """``reward/mean`` (and ``reward/<task>/mean``), ``accuracy/mean`` and ``accuracy/first_turn``, ``turns/mean``,
    ``response_length/mean`` / ``_max`` (generated tokens, mask 1), ``flips/*`` and ``tool/calls`` (sums),
    ``tool/success_rate`` (ok / calls), ``actor/logprob_gap_mean`` / ``_max`` (over trained tokens),
    ``score/mean``; the definitions of ``verl_agentic.trainer``'s metrics.jsonl."""
    trajs = list(trajectories)
    out: dict[str, float] = {}
    if not trajs:
        return out
    n = len(trajs)
    out["episodes"] = n
    out["reward/mean"] = sum(t["reward"] for t in trajs) / n
    if per_task:
        by_task: dict[str, list[float]] = defaultdict(list)
        for t in trajs:
            by_task[t.get("task_type") or "?"].append(t["reward"])
        for task, rs in sorted(by_task.items()):
            out[f"reward/{task}/mean"] = sum(rs) / len(rs)
    accs = [a for a in map(accuracy_of, trajs) if a is not None]
    if accs:
        out["accuracy/mean"] = sum(accs) / len(accs)
    first = [(t.get("metrics") or {}).get("first_correct") for t in trajs]
    first = [float(x) for x in first if _num(x)]
    if first:
        out["accuracy/first_turn"] = sum(first) / len(first)
    scores = [t["score"] for t in trajs if _num(t.get("score"))]
    if scores:
        out["score/mean"] = sum(scores) / len(scores)
    out["turns/mean"] = sum(t["num_turns"] for t in trajs) / n
    generated = [sum(t["response_mask"]) for t in trajs]
    out["response_length/mean"] = sum(generated) / n
    out["response_length/max"] = float(max(generated))
    metrics = [t.get("metrics") or {} for t in trajs]
    for key, name in (("flips_wrong_to_right", "flips/wrong_to_right"),
                      ("flips_right_to_wrong", "flips/right_to_wrong"), ("tool_calls", "tool/calls")):
        vals = [m[key] for m in metrics if _num(m.get(key))]
        if vals:
            out[name] = float(sum(vals))
    if out.get("tool/calls"):
        out["tool/success_rate"] = sum(m.get("tool_ok") or 0 for m in metrics) / out["tool/calls"]
    gaps = [g for t in trajs for g in (logprob_gaps(t) or [])]
    if gaps:
        out["actor/logprob_gap_mean"] = sum(gaps) / len(gaps)
        out["actor/logprob_gap_max"] = max(gaps)
    return out


def step_series(steps: list[dict], trajectories: list[dict]) -> tuple[list[int], dict[str, dict]]:
    """(step numbers, {key: {"y": [value or None per step], "source": ...}}) for a training run.

    A key present in ``metrics.jsonl`` comes from there (source ``metrics.jsonl``); otherwise it is
    derived from the step's episodes with :func:`aggregate` (source ``rollouts``)."""
    logged = {r["step"]: r for r in steps}
    by_step: dict[int, list[dict]] = defaultdict(list)
    for t in trajectories:
        if t.get("step") is not None:
            by_step[t["step"]].append(t)
    numbers = sorted(set(logged) | set(by_step))
    derived = {s: aggregate(by_step[s]) for s in numbers if by_step.get(s)}
    keys: list[str] = []
    for row in [*steps, *derived.values()]:
        keys += [k for k in row if k not in keys and k not in ("step", "episodes")]
    series = {}
    for key in keys:
        if any(_num(r.get(key)) for r in steps):
            ys = [logged[s].get(key) if s in logged else None for s in numbers]
            source = "metrics.jsonl"
        else:
            ys = [derived.get(s, {}).get(key) for s in numbers]
            source = "rollouts"
        series[key] = {"y": [float(y) if _num(y) else None for y in ys], "source": source}
    return numbers, series
