"""Reading the output dirs a report is built from: a rollout dir or a training dir.

Two layouts are accepted:

- **rollout** (``python -m verl_agentic.main_rollout``): ``trajectories.jsonl`` (one episode per
  line) and ``summary.json`` (per-task table, backend stats, config, drift totals).
- **training** (``python -m verl_agentic.main_ppo``): ``metrics.jsonl`` (one JSON object per step,
  ``"step"`` plus keys like ``reward/mean``, ``accuracy/mean``, ``actor/logprob_gap_mean``) and
  ``rollouts/step_000001.jsonl`` ... (the episodes of each step: trajectory lines plus ``"step"`` and
  optionally ``"trainer_logprobs"``, aligned with ``response_ids``, null where the mask is 0). Either
  part may be missing. verl's trainer with our ``task_agent`` loop writes the same layout into
  ``trainer.rollout_data_dir`` (``rollouts/``; verl's file logger gives ``metrics.jsonl`` as
  ``{"step": N, "data": {...}}`` lines, read the same way). The config comes from ``summary.json``, ``config.json`` or ``config.yaml``.

Malformed files raise ``ConfigError`` naming the file, the line and the field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import read_json_lines

# Fields the report needs on every episode line.
REQUIRED_FIELDS = ("task_type", "prompt_ids", "response_ids", "response_mask", "turns", "messages", "reward",
                   "num_turns", "finish_reason", "error")
CONFIG_FILES = ("summary.json", "config.json", "config.yaml")
STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


@dataclass
class Run:
    """One output dir, read: ``kind`` is ``"rollout"`` or ``"training"``."""

    path: Path
    kind: str
    trajectories: list[dict]  # training: the episodes of all steps, each with "step"
    summary: dict = field(default_factory=dict)  # summary.json ({} when absent)
    config: dict = field(default_factory=dict)  # the run's config ({} when none was found)
    steps: list[dict] = field(default_factory=list)  # metrics.jsonl rows sorted by step (training only)

    @property
    def model_path(self) -> Optional[str]:
        return (self.config.get("model") or {}).get("path")

    @property
    def step_numbers(self) -> list[int]:
        """Every step seen in metrics.jsonl or the rollouts, ascending."""
        seen = {r["step"] for r in self.steps} | {t["step"] for t in self.trajectories if t.get("step") is not None}
        return sorted(seen)


def _read_episodes(path: Path, step: Optional[int] = None) -> list[dict]:
    rows = read_json_lines(path, what="an episode", skip_torn=True)
    for n, t in enumerate(rows, 1):
        missing = [k for k in REQUIRED_FIELDS if k not in t]
        if missing:
            raise ConfigError(f"{path}: episode {n} lacks {missing} (a trajectory line needs {list(REQUIRED_FIELDS)})")
        if len(t["response_mask"]) != len(t["response_ids"]):
            raise ConfigError(f"{path}: episode {n}: response_mask has {len(t['response_mask'])} entries, "
                              f"response_ids {len(t['response_ids'])}")
        tl = t.get("trainer_logprobs")
        if tl is not None and len(tl) != len(t["response_ids"]):
            raise ConfigError(f"{path}: episode {n}: trainer_logprobs has {len(tl)} entries, "
                              f"response_ids {len(t['response_ids'])}")
        if step is not None:
            if t.get("step") is None:
                t["step"] = step
            elif not isinstance(t["step"], int):
                raise ConfigError(f"{path}: episode {n}: 'step' must be an integer, got {t['step']!r}")
    return rows


def _read_config(d: Path, summary: dict) -> dict:
    if summary.get("config"):
        return summary["config"]
    for name in CONFIG_FILES[1:]:
        p = d / name
        if p.exists():
            if name.endswith(".json"):
                cfg = json.loads(p.read_text(encoding="utf-8"))
            else:
                from omegaconf import OmegaConf

                cfg = OmegaConf.to_container(OmegaConf.load(p), resolve=False)
            return cfg if isinstance(cfg, dict) else {}
    return {}


def read_verl_metrics(path: str | Path) -> dict[int, dict]:
    """verl's file logger (``trainer.logger=[...,"file"]``, lines ``{"step": N, "data": {...}}``) as
    {step: data}, the rows of one step merged (it may log a step in parts); {} when there is no file."""
    steps: dict[int, dict] = {}
    if not Path(path).exists():
        return steps
    for row in read_json_lines(path, what="a step's metrics"):
        steps.setdefault(int(row["step"]), {}).update(row["data"])
    return steps


def load_run(output_dir: str | Path) -> Run:
    """Read a rollout or training output dir (see the module docstring for the layouts)."""
    d = Path(output_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{str(d)!r} is not a directory (expected a main_rollout output dir with "
                                f"trajectories.jsonl, or a main_ppo one with metrics.jsonl / rollouts/)")
    summary_path = d / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    config = _read_config(d, summary)
    metrics_path, rollouts_dir = d / "metrics.jsonl", d / "rollouts"
    if metrics_path.exists() or rollouts_dir.is_dir():
        steps = read_json_lines(metrics_path, what="a step's metrics", skip_torn=True) if metrics_path.exists() else []
        # verl's file logger (trainer.logger=[...,"file"]) writes {"step": N, "data": {metric: value}}
        steps = [{**row["data"], "step": row["step"]} if isinstance(row.get("data"), dict) else row for row in steps]
        for n, row in enumerate(steps, 1):
            if not isinstance(row.get("step"), int):
                raise ConfigError(f"{metrics_path}:{n}: needs an integer 'step', got {row.get('step')!r}")
        steps.sort(key=lambda r: r["step"])
        trajectories: list[dict] = []
        if rollouts_dir.is_dir():
            files = sorted((int(m.group(1)), p) for p in rollouts_dir.iterdir() if (m := STEP_FILE.match(p.name)))
            for step, p in files:
                trajectories += _read_episodes(p, step)
        if not steps and not trajectories:
            raise FileNotFoundError(f"{str(d)!r}: metrics.jsonl and rollouts/step_*.jsonl are both empty or missing")
        return Run(d, "training", trajectories, summary, config, steps)
    path = d / "trajectories.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist (expected a main_rollout output dir with "
                                f"trajectories.jsonl, or a main_ppo one with metrics.jsonl / rollouts/)")
    return Run(d, "rollout", _read_episodes(path), summary, config)
