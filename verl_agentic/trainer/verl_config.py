"""verl's side of the trainer: its algorithm modules (imported on first use: importing verl takes seconds)
and its config objects (``AlgoConfig``, ``ActorConfig``, ``RolloutCorrectionConfig``) made from our checked
sections, which its advantage estimators, policy losses and rollout-correction helper read."""

from __future__ import annotations

from omegaconf import DictConfig

from verl_agentic.config import RunConfig
from verl_agentic.interfaces import ConfigError


def verl_modules():
    """verl's algorithm modules (imported lazily: importing verl takes seconds)."""
    from verl.trainer.ppo import core_algos, ray_trainer
    from verl.utils import torch_functional as verl_F

    from verl_agentic.verl_plugin import turn_advantage  # noqa: F401 - registers turn_loo in core_algos

    return core_algos, ray_trainer, verl_F


def rollout_corr_helper():
    """verl's rollout-correction helper (TIS/MIS; imported lazily, as in :func:`verl_modules`)."""
    from verl.trainer.ppo import rollout_corr_helper

    return rollout_corr_helper


def training_config(cfg: DictConfig | RunConfig) -> RunConfig:
    """``cfg`` parsed, with its training sections (ppo.yaml's) required."""
    c = RunConfig.parse(cfg)
    if c.trainer is None or c.actor is None or c.algorithm is None or c.critic is None:
        raise ConfigError("training needs the sections trainer, actor, algorithm and critic: "
                          "compose ppo.yaml (load_config(..., config_name='ppo'))")
    return c


def rollout_correction_config(cfg: DictConfig | RunConfig):
    """verl's ``RolloutCorrectionConfig`` from ``algorithm.rollout_correction`` (checked by ``config.py``)."""
    from dataclasses import asdict

    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    return RolloutCorrectionConfig(**asdict(training_config(cfg).algorithm.rollout_correction))


def algo_config(cfg: DictConfig | RunConfig):
    """verl's ``AlgoConfig`` from our ``algorithm`` section (unknown estimators fail here)."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.algorithm import KLControlConfig

    a = training_config(cfg).algorithm
    core_algos, _, _ = verl_modules()
    try:
        core_algos.get_adv_estimator_fn(a.adv_estimator) if a.adv_estimator not in ("gae", "grpo") else None
    except ValueError:
        known = ", ".join(sorted(str(k) for k in core_algos.ADV_ESTIMATOR_REGISTRY))
        raise ConfigError(f"unknown algorithm.adv_estimator {a.adv_estimator!r}; verl has: {known}") from None
    return AlgoConfig(
        gamma=a.gamma, lam=a.lam, adv_estimator=a.adv_estimator, norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo,
        use_kl_in_reward=a.use_kl_in_reward, kl_penalty=a.kl_penalty,
        kl_ctrl=KLControlConfig(type=a.kl_ctrl.type, kl_coef=a.kl_ctrl.kl_coef, horizon=a.kl_ctrl.horizon,
                                target_kl=a.kl_ctrl.target_kl),
        rollout_correction=rollout_correction_config(cfg),
    )


def actor_config(cfg: DictConfig | RunConfig):
    """verl's ``ActorConfig`` (what its policy-loss functions read) from our ``actor`` section.

    ``algorithm.rollout_correction.bypass_mode``: as verl's ``apply_bypass_mode`` does, the loss becomes
    verl's ``bypass_mode`` (``loss_type`` ppo_clip or reinforce, IS/rejection inside the loss, against the
    rollout's logprobs), carrying the correction settings."""
    from verl.workers.config import ActorConfig as VerlActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    c = training_config(cfg)
    a = c.actor
    core_algos, _, _ = verl_modules()
    try:
        core_algos.get_policy_loss_fn(a.policy_loss)
    except ValueError:
        known = ", ".join(sorted(core_algos.POLICY_LOSS_REGISTRY))
        raise ConfigError(f"unknown actor.policy_loss {a.policy_loss!r}; verl has: {known}") from None
    policy_loss = PolicyLossConfig(loss_mode=a.policy_loss)
    if c.algorithm.rollout_correction.bypass_mode:
        # verl's trainer silently replaces the loss and the old logprobs here; a setting that would be
        # ignored is an error instead
        if a.policy_loss != "vanilla":
            raise ConfigError(f"algorithm.rollout_correction.bypass_mode=true uses verl's bypass_mode loss "
                              f"(loss_type=ppo_clip|reinforce), not actor.policy_loss={a.policy_loss!r}: "
                              f"leave actor.policy_loss=vanilla")
        if a.recompute_old_logprobs:
            raise ConfigError("algorithm.rollout_correction.bypass_mode=true takes the rollout's logprobs as the "
                              "old logprobs: set actor.recompute_old_logprobs=false (or bypass_mode=false)")
        policy_loss = PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=rollout_correction_config(c))
    try:
        return VerlActorConfig(
            strategy="verl_agentic", rollout_n=c.rollout.n, ppo_mini_batch_size=a.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=a.ppo_micro_batch_size, ppo_epochs=a.ppo_epochs,
            clip_ratio=a.clip_ratio, clip_ratio_low=a.clip_ratio_low, clip_ratio_high=a.clip_ratio_high,
            clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode, entropy_coeff=a.entropy_coeff,
            use_kl_loss=a.use_kl_loss, kl_loss_coef=a.kl_loss_coef, kl_loss_type=a.kl_loss_type,
            use_torch_compile=False, policy_loss=policy_loss,
        )
    except (ValueError, AssertionError) as e:
        raise ConfigError(f"actor: {e}") from None
