"""``python -m verl_agentic.main_rollout``: dataset -> multi-turn rollouts -> trajectories + summary.

Writes ``trajectories.jsonl`` (one episode per line, the schema in docs/rollouts.md) and ``summary.json``
(per-task metrics, backend counters, token-exactness check) into ``output.dir``, and prints
the per-task summary table. All keys: ``verl_agentic/config/rollout.yaml``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from verl_agentic.config import (  # noqa: F401 - load_config, make_backend, ... are imported from here too
    CONFIG_DIR,
    REPO_ROOT,
    RunConfig,
    load_config,
    make_backend,
    resolve_data_path,
    reward_manager,
    reward_settings,
    rollout_config,
)
from verl_agentic.interfaces import ConfigError
from verl_agentic.reward import score_trajectories
from verl_agentic.rollout import AsyncRollout, format_table, summarize, write_jsonl
from verl_agentic.rollout.async_rollout import resolve_tasks
from verl_agentic.rollout.trajectory import drift_summary
from verl_agentic.tasks import get_task
from verl_agentic.tasks.data import load_rows


def run(cfg: DictConfig, backend: Any = None) -> tuple[list[dict], dict]:
    """Roll out ``cfg.data`` and write the outputs; returns (trajectories, summary)."""

    c = RunConfig.parse(cfg)  # every section checked before anything loads
    quiet = c.output.quiet
    get_task(c.task_type)  # an unknown task_type fails before anything loads
    rows = load_rows(resolve_data_path(c.data.path), c.task_type, c.data.max_samples)
    resolve_tasks(rows, c.task_type, c.task)  # before the model loads
    scorer = reward_manager(c)  # config errors (unknown manager, missing url) before the model loads
    out_dir = Path(c.output.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    own_backend = backend is None
    if own_backend:
        t0 = time.perf_counter()
        backend = make_backend(c)
        if not quiet:
            print(f"[verl-agentic] model loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    rollout = AsyncRollout(backend, c.rollout, task_configs=c.task, default_task_type=c.task_type,
                           seed=c.seed, progress=not quiet)
    try:
        trajectories = rollout.run_sync(rows)
        reward_summary = None
        if scorer is not None:
            t0 = time.perf_counter()
            score_trajectories(trajectories, scorer)
            reward_summary = {"manager": scorer.config.manager, "wall_s": time.perf_counter() - t0, **scorer.stats()}
    finally:
        if scorer is not None:
            scorer.close()
        if own_backend:
            import asyncio

            asyncio.run(backend.close())
    summary: dict = {"tasks": summarize(trajectories, rollout.last_wall_s), "backend": backend.stats(),
                     "stop_token_ids": list(backend.stop_token_ids or []),
                     "reward": reward_summary, "config": c.raw}
    if c.output.check_drift:
        summary["drift"] = drift_summary(trajectories, backend.tokenizer, c.rollout.chat_template_kwargs,
                                         backend.stop_token_ids)
    write_jsonl(out_dir / "trajectories.jsonl", trajectories)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if not quiet:
        print(format_table(summary["tasks"]))
        if "drift" in summary:
            d = summary["drift"]
            print(f"token exactness: {d['episodes_ok']}/{d['episodes']} episodes ok, "
                  f"{d['injected_differing_tokens']} differing injected tokens of {d['injected_tokens']}; "
                  f"re-encoding would have changed {d['reencode_changed_tokens']} of {d['generated_tokens']} "
                  f"generated tokens")
        print(f"wrote {len(trajectories)} trajectories to {out_dir / 'trajectories.jsonl'}")
    return trajectories, summary


def run_or_exit(fn: Any, cfg: DictConfig) -> None:
    """A CLI entry's body: bad input is one clear stderr line and exit code 2, not a traceback."""
    try:
        fn(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


@hydra.main(config_path="config", config_name="rollout", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    run_or_exit(run, cfg)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
