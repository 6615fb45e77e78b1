"""The report's plots: one spec per plot, drawn twice from the same numbers.

A spec is a plain dict, embedded in the page (``report.js`` draws it as inline SVG) and drawn
with matplotlib into ``plots/<id>.png`` next to ``index.html``:

- ``{"id", "title", "group", "kind": "line", "xlabel", "ylabel", "x": [...], "series": [{"name", "y", "source"?}]}``
- ``{"id", "title", "group", "kind": "bar", "xlabel", "ylabel", "categories": [...], "series": [{"name", "y"}]}``
- ``{"id", "title", "group", "missing": "why there is no data"}``: shown as one line, no empty axes.

``group`` is ``"steps"`` (per training step, from ``metrics.jsonl`` or derived from ``rollouts/``)
or ``"episodes"`` (distributions over the run's episodes).

A line plot may carry ``"markers": [{"x", "label"}]``: the steps where a reward-hacking or collapse
monitor started firing (``verl_agentic.monitors``), drawn as dashed vertical lines on every step
plot; the ``monitors`` plot shows each monitor's statistic over its threshold (a monitor fires at 1).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from verl_agentic.inspect.runs import Run
from verl_agentic.interfaces import ConfigError
from verl_agentic.inspect.stats import logprob_gaps, step_series
from verl_agentic.monitors import MonitorsConfig, from_metrics, make_monitors

# matplotlib's tab10, also used by report.js so the PNGs and the page agree.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
HIST_BINS = 12
MARKER_COLOR = "#d62728"  # the monitors' firing steps (report.css .marker too)


def line_plot(pid: str, title: str, group: str, xlabel: str, ylabel: str, x: list, series: list[dict]) -> dict:
    return {"id": pid, "title": title, "group": group, "kind": "line", "xlabel": xlabel, "ylabel": ylabel,
            "x": x, "series": series}


def bar_plot(pid: str, title: str, group: str, xlabel: str, ylabel: str, categories: list[str],
             series: list[dict]) -> dict:
    return {"id": pid, "title": title, "group": group, "kind": "bar", "xlabel": xlabel, "ylabel": ylabel,
            "categories": categories, "series": series}


def missing_plot(pid: str, title: str, group: str, why: str) -> dict:
    return {"id": pid, "title": title, "group": group, "missing": why}


def _by_task(trajectories: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in trajectories:
        groups[t.get("task_type") or "?"].append(t)
    return dict(sorted(groups.items()))


def histogram(values_by_name: dict[str, list[float]], bins: int = HIST_BINS, integer: bool = False
              ) -> tuple[list[str], list[dict]]:
    """(bin labels "lo–hi", [{"name", "y": counts}]) over shared bins; integer data gets integer edges."""
    allv = [v for vs in values_by_name.values() for v in vs]
    lo, hi = min(allv), max(allv)
    if integer:
        width = max(1, math.ceil((hi - lo + 1) / bins))
        edges = [lo + k * width for k in range(math.ceil((hi - lo + 1) / width) + 1)]
        labels = [str(a) if b - a == 1 else f"{a}\u2013{b - 1}" for a, b in zip(edges, edges[1:])]
    else:
        width = (hi - lo) / bins or 1.0
        edges = [lo + k * width for k in range(bins + 1)]
        labels = [f"{a:.3g}\u2013{b:.3g}" for a, b in zip(edges, edges[1:])]
    n = len(edges) - 1
    series = []
    for name, vs in values_by_name.items():
        counts = [0] * n
        for v in vs:
            counts[min(n - 1, int((v - lo) // width))] += 1
        series.append({"name": name, "y": counts})
    return labels, series


# (id, title, y label, which series keys, the keys metrics.jsonl would have, why the episodes give none;
# None: the episodes always give it)
STEP_PLOTS = (
    ("reward", "Reward per step", "mean reward", lambda k: k.startswith("reward/") and k.endswith("/mean"),
     "reward/mean", None),
    ("accuracy", "Accuracy per step", "accuracy", lambda k: k.startswith("accuracy/"),
     "accuracy/*", "no final_correct or score_extra.acc in the episodes"),
    ("tool_success_steps", "Tool success per step", "ok / calls", lambda k: k == "tool/success_rate",
     "tool/success_rate", "no tool calls in any step"),
    ("flips_steps", "Feedback flips per step", "episodes", lambda k: k.startswith("flips/"),
     "flips/*", "no flips_* metrics in the episodes (no answer feedback)"),
    ("response_length_steps", "Response length per step", "generated tokens",
     lambda k: k in ("response_length/mean", "response_length/max"), "response_length/*", None),
    ("validation", "Held-out episodes (greedy) per step", "rate over episodes",
     lambda k: k.startswith("val/") and "reward/" not in k and not k.endswith("episodes"), "val/*",
     "no validation in this run (main_ppo's data.val_path)"),
    ("logprob_gap_steps", "Rollout vs trainer logprob gap per step", "|logprob difference|",
     lambda k: k in ("actor/logprob_gap_mean", "actor/logprob_gap_max"), "actor/logprob_gap_*",
     "no trainer_logprobs in the episodes"),
)


def monitor_history(run: Run) -> tuple[list[int], dict[str, list], list[dict]]:
    """(steps, {monitor: statistic / threshold per step (None where it had none)}, firings [{"x", "label"}]).

    From the ``monitor/*`` metrics a run logged; a run that logged none (before the monitors existed,
    or verl's trainer without the plugin's hook) is replayed through the monitors from its metrics
    (``monitors.from_metrics``; verl's names when the rows have ``training/global_step``)."""
    config = (run.config.get("trainer") or {}).get("monitors") or {}
    try:
        monitors = make_monitors(MonitorsConfig(thresholds={k: v for k, v in (config.get("thresholds") or {}).items()
                                                            if v is not None}))
    except ConfigError:  # a report shows the defaults rather than fail on a run's odd config
        monitors = make_monitors()
    spec = {m.name: m for m in monitors.monitors}
    logged = any(k.startswith("monitor/") for r in run.steps for k in r)
    names = "verl" if any("training/global_step" in r for r in run.steps) else "ours"
    steps, values, firings, was = [], {name: [] for name in spec}, [], {}
    for row in run.steps:
        if logged:
            now = {name: row.get(f"monitor/{name}") for name in spec}
            fired = []
            for name in spec:
                if f"monitor/{name}/firing" in row:
                    on = row[f"monitor/{name}/firing"] == 1.0
                    if on and not was.get(name):
                        fired.append(name)
                    was[name] = on
        else:
            fired = [f.monitor for f in monitors.observe(row["step"], from_metrics(row, names))]
            now = dict(monitors.values)
        steps.append(row["step"])
        for name, m in spec.items():
            v = now.get(name)
            rel = None if v is None else (v / m.threshold if m.direction == "above" else m.threshold / max(v, 1e-12))
            values[name].append(None if rel is None or not math.isfinite(rel) else rel)
        firings += [{"x": row["step"], "label": name} for name in fired]
    return steps, {k: v for k, v in values.items() if any(x is not None for x in v)}, firings


def _step_plots(run: Run) -> list[dict]:
    if run.kind != "training":
        return [missing_plot(pid, title, "steps", "a rollout dir has no training steps (no metrics.jsonl or rollouts/)")
                for pid, title, *_ in [*STEP_PLOTS, ("monitors", "Monitors per step")]]
    out = _curves(run)
    steps, values, firings = monitor_history(run)
    if values:
        out.append(line_plot("monitors", "Monitors per step (statistic / threshold: fires at 1)", "steps", "step",
                             "statistic / threshold", steps, [{"name": k, "y": v, "source": "monitors"}
                                                              for k, v in values.items()]))
    else:
        out.append(missing_plot("monitors", "Monitors per step", "steps", "no metrics.jsonl rows the monitors can read"))
    for p in out:
        if firings and "missing" not in p:
            p["markers"] = firings
    return out


def _curves(run: Run) -> list[dict]:
    numbers, series = step_series(run.steps, run.trajectories)
    tasks = {t.get("task_type") for t in run.trajectories}
    out = []
    for pid, title, ylabel, wanted, logged_keys, episodes_why in STEP_PLOTS:
        keys = [k for k in series if wanted(k)]
        if pid == "reward" and len(tasks) <= 1:  # one task: its curve is reward/mean again
            keys = [k for k in keys if k == "reward/mean"] or keys
        keys = [k for k in keys if any(y is not None for y in series[k]["y"])]
        if not keys:
            why = f"no {logged_keys} in metrics.jsonl, " + (episodes_why if run.trajectories else "no rollouts/")
            out.append(missing_plot(pid, title, "steps", why))
            continue
        out.append(line_plot(pid, title, "steps", "step", ylabel, numbers,
                             [{"name": k, "y": series[k]["y"], "source": series[k]["source"]} for k in keys]))
    return out


def _metric_sum(trajs: list[dict], key: str) -> float:
    return float(sum((t.get("metrics") or {}).get(key) or 0 for t in trajs))


def _episode_plots(run: Run) -> list[dict]:
    trajs = run.trajectories
    scope = f" (all {len(run.step_numbers)} steps)" if run.kind == "training" else ""
    tasks = _by_task(trajs)
    out = []
    if not trajs:
        return [missing_plot(pid, title, "episodes", "no episodes (no rollouts/step_*.jsonl)") for pid, title in
                (("turns", "Turns per episode"), ("tool_outcomes", "Tool calls by outcome"),
                 ("flips", "Feedback flips"), ("response_length", "Response length"),
                 ("logprob_gap", "Logprob gap per episode"))]
    turns = sorted({t["num_turns"] for t in trajs})
    out.append(bar_plot("turns", "Turns per episode" + scope, "episodes", "assistant turns", "episodes",
                        [str(k) for k in turns],
                        [{"name": task, "y": [sum(t["num_turns"] == k for t in ts) for k in turns]}
                         for task, ts in tasks.items()]))
    if any(_metric_sum(ts, "tool_calls") or _metric_sum(ts, "parse_errors") for ts in tasks.values()):
        out.append(bar_plot("tool_outcomes", "Tool calls by outcome" + scope, "episodes", "outcome", "calls",
                            ["ok", "error", "timeout", "parse error"],
                            [{"name": task, "y": [_metric_sum(ts, k) for k in
                                                  ("tool_ok", "tool_error", "tool_timeout", "parse_errors")]}
                             for task, ts in tasks.items()]))
    else:
        out.append(missing_plot("tool_outcomes", "Tool calls by outcome", "episodes",
                                "no tool calls and no tool-call parse errors in this run"))
    flip_tasks = {task: ts for task, ts in tasks.items()
                  if any("flips_wrong_to_right" in (t.get("metrics") or {}) for t in ts)}
    if flip_tasks:
        out.append(bar_plot("flips", "Feedback flips" + scope, "episodes", "flip", "episodes",
                            ["wrong -> right", "right -> wrong"],
                            [{"name": task, "y": [_metric_sum(ts, "flips_wrong_to_right"),
                                                  _metric_sum(ts, "flips_right_to_wrong")]}
                             for task, ts in flip_tasks.items()]))
    else:
        out.append(missing_plot("flips", "Feedback flips", "episodes",
                                "no episode has flips_* metrics (no task with answer feedback)"))
    labels, series = histogram({task: [sum(t["response_mask"]) for t in ts] for task, ts in tasks.items()},
                               integer=True)
    out.append(bar_plot("response_length", "Response length" + scope, "episodes", "generated tokens (mask 1)",
                        "episodes", labels, series))
    gaps = {}
    for task, ts in tasks.items():
        per_ep = [sum(g) / len(g) for g in map(logprob_gaps, ts) if g]
        if per_ep:
            gaps[task] = per_ep
    if gaps:
        labels, series = histogram(gaps)
        out.append(bar_plot("logprob_gap", "Rollout vs trainer logprob gap per episode" + scope, "episodes",
                            "mean |logprob difference| over trained tokens", "episodes", labels, series))
    else:
        out.append(missing_plot("logprob_gap", "Rollout vs trainer logprob gap per episode", "episodes",
                                "no trainer_logprobs in the episodes (main_ppo's rollouts/ carry them)"))
    return out


def run_plots(run: Run) -> list[dict]:
    """Every plot of one run's view, in display order."""
    return _step_plots(run) + _episode_plots(run)


def write_pngs(plots: list[dict], out_dir: Path, prefix: str = "plots") -> list[Path]:
    """Draw every plot that has data into ``out_dir/<prefix>/<id>.png``; sets ``plot["png"]`` (relative path)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    (out_dir / prefix).mkdir(parents=True, exist_ok=True)
    for p in plots:
        if "missing" in p:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
        try:
            _draw(ax, p)
            ax.set_title(p["title"], fontsize=10)
            ax.set_xlabel(p["xlabel"])
            ax.set_ylabel(p["ylabel"])
            ax.grid(alpha=0.3)
            if len(p["series"]) > 1 or p["kind"] == "bar":
                ax.legend(fontsize=8)
            fig.tight_layout()
            rel = f"{prefix}/{p['id']}.png"
            fig.savefig(out_dir / rel)
        finally:
            plt.close(fig)
        p["png"] = rel
        written.append(out_dir / rel)
    return written


def _draw(ax: Any, p: dict) -> None:
    if p["kind"] == "line":
        for k, s in enumerate(p["series"]):
            ys = [math.nan if y is None else y for y in s["y"]]
            ax.plot(p["x"], ys, marker="o", markersize=3, color=PALETTE[k % len(PALETTE)], label=s["name"])
        for m in p.get("markers") or ():  # a monitor started firing at this step
            ax.axvline(m["x"], linestyle="--", linewidth=1, color=MARKER_COLOR, alpha=0.7)
            ax.annotate(m["label"], (m["x"], 1.0), xycoords=("data", "axes fraction"), rotation=90, va="top",
                        ha="right", fontsize=6, color=MARKER_COLOR)
        return
    cats, series = p["categories"], p["series"]
    width = 0.8 / max(1, len(series))
    for k, s in enumerate(series):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(cats))]
        ys = [math.nan if y is None else y for y in s["y"]]  # a category one series lacks (compare: a task)
        ax.bar(xs, ys, width=width, color=PALETTE[k % len(PALETTE)], label=s["name"])
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=30 if max((len(c) for c in cats), default=0) > 4 else 0, fontsize=8,
                       ha="right" if max((len(c) for c in cats), default=0) > 4 else "center")
