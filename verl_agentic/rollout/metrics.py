"""Per-task summaries of a set of trajectories, and their table on stdout."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

# Episode metrics summed (not averaged) in the summary.
SUMMED_METRICS = ("generated_tokens", "truncated_turns", "flips_wrong_to_right", "flips_right_to_wrong")


def summarize(trajectories: Iterable[dict], wall_s: float | None = None) -> dict[str, dict]:
    """``{task_type: {...}, "all": {...}}`` with reward, turns, tokens, errors and task metrics."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in trajectories:
        groups[t["task_type"]].append(t)
        groups["all"].append(t)
    out = {}
    for name, trajs in groups.items():
        n = len(trajs)
        metric_values: dict[str, list[float]] = defaultdict(list)
        for t in trajs:
            for k, v in (t.get("metrics") or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_"):
                    metric_values[k].append(float(v))
        s = {
            "episodes": n,
            "reward_mean": sum(t["reward"] for t in trajs) / n,
            "turns_mean": sum(t["num_turns"] for t in trajs) / n,
            "response_tokens_mean": sum(len(t["response_ids"]) for t in trajs) / n,
            "finish_reasons": dict(Counter(t["finish_reason"] for t in trajs)),
            "errors": dict(Counter(t["error"]["type"] for t in trajs if t["error"])),
        }
        if any("score" in t for t in trajs):  # scored by a reward manager
            scores = [t["score"] for t in trajs if t.get("score") is not None]
            s["score_mean"] = sum(scores) / len(scores) if scores else None
            s["score_errors"] = dict(Counter(t["score_error"]["type"] for t in trajs if t.get("score_error")))
        for k, vals in sorted(metric_values.items()):
            s[k] = sum(vals) if k in SUMMED_METRICS else sum(vals) / len(vals)
        if wall_s:
            s["wall_s"] = wall_s
            s["generated_tokens_per_s"] = s.get("generated_tokens", 0.0) / wall_s
        out[name] = s
    if len(out) == 2:  # a single task: "all" repeats it
        out.pop("all")
    return out


def format_table(summary: dict[str, dict]) -> str:
    """A fixed-width table: one column per task, one row per metric."""
    tasks = list(summary)
    keys: list[str] = []
    for s in summary.values():
        keys += [k for k in s if k not in keys]

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1e5 else f"{v:.3g}"
        if isinstance(v, dict):
            return ", ".join(f"{k}:{c}" for k, c in sorted(v.items())) or "-"
        return str(v)

    rows = [["metric", *tasks]] + [[k, *(fmt(summary[t].get(k, "-")) for t in tasks)] for k in keys]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
