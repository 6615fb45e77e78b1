"""``python -m verl_agentic.main_ppo``: multi-turn rollouts + rewards + GRPO/PPO updates on one machine.

Writes into ``output.dir``: ``metrics.jsonl`` (one line per step), ``rollouts/step_XXXXXX.jsonl``,
``checkpoints/step_XXXXXX/`` and, at the end, ``hf_model/`` (the trained policy) and
``summary.json``. All keys: ``verl_agentic/config/ppo.yaml`` (which includes rollout.yaml).

SIGTERM or SIGINT (a preemption, Ctrl-C) and an exception during training leave a checkpoint of the
last point a run can continue from exactly, the last step boundary (``PPOTrainer.request_stop``: a stop
takes effect at once and drops the step in progress), then print the command that continues it
(``trainer.resume=true``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from verl_agentic.config import CONFIG_DIR, RunConfig
from verl_agentic.main_rollout import StopSignals, call_hydra_main, continue_command, run_or_exit


def train(cfg: DictConfig, signals: Optional[StopSignals] = None) -> list[dict]:
    """Train and write the summary; ``signals`` (the CLI's) then stop the trainer where it can checkpoint."""
    RunConfig.parse(cfg)  # a bad key or value: one line, before torch and verl load (for --help neither loads)
    from verl_agentic.trainer import PPOTrainer

    t0 = time.monotonic()
    trainer = PPOTrainer(cfg)
    if signals is not None:
        signals.on_stop = trainer.request_stop
    history = trainer.fit()
    out = Path(cfg.output.dir)
    # wall_s: this process's training, model loading included (a resumed run counts only its own part)
    summary = {"steps": trainer.step, "wall_s": round(time.monotonic() - t0, 1),
               "data": {"rows": len(trainer.data.rows), "val_rows": len(trainer.data.val_rows),
                        "skipped_rows": len(trainer.data.skipped)},
               "config": OmegaConf.to_container(cfg, resolve=True)}
    if history:
        first, last = history[: min(5, len(history))], history[-min(5, len(history)):]

        def mean(rows: list[dict], key: str) -> Optional[float]:
            vals = [r[key] for r in rows if r.get(key) is not None]
            return sum(vals) / len(vals) if vals else None

        for key in ("reward/mean", "accuracy/mean", "turns/mean", "actor/logprob_gap_mean"):
            summary[f"first5/{key}"] = mean(first, key)
            summary[f"last5/{key}"] = mean(last, key)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if not cfg.output.quiet:
        r0, r1 = summary.get("first5/reward/mean"), summary.get("last5/reward/mean")
        if r0 is not None and r1 is not None:
            print(f"reward: first-5-step mean {r0:.3f} -> last-5-step mean {r1:.3f} ({r1 - r0:+.3f})")
        print(f"metrics: {out / 'metrics.jsonl'}")
    return history


def _continue_training(cfg: DictConfig) -> str:
    return "to continue, run: " + continue_command("verl_agentic.main_ppo", sys.argv[1:], str(cfg.output.dir),
                                                   "trainer.resume=true")


# config_path absolute: see main_rollout (called from a user's script, "config" would name config.py)
@hydra.main(config_path=CONFIG_DIR, config_name="ppo", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    signals = StopSignals()
    run_or_exit(lambda c: train(c, signals), cfg, _continue_training, signals)


def main(argv: Optional[list[str]] = None) -> None:
    """``python -m verl_agentic.main_ppo [key=value ...]``, or ``main([...])`` from a script (see main_rollout)."""
    call_hydra_main(_hydra_main, argv)


if __name__ == "__main__":
    main()
