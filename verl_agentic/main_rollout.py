"""``python -m verl_agentic.main_rollout``: dataset -> multi-turn rollouts -> trajectories + summary.

Writes ``trajectories.jsonl`` (one episode per line, the schema in docs/rollouts.md) and ``summary.json``
(per-task metrics, backend counters, token-exactness check) into ``output.dir``, and prints
the per-task summary table. All keys: ``verl_agentic/config/rollout.yaml``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from verl_agentic.interfaces import ConfigError

CONFIG_DIR = str(Path(__file__).parent / "config")
REPO_ROOT = Path(__file__).resolve().parent.parent


def load_config(overrides: Optional[list[str]] = None, config_name: str = "rollout") -> DictConfig:
    """The config with command-line style overrides, without running a hydra app (for tests, scripts)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides or []))


def resolve_data_path(path: str) -> Path:
    """Relative paths are looked up in the working directory, then in the repository root."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and (REPO_ROOT / p).exists():
        return REPO_ROOT / p
    return p


def rollout_config(cfg: DictConfig):
    from verl_agentic.rollout import RolloutConfig

    r = cfg.rollout
    return RolloutConfig(
        n=r.n, max_turns=r.max_turns, max_new_tokens=r.max_new_tokens, max_total_tokens=r.max_total_tokens,
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, concurrency=r.concurrency,
        episode_timeout_s=r.episode_timeout_s,
        chat_template_kwargs=OmegaConf.to_container(r.chat_template_kwargs) or {},
    )


def make_backend(cfg: DictConfig) -> Any:
    """The generation backend named by ``rollout.backend``."""
    backends = ("hf", "openai")
    if cfg.rollout.backend not in backends:
        raise ConfigError(f"unknown rollout.backend {cfg.rollout.backend!r}; available: {', '.join(backends)}")
    from verl_agentic.models.embedded import resolve_model_path

    if cfg.rollout.backend == "openai":  # a server generates; model.path (or openai.tokenizer) gives the tokenizer
        from verl_agentic.backends.openai_http import OpenAIBackend

        o = OmegaConf.to_container(cfg.rollout.openai, resolve=True)
        if o["api_key_env"] and o["api_key_env"] not in os.environ:
            raise ConfigError(f"rollout.openai.api_key_env={o['api_key_env']}, but that environment variable is not set")
        return OpenAIBackend.from_pretrained(
            o["tokenizer"] or resolve_model_path(cfg.model.path), o["base_url"], model=o["model"], api=o["api"],
            concurrency=o["concurrency"], request_timeout_s=o["request_timeout_s"],
            connect_timeout_s=o["connect_timeout_s"], max_retries=o["max_retries"],
            retry_backoff_s=o["retry_backoff_s"], tool_choice=o["tool_choice"],
            chat_template_kwargs=OmegaConf.to_container(cfg.rollout.chat_template_kwargs) or {},
            api_key=os.environ[o["api_key_env"]] if o["api_key_env"] else None)
    from verl_agentic.backends.hf import HFBackend, hf_options

    path = resolve_model_path(cfg.model.path)
    return HFBackend.from_pretrained(str(path), dtype=cfg.model.dtype, max_batch_size=cfg.rollout.max_batch_size,
                                     seed=cfg.seed, **hf_options(cfg.rollout.get("hf")))


def reward_manager(cfg: DictConfig):
    """The reward manager configured in ``reward``, or None for ``reward.manager=none``."""
    from verl_agentic.reward import RewardConfig, make_reward_manager

    r = OmegaConf.to_container(cfg.reward, resolve=True) if "reward" in cfg else {"manager": "none"}
    if r.get("manager") in (None, "none"):
        return None
    r.setdefault("progress", not cfg.output.quiet)
    return make_reward_manager(RewardConfig.from_dict(r))


def run(cfg: DictConfig, backend: Any = None) -> tuple[list[dict], dict]:
    """Roll out ``cfg.data`` and write the outputs; returns (trajectories, summary)."""
    import verl_agentic.tasks  # noqa: F401 - built-in tasks
    from verl_agentic.agentic_utils import load_rows
    from verl_agentic.rollout import AsyncRollout, format_table, summarize, write_jsonl
    from verl_agentic.rollout.async_rollout import resolve_tasks
    from verl_agentic.rollout.trajectory import drift_summary
    from verl_agentic.tasks import get_task

    quiet = bool(cfg.output.quiet)
    get_task(cfg.task_type)  # an unknown task_type fails before anything loads
    rollout_cfg = rollout_config(cfg)
    task_configs = OmegaConf.to_container(cfg.task, resolve=True) or {}
    rows = load_rows(resolve_data_path(cfg.data.path), cfg.task_type, cfg.data.max_samples)
    resolve_tasks(rows, cfg.task_type, task_configs)  # before the model loads
    scorer = reward_manager(cfg)  # config errors (unknown manager, missing url) before the model loads
    out_dir = Path(cfg.output.dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    own_backend = backend is None
    if own_backend:
        t0 = time.perf_counter()
        backend = make_backend(cfg)
        if not quiet:
            print(f"[verl-agentic] model loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    rollout = AsyncRollout(backend, rollout_cfg, task_configs=task_configs, default_task_type=cfg.task_type,
                           seed=cfg.seed, progress=not quiet)
    try:
        trajectories = rollout.run_sync(rows)
        reward_summary = None
        if scorer is not None:
            from verl_agentic.reward import score_trajectories

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
                     "reward": reward_summary, "config": OmegaConf.to_container(cfg, resolve=True)}
    if cfg.output.check_drift:
        summary["drift"] = drift_summary(trajectories, backend.tokenizer, rollout_cfg.chat_template_kwargs,
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
