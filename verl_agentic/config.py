"""The configuration the CLIs and the trainer share: the hydra config files, and what is built from
their sections (the rollout settings, the generation backend, the reward manager).

``verl_agentic/config/rollout.yaml`` and ``ppo.yaml`` hold every key. The generation backends load on
first use, not with this module, so a CLI's ``--help`` does not load torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from verl_agentic.interfaces import ConfigError
from verl_agentic.models.embedded import resolve_model_path
from verl_agentic.reward import RewardConfig, make_reward_manager
from verl_agentic.rollout import RolloutConfig

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

    if cfg.rollout.backend == "openai":  # a server generates; model.path (or openai.tokenizer) gives the tokenizer
        from verl_agentic.backends.openai_http import OpenAIBackend, OpenAIConfig

        settings = OpenAIConfig.from_dict(OmegaConf.to_container(cfg.rollout.openai, resolve=True))
        settings.api_key()  # a missing key is reported before the model folder is looked up
        return OpenAIBackend.from_config(settings, settings.tokenizer or resolve_model_path(cfg.model.path),
                                         chat_template_kwargs=OmegaConf.to_container(cfg.rollout.chat_template_kwargs)
                                         or {})
    # on first use (torch, transformers)
    from verl_agentic.backends.hf import HFBackend, hf_options

    path = resolve_model_path(cfg.model.path)
    return HFBackend.from_pretrained(str(path), dtype=cfg.model.dtype, max_batch_size=cfg.rollout.max_batch_size,
                                     seed=cfg.seed, **hf_options(cfg.rollout.get("hf")))


def reward_settings(cfg: DictConfig, progress: Optional[bool] = None) -> Optional[dict]:
    """The ``reward`` section, checked (``RewardConfig.from_dict`` raises on a bad key or value), as the
    dict a reward manager (or a Ray actor that builds one) is made from; None for ``manager=none``.

    ``progress``: forced when given; else the section's own, by default ``not output.quiet``.
    """
    r = OmegaConf.to_container(cfg.reward, resolve=True) if "reward" in cfg else {"manager": "none"}
    if r.get("manager") in (None, "none"):
        return None
    if progress is None:
        r.setdefault("progress", not cfg.output.quiet)
    else:
        r["progress"] = progress
    RewardConfig.from_dict(r)
    return r


def reward_manager(cfg: DictConfig):
    """The reward manager configured in ``reward``, or None for ``reward.manager=none``."""
    r = reward_settings(cfg)
    return None if r is None else make_reward_manager(RewardConfig.from_dict(r))
