"""What the trainer logs: each step's metrics of its episodes and of the held-out validation, written to
``output.dir/metrics.jsonl`` (one line a step; step 0: the base model's validation), the step's episodes
to ``rollouts/step_XXXXXX.jsonl``, and the same metrics to verl's ``Tracking`` backends
(``trainer.logger``: tensorboard, wandb, console)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

import numpy as np

from verl_agentic.config import RunConfig
from verl_agentic.interfaces import FINISH_INVALID_TOOL_CALLS
from verl_agentic.jsonl import JsonLinesAppender
from verl_agentic.rollout import write_jsonl


def rollout_metrics(trajs: list[dict], rewards: list[Optional[float]]) -> dict[str, float]:
    """Reward, accuracy, turns, flips, tools, lengths and errors of one step's episodes."""
    m: dict[str, float] = {}
    scored = [r for r in rewards if r is not None]
    if scored:
        m["reward/mean"] = float(np.mean(scored))
        m["reward/std"] = float(np.std(scored))
        m["reward/max"] = float(np.max(scored))
        m["reward/min"] = float(np.min(scored))
    m["reward/masked"] = float(len(rewards) - len(scored))
    m["reward/missing_share"] = m["reward/masked"] / max(1, len(rewards))
    by_task: dict[str, list[float]] = defaultdict(list)
    for t, r in zip(trajs, rewards):
        if r is not None:
            by_task[t["task_type"]].append(r)
    if len(by_task) > 1:
        for task, vals in by_task.items():
            m[f"reward/{task}/mean"] = float(np.mean(vals))

    def collect(key: str) -> list[float]:
        return [float(t["metrics"][key]) for t in trajs if isinstance((t.get("metrics") or {}).get(key), (int, float))]

    for key, name in (("final_correct", "accuracy/mean"), ("first_correct", "accuracy/first_turn")):
        vals = collect(key)
        if vals:
            m[name] = float(np.mean(vals))
    m["turns/mean"] = float(np.mean([t["num_turns"] for t in trajs]))
    m["turns/max"] = float(max(t["num_turns"] for t in trajs))
    m["turns/multi_turn_frac"] = float(np.mean([t["num_turns"] > 1 for t in trajs]))
    for key in ("flips_wrong_to_right", "flips_right_to_wrong"):
        m["flips/" + key[len("flips_"):]] = float(sum(collect(key)))
    calls = sum(collect("tool_calls"))
    errors = sum(collect("tool_error")) + sum(collect("tool_timeout"))
    if calls:
        m["tool/calls"] = float(calls)
        m["tool/success_rate"] = float((calls - errors) / calls)
    if collect("invalid_tool_calls"):  # tasks with tools: the invalid-tool-call policy (tools/runner.py)
        m["tool/invalid_calls"] = float(sum(collect("invalid_tool_calls")))
        stops: dict[str, float] = defaultdict(float)
        for t in trajs:
            stops[t["task_type"]] += float(t.get("finish_reason") == FINISH_INVALID_TOOL_CALLS)
        m["episode/invalid_tool_call_stops"] = sum(stops.values())
        if len(stops) > 1:
            m.update({f"episode/{task}/invalid_tool_call_stops": n for task, n in stops.items()})
    gen = [sum(t["response_mask"]) for t in trajs]
    m["response_length/mean"] = float(np.mean(gen))
    m["response_length/max"] = float(np.max(gen))
    # turns cut by max_new_tokens (or by the episode's token budget); verl's name, counted per turn here
    turns = [u for t in trajs for u in t.get("turns") or [] if u.get("role") == "assistant"]
    if turns:
        m["response_length/clip_ratio"] = float(np.mean([u.get("finish_reason") == "length" for u in turns]))
    m["response_length/episode_clip_ratio"] = float(np.mean([t.get("finish_reason") == "length" for t in trajs]))
    m["episode/errors"] = float(sum(1 for t in trajs if t.get("error")))
    return m


def validation_metrics(trajs: list[dict], rewards: list[Optional[float]]) -> dict[str, float]:
    """Held-out metrics of greedy episodes, as rates over episodes: reward, first-turn and final accuracy,
    wrong->right and right->wrong flip rates, answered rate (each where the task reports it: gsm8k's
    ``first_correct``, ``final_correct``, ``flips_*``, ``answered``), per task when there are several."""
    out: dict[str, float] = {}
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajs):
        by_task[t["task_type"]].append(i)
    groups = {"": list(range(len(trajs)))}
    if len(by_task) > 1:
        groups.update({f"{task}/": idx for task, idx in sorted(by_task.items())})
    names = (("first_correct", "accuracy/first_turn"), ("final_correct", "accuracy/final"),
             ("flips_wrong_to_right", "flip_rate/wrong_to_right"), ("flips_right_to_wrong", "flip_rate/right_to_wrong"),
             ("answered", "answered"))
    for prefix, idx in groups.items():
        scored = [rewards[i] for i in idx if rewards[i] is not None]
        if scored:
            out[prefix + "reward/mean"] = float(np.mean(scored))
        for key, name in names:
            vals = [float(trajs[i]["metrics"][key]) for i in idx
                    if isinstance((trajs[i].get("metrics") or {}).get(key), (int, float))]
            if vals:
                out[prefix + name] = float(np.mean(vals))
        out[prefix + "episodes"] = float(len(idx))
    return out


def warn_missing_rewards(step: int, trajs: list[dict], rewards: list[Optional[float]], metrics: dict[str, float],
                         threshold: float) -> None:
    """One warning line when more than ``threshold`` (``trainer.warn_missing_reward_share``) of the step's
    episodes have no reward, with the error types; the step trains on the rest."""
    if metrics["reward/missing_share"] <= threshold:
        return
    errors = Counter((t.get("score_error") or {}).get("type", "no score") for t, r in zip(trajs, rewards) if r is None)
    print(f"[verl-agentic] warning: step {step}: {int(metrics['reward/masked'])} of {len(trajs)} episodes have no "
          f"reward ({', '.join(f'{k}: {v}' for k, v in errors.most_common())}); the step trains on the rest "
          f"(reward/missing_share, trainer.warn_missing_reward_share={threshold})", file=sys.stderr)


class MetricsLog:
    """``metrics.jsonl`` (every line whole: a full disk is an error naming the file), the rollouts of each
    step (``trainer.save_rollouts``) and the tracker of ``trainer.logger``."""

    def __init__(self, c: RunConfig, out_dir: Path) -> None:
        self.path = out_dir / "metrics.jsonl"
        self.rollouts = out_dir / "rollouts" if c.trainer.save_rollouts else None
        self.tracker = None
        backends = [b for b in c.trainer.logger if b != "jsonl"]
        if backends:
            # verl's Tracking, on first use: importing verl takes seconds
            from verl.utils.tracking import Tracking

            os.environ.setdefault("TENSORBOARD_DIR", str(out_dir / "tensorboard"))
            self.tracker = Tracking(project_name=c.trainer.project_name, experiment_name=c.trainer.experiment_name,
                                    default_backend=backends, config=c.raw)

    def write(self, step: int, metrics: dict[str, float], trajs: list[dict]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with JsonLinesAppender(self.path) as out:
            out.append({"step": step, **clean})
        if self.rollouts is not None and trajs:
            self.rollouts.mkdir(exist_ok=True)
            write_jsonl(self.rollouts / f"step_{step:06d}.jsonl", trajs)
        if self.tracker is not None:
            self.tracker.log(data={k: v for k, v in clean.items() if v is not None}, step=step)

    def keep_until(self, step: int) -> list[dict]:
        """A resumed run at ``step``: the lines of later steps dropped (they will be redone; at step 0 that
        includes the base model's validation); returns the lines kept."""
        if not self.path.exists():
            return []
        keep = [ln for ln in self.path.read_text().splitlines()
                if ln.strip() and step > 0 and json.loads(ln).get("step", 0) <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))
        return [json.loads(ln) for ln in keep]

    def close(self) -> None:
        if self.tracker is not None:
            del self.tracker
            self.tracker = None
