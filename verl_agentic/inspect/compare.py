"""Two runs side by side (``--compare``): the same prompts paired, and the metric deltas per task.

Episodes are paired by ``(uid or index, sample_id)`` (and ``step`` when both runs are training
runs); episodes left over are paired by their prompt token ids, in order of occurrence. A pair
whose prompt messages differ (the same uid over different data) is marked, not dropped.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Optional

from verl_agentic.inspect.plots import bar_plot, line_plot, missing_plot
from verl_agentic.inspect.runs import Run
from verl_agentic.inspect.stats import accuracy_of, aggregate, step_series

# (aggregate key, label, divide by the episode count, which sign of B - A is better: 1, -1, or 0 for
# neither). Sums become per-episode rates so that runs of different sizes compare.
DELTA_METRICS = (("episodes", "episodes", False, 0), ("reward/mean", "reward", False, 1),
                 ("accuracy/mean", "accuracy", False, 1), ("score/mean", "score", False, 1),
                 ("turns/mean", "turns", False, 0), ("response_length/mean", "generated tokens", False, 0),
                 ("flips/wrong_to_right", "flips wrong->right per episode", True, 1),
                 ("flips/right_to_wrong", "flips right->wrong per episode", True, -1),
                 ("tool/calls", "tool calls per episode", True, 0), ("tool/success_rate", "tool success", False, 1))


def _id_key(t: dict, with_step: bool) -> Optional[tuple]:
    ident = t.get("uid") if t.get("uid") is not None else t.get("index")
    if ident is None:
        return None
    key = (str(ident), t.get("sample_id"))
    return (t.get("step"), *key) if with_step else key


def _prompt_key(t: dict, with_step: bool) -> tuple:
    return (t.get("step") if with_step else None, tuple(t["prompt_ids"]))


def pair_episodes(a: list[dict], b: list[dict], with_step: bool = False) -> list[tuple[int, int, str]]:
    """[(index in a, index in b, "id" | "prompt")], in a's order; each episode is in at most one pair."""
    by_id: dict[tuple, deque] = defaultdict(deque)
    for j, t in enumerate(b):
        key = _id_key(t, with_step)
        if key is not None:
            by_id[key].append(j)
    pairs: dict[int, tuple[int, str]] = {}
    used: set[int] = set()
    for i, t in enumerate(a):
        key = _id_key(t, with_step)
        if key is not None and by_id.get(key):
            j = by_id[key].popleft()
            pairs[i] = (j, "id")
            used.add(j)
    by_prompt: dict[tuple, deque] = defaultdict(deque)
    for j, t in enumerate(b):
        if j not in used:
            by_prompt[_prompt_key(t, with_step)].append(j)
    for i, t in enumerate(a):
        if i not in pairs and by_prompt.get(_prompt_key(t, with_step)):
            pairs[i] = (by_prompt[_prompt_key(t, with_step)].popleft(), "prompt")
    return [(i, j, how) for i, (j, how) in sorted(pairs.items())]


def _prompt_messages(t: dict) -> list:
    turns_msgs = sum(x.get("num_messages", 1) for x in t.get("turns") or [])
    msgs = t.get("messages") or []
    return msgs[: len(msgs) - turns_msgs]


def metric_deltas(a: list[dict], b: list[dict]) -> list[dict]:
    """[{"task", "metric", "a", "b", "delta", "better"}] per task (and "all" over several tasks); None where a
    run lacks the metric."""
    def groups(trajs: list[dict]) -> dict[str, list[dict]]:
        g: dict[str, list[dict]] = defaultdict(list)
        for t in trajs:
            g[t.get("task_type") or "?"].append(t)
        return g

    ga, gb = groups(a), groups(b)
    tasks = sorted(set(ga) | set(gb))
    if len(tasks) > 1:
        tasks.append("all")
        ga["all"], gb["all"] = list(a), list(b)
    rows = []
    for task in tasks:
        sa, sb = aggregate(ga.get(task, []), per_task=False), aggregate(gb.get(task, []), per_task=False)
        for key, label, per_episode, better in DELTA_METRICS:
            va, vb = sa.get(key), sb.get(key)
            if va is None and vb is None:
                continue
            if per_episode:
                va = va / sa["episodes"] if va is not None else None
                vb = vb / sb["episodes"] if vb is not None else None
            rows.append({"task": task, "metric": label, "a": va, "b": vb, "better": better,
                         "delta": vb - va if va is not None and vb is not None else None})
    return rows


def compare_runs(run_a: Run, run_b: Run, name_a: str, name_b: str) -> dict:
    """The comparison part of the report's data: pairs (light rows), pair counts, deltas and plots."""
    with_step = run_a.kind == run_b.kind == "training"
    a, b = run_a.trajectories, run_b.trajectories
    pairs = []
    for k, (i, j, how) in enumerate(pair_episodes(a, b, with_step)):
        ta, tb = a[i], b[j]
        acc_a, acc_b = accuracy_of(ta), accuracy_of(tb)
        pairs.append({"k": k, "a": i, "b": j, "by": how, "uid": ta.get("uid"), "sample_id": ta.get("sample_id"),
                      "step": ta.get("step") if with_step else None, "task_type": ta.get("task_type"),
                      "reward_a": ta["reward"], "reward_b": tb["reward"], "delta": tb["reward"] - ta["reward"],
                      "acc_a": acc_a, "acc_b": acc_b, "turns_a": ta["num_turns"], "turns_b": tb["num_turns"],
                      "same_prompt": _prompt_messages(ta) == _prompt_messages(tb)})
    counts = {"pairs": len(pairs), "by_id": sum(p["by"] == "id" for p in pairs),
              "by_prompt": sum(p["by"] == "prompt" for p in pairs),
              "only_a": len(a) - len(pairs), "only_b": len(b) - len(pairs),
              "prompt_differs": sum(not p["same_prompt"] for p in pairs),
              "b_better": sum(p["delta"] > 0 for p in pairs), "a_better": sum(p["delta"] < 0 for p in pairs),
              "same_reward": sum(p["delta"] == 0 for p in pairs),
              "wrong_a_right_b": sum(p["acc_a"] == 0 and (p["acc_b"] or 0) > 0 for p in pairs),
              "right_a_wrong_b": sum((p["acc_a"] or 0) > 0 and p["acc_b"] == 0 for p in pairs)}
    deltas = metric_deltas(a, b)
    return {"name_a": name_a, "name_b": name_b, "pairs": pairs, "counts": counts, "deltas": deltas,
            "with_step": with_step, "plots": _compare_plots(run_a, run_b, name_a, name_b, deltas)}


def _compare_plots(run_a: Run, run_b: Run, name_a: str, name_b: str, deltas: list[dict]) -> list[dict]:
    out = []
    for metric, pid, title in (("reward", "cmp_reward_tasks", "Reward by task"),
                               ("accuracy", "cmp_accuracy_tasks", "Accuracy by task")):
        rows = [r for r in deltas if r["metric"] == metric]
        if not rows:
            out.append(missing_plot(pid, title, "compare", f"neither run has {metric} values"))
            continue
        out.append(bar_plot(pid, title, "compare", "task", metric, [r["task"] for r in rows],
                            [{"name": name_a, "y": [r["a"] for r in rows]},
                             {"name": name_b, "y": [r["b"] for r in rows]}]))
    if run_a.kind == run_b.kind == "training":
        (xa, sa), (xb, sb) = step_series(run_a.steps, run_a.trajectories), step_series(run_b.steps, run_b.trajectories)
        x = sorted(set(xa) | set(xb))
        ya = dict(zip(xa, (sa.get("reward/mean") or {"y": [None] * len(xa)})["y"]))
        yb = dict(zip(xb, (sb.get("reward/mean") or {"y": [None] * len(xb)})["y"]))
        out.append(line_plot("cmp_reward_steps", "Reward per step", "compare", "step", "mean reward", x,
                             [{"name": name_a, "y": [ya.get(s) for s in x]},
                              {"name": name_b, "y": [yb.get(s) for s in x]}]))
    else:
        out.append(missing_plot("cmp_reward_steps", "Reward per step", "compare",
                                "needs two training runs (per-step metrics)"))
    return out
