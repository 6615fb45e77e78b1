"""The single-machine trainer: rollouts -> rewards -> advantages -> policy update, on verl's algorithms.

One step::

    rows = next prompts                          (seeded shuffle, resumable position)
    trajectories = AsyncRollout(rows, n)         (the HF backend shares the policy's weights)
    scores = reward manager (or the episodes' own rewards)
    batch = pad (verl layout), token-level scores on each episode's last generated token
    [ref logprobs, old values]                   (when KL or GAE need them)
    old logprobs = rollout logprobs | recomputed (actor.recompute_old_logprobs, or rollout correction on);
                   the gap is logged
    [in-reward KL]  verl ray_trainer.apply_kl_penalty
    [rollout correction]  verl rollout_corr_helper.compute_rollout_correction_and_add_to_batch (algorithm.
                   rollout_correction: TIS/MIS): IS weights for the policy loss, rejection in response_mask,
                   rollout_corr/* metrics (whenever old logprobs were recomputed), as verl's trainer does
    advantages      verl ray_trainer.compute_advantage -> core_algos registry (grpo, rloo, gae, ...)
    update          per mini-batch (micro-batches accumulate): verl's policy-loss registry
                    (clipped PPO), agg_loss modes, entropy bonus, KL loss, value loss; clip; AdamW
    monitors        the step's batch summary -> reward-hacking / collapse monitors (monitor/*, a warning
                    when one fires; trainer.monitors.stop_on ends training after that step)
    metrics -> metrics.jsonl (+ tensorboard/wandb/console through verl's Tracking); checkpoint
    [validation]    greedy episodes (n=1) on data.val_path: before the first step and every
                    trainer.test_freq steps -> val/* in that step's metrics row (step 0: before training)

The loss only sees tokens whose ``response_mask`` is 1 (the model's own tokens): every loss
term is aggregated by verl's ``agg_loss`` over that mask.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import random
import shutil
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

import verl_agentic.trainer.checkpoint as ckpt
from verl_agentic.backends.hf import HFBackend, hf_options
from verl_agentic.config import RunConfig, check_task_scorers, resolve_data_path, reward_manager, reward_settings
from verl_agentic.interfaces import FINISH_INVALID_TOOL_CALLS, ConfigError
from verl_agentic.jsonl import JsonLinesAppender
from verl_agentic.models.embedded import resolve_model_path
from verl_agentic.monitors import batch_summary, from_metrics, heldout_summary, make_monitors, merge, numeric
from verl_agentic.record import RecordingWriter, recording_header
from verl_agentic.reward import REWARD_MANAGERS, score_trajectories
from verl_agentic.rollout import AsyncRollout, write_jsonl
from verl_agentic.rollout.async_rollout import resolve_tasks
from verl_agentic.tasks import get_task
from verl_agentic.tasks.data import BadRow, load_rows, write_skipped_rows
from verl_agentic.trainer.batch import TrainBatch, build_batch, to_dataproto


def _verl():
    """verl's algorithm modules (imported lazily: importing verl takes seconds)."""
    from verl.trainer.ppo import core_algos, ray_trainer
    from verl.utils import torch_functional as verl_F

    from verl_agentic.verl_plugin import turn_advantage  # noqa: F401 - registers turn_loo in core_algos

    return core_algos, ray_trainer, verl_F


def _rollout_corr_helper():
    """verl's rollout-correction helper (TIS/MIS; imported lazily, as in :func:`_verl`)."""
    from verl.trainer.ppo import rollout_corr_helper

    return rollout_corr_helper


# ----------------------------------------------------------------------------------------------
# config


def _training(cfg: DictConfig | RunConfig) -> RunConfig:
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

    return RolloutCorrectionConfig(**asdict(_training(cfg).algorithm.rollout_correction))


def algo_config(cfg: DictConfig | RunConfig):
    """verl's ``AlgoConfig`` from our ``algorithm`` section (unknown estimators fail here)."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.config.algorithm import KLControlConfig

    a = _training(cfg).algorithm
    core_algos, _, _ = _verl()
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

    c = _training(cfg)
    a = c.actor
    core_algos, _, _ = _verl()
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


# ----------------------------------------------------------------------------------------------
# forward passes


@dataclass
class ForwardOut:
    log_probs: torch.Tensor  # [b, R]
    entropy: Optional[torch.Tensor] = None  # [b, R]
    values: Optional[torch.Tensor] = None  # [b, R]


def forward_batch(model: torch.nn.Module, mb: TrainBatch, temperature: float, *, entropy: str | bool = False,
                  value_head: Optional[torch.nn.Module] = None, bf16: bool = False) -> ForwardOut:
    """Logprobs of ``mb.responses`` under ``model`` at ``temperature`` (as the rollout computed them).

    ``entropy``: ``"grad"`` (a loss term), ``"metric"``/True (no graph) or False (not computed).

    Only the response positions' logits are materialised (``logits_to_keep``). ``values`` (GAE)
    come from ``value_head`` on the last hidden state at the position before each token.
    """
    _, _, verl_F = _verl()
    r = mb.response_len
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                    use_cache=False, logits_to_keep=r + 1, output_hidden_states=value_head is not None)
    logits = out.logits[:, :-1].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    result = ForwardOut(log_probs=verl_F.logprobs_from_logits(logits, mb.responses))
    if entropy:
        # Without an entropy bonus the entropy is a metric only: no graph (saves a softmax-sized
        # tensor kept for backward per micro-batch).
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            result.entropy = verl_F.entropy_from_logits(logits)
    if value_head is not None:
        hidden = out.hidden_states[-1][:, mb.prompt_len - 1: mb.prompt_len - 1 + r].float()
        result.values = value_head(hidden).squeeze(-1)
    return result


def _release_memory() -> None:
    """Give freed heap back to the OS after a step.

    Every step allocates tensors of new shapes (KV caches of each batch, logits of each
    micro-batch); glibc keeps the freed blocks, and the trainer's RSS grew ~0.3 GB per step on
    SmolLM2 without this.
    """
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# verl policy losses whose value and gradient are 0 for a token with advantage 0 (checked for each
# by tests/test_trainer.py); kl_cov and dro add terms that are not, bypass_mode is left out
ZERO_AT_ZERO_ADVANTAGE = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "geo_mean", "cispo")


def _chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


# ----------------------------------------------------------------------------------------------
# metrics of a step's trajectories


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


# ----------------------------------------------------------------------------------------------
# the trainer


class PPOTrainer:
    """Trains ``model.path`` on ``task_type`` rollouts. See the module docstring and ``config/ppo.yaml``."""

    def __init__(self, cfg: DictConfig, model: Any = None, tokenizer: Any = None) -> None:
        self.cfg = cfg
        c = self.conf = _training(cfg)  # every section checked once, before anything loads
        t = c.trainer
        self.quiet = c.output.quiet
        get_task(c.task_type)
        self.rollout_cfg = c.rollout
        self.algo = algo_config(c)
        self.actor_cfg = actor_config(c)
        rc = self.correction = c.algorithm.rollout_correction
        # decoupled rollout correction (verl's default mode) weighs pi_old / pi_rollout: pi_old must be the
        # trainer's own logprobs, so they are recomputed whatever actor.recompute_old_logprobs says
        self.recompute_old = c.actor.recompute_old_logprobs or (rc.corrects and not rc.bypass_mode)
        if rc.corrects or rc.bypass_mode:
            how = ("bypass_mode: old logprobs = the rollout's, verl's bypass_mode loss (loss_type="
                   f"{rc.loss_type})") if rc.bypass_mode else (
                "old logprobs recomputed by the trainer" + ("" if c.actor.recompute_old_logprobs else
                                                            " (actor.recompute_old_logprobs=false overridden)"))
            self._log(f"rollout correction on (rollout_is={rc.rollout_is}, threshold {rc.rollout_is_threshold}; "
                      f"rollout_rs={rc.rollout_rs}, threshold {rc.rollout_rs_threshold}): {how}")
        self.task_configs = c.task
        self.skipped_rows: list[BadRow] = []  # data.on_bad_row=skip: written to output.dir/skipped_rows.jsonl
        self.rows = load_rows(resolve_data_path(c.data.path), c.task_type, c.data.max_samples,
                              on_bad_row=c.data.on_bad_row, skipped=self.skipped_rows)
        resolved = resolve_tasks(self.rows, c.task_type, self.task_configs)
        self.val_rows: list[dict] = []
        if c.data.val_path:
            self.val_rows = load_rows(resolve_data_path(c.data.val_path), c.task_type, c.data.val_max_samples,
                                      on_bad_row=c.data.on_bad_row, skipped=self.skipped_rows)
            resolve_tasks(self.val_rows, c.task_type, self.task_configs)
        self.val_rollout_cfg = replace(self.rollout_cfg, n=1, temperature=0.0)  # greedy, one episode a row
        self.monitors = make_monitors(t.monitors) if t.monitors.enabled else None
        self._heldout_trajs: list[dict] = []  # the episodes of a validation at this step, for the monitors
        self.test_freq = t.test_freq
        self.use_ray = t.use_ray
        self.scorer_config = reward_settings(c, progress=False)  # checked now, not in the Ray actor
        # with Ray the reward manager lives in its actor (its process pool too), not here
        self.scorer = None if self.use_ray else reward_manager(c)
        if c.reward is not None and REWARD_MANAGERS.get(c.reward.manager).local_scorers:
            check_task_scorers(resolved)  # a task's own scorer name: before the model loads
        self.out_dir = Path(c.output.dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # written first, so tools (the inspector) can read a run that is still going
        OmegaConf.save(OmegaConf.create(c.raw), self.out_dir / "config.yaml")
        if self.skipped_rows:
            write_skipped_rows(self.out_dir / "skipped_rows.jsonl", self.skipped_rows)
            self._log(f"skipped {len(self.skipped_rows)} bad rows (data.on_bad_row=skip): "
                      f"{self.out_dir / 'skipped_rows.jsonl'} lists them with their reasons")
        self.seed = c.seed
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)

        if model is None:
            path = resolve_model_path(c.model.path)
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        if tokenizer is None:
            raise ConfigError("PPOTrainer: a model was given without its tokenizer")

        self.model = model.float()
        self.tokenizer = tokenizer
        # The rollout generates with the very weights being trained: no weight sync.
        self.hf_options = hf_options(c.generation.hf)
        self.backend = HFBackend(self.model, tokenizer, max_batch_size=c.generation.max_batch_size, seed=self.seed,
                                 **self.hf_options)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.backend.stop_token_ids[0]
        self.temperature = c.rollout.temperature or 1.0
        self.bf16 = c.actor.dtype == "bfloat16"

        a = c.actor
        self.need_ref = a.use_kl_loss or self.algo.use_kl_in_reward
        self.ref_model = None
        if self.need_ref:
            self.ref_model = copy.deepcopy(self.model).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.value_head = None
        groups = [{"params": [p for p in self.model.parameters() if p.requires_grad], "lr": a.optim.lr}]
        if self.algo.adv_estimator == "gae":
            hidden = self.model.config.hidden_size
            self.value_head = torch.nn.Linear(hidden, 1)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            groups.append({"params": list(self.value_head.parameters()), "lr": c.critic.lr})
        self.optimizer = torch.optim.AdamW(groups, betas=a.optim.betas, weight_decay=a.optim.weight_decay)
        self.scheduler = self._lr_schedule()
        core_algos, _, _ = _verl()
        self.kl_ctrl = core_algos.get_kl_controller(self.algo.kl_ctrl) if self.algo.use_kl_in_reward else None

        self.step = 0
        self.epoch = 0
        self.cursor = 0
        self._order = self._epoch_order(0)
        self.tracker = self._make_tracker()
        self.ray = None
        if self.use_ray:
            # Ray is optional (trainer.use_ray)
            from verl_agentic.trainer.ray_workers import RayWorkers

            self.ray = RayWorkers(self, dict(t.ray_init))
        # Crash safety: a checkpoint is exact only between two steps. ``_boundary`` is the position
        # where the current step began; ``_weights_dirty`` is true from the start of the update until
        # the step is recorded (then the weights belong to neither step). ``_on_disk``: the step whose
        # checkpoint is on disk (trainer.save_before_update writes the boundary before each update).
        self._weights_dirty = False
        self._on_disk: Optional[int] = None
        if t.resume:
            self._resume()
        self._boundary = self._position()

    # ------------------------------------------------------------------ data

    def _epoch_order(self, epoch: int) -> np.ndarray:
        n = len(self.rows)
        if not self.conf.data.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _next_rows(self) -> list[dict]:
        out = []
        for _ in range(self.conf.trainer.batch_size):
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._epoch_order(self.epoch)
            out.append(self.rows[int(self._order[self.cursor])])
            self.cursor += 1
        return out

    # ------------------------------------------------------------------ logging / checkpoints

    def _make_tracker(self):
        backends = [b for b in list(self.conf.trainer.logger) if b != "jsonl"]
        if not backends:
            return None
        from verl.utils.tracking import Tracking

        os.environ.setdefault("TENSORBOARD_DIR", str(self.out_dir / "tensorboard"))
        return Tracking(project_name=self.conf.trainer.project_name,
                        experiment_name=self.conf.trainer.experiment_name, default_backend=backends,
                        config=self.conf.raw)

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    def _position(self) -> dict[str, Any]:
        """Where the run is, between two steps: the step, the data position, the KL coefficient, the RNGs."""
        return {
            "step": self.step, "epoch": self.epoch, "cursor": self.cursor,
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "rng": ckpt.rng_state(),
            "backend_rng": self.ray.backend_rng() if self.ray is not None else self.backend._seed_rng.getstate(),
        }

    def _state(self) -> dict[str, Any]:
        """A checkpoint: the weights and optimizer (unchanged since the current step began, or the step
        is complete) at the position where the current step began."""
        return {
            **self._boundary,
            "model": self.model.state_dict(),
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
        }

    def save_checkpoint(self, transient: bool = False) -> Path:
        """The checkpoint of the last step boundary; not written again when it is on disk already.
        ``transient``: the crash-safety copy written before an update, removed once a newer one exists."""
        step = self._boundary["step"]
        root = self.out_dir / "checkpoints"
        if self._on_disk == step:
            folder = root / f"step_{step:06d}"
            if not transient:
                ckpt.keep(folder)
            return folder
        folder = ckpt.save_checkpoint(root, step, self._state(), self.conf.trainer.max_checkpoints, transient=transient)
        self._on_disk = step
        return folder

    def request_stop(self) -> None:
        """Stop the run at once (raises ``KeyboardInterrupt``): ``fit`` then leaves the checkpoint of the
        last step boundary (written before the update began, when the stop comes during one) and
        re-raises; the step in progress is dropped and redone on resume. Meant for a signal handler
        (``main_ppo``'s, for SIGTERM and SIGINT)."""
        raise KeyboardInterrupt("stop requested")

    def _checkpoint_on_failure(self, error: BaseException) -> None:
        """``fit`` was stopped (a signal) or failed (an exception): leave the checkpoint that
        ``trainer.resume`` continues from exactly, the last step boundary. During an update the weights
        are between two steps: the boundary is the one written before it (``trainer.save_before_update``)."""
        why = "stopped" if isinstance(error, KeyboardInterrupt) else f"failed ({type(error).__name__}: {error})"
        latest = ckpt.latest_checkpoint(self.out_dir / "checkpoints")
        if self._weights_dirty and self._on_disk != self._boundary["step"]:
            print(f"[verl-agentic] training {why} during step {self.step + 1}'s update: the weights are "
                  f"between two steps, no checkpoint written (trainer.save_before_update=false); the latest "
                  f"is {latest or 'none'}", file=sys.stderr)
            return
        try:
            folder = self.save_checkpoint()
        except Exception as e:  # noqa: BLE001 - e.g. the disk is full; the first error is the one to report
            print(f"[verl-agentic] training {why}; writing its checkpoint failed too ({e}); the latest is "
                  f"{latest or 'none'}", file=sys.stderr)
            return
        print(f"[verl-agentic] training {why} in step {self._boundary['step'] + 1}: checkpoint of step "
              f"{self._boundary['step']} written to {folder}", file=sys.stderr)

    def _resume(self) -> None:
        ckpt.tidy(self.out_dir / "checkpoints")  # what an interrupted save left
        folder = ckpt.latest_checkpoint(self.out_dir / "checkpoints")
        if folder is None:
            self._log(f"resume: no checkpoint in {self.out_dir / 'checkpoints'}, starting at step 0")
            return
        s = ckpt.load_checkpoint(folder)
        self.model.load_state_dict(s["model"])
        if self.value_head is not None and s["value_head"] is not None:
            self.value_head.load_state_dict(s["value_head"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        if self.kl_ctrl is not None and s["kl_coef"] is not None:
            self.kl_ctrl.value = s["kl_coef"]
        ckpt.set_rng_state(s["rng"])
        if self.ray is not None:
            self.ray.set_backend_rng(s["backend_rng"])
        else:
            self.backend._seed_rng.setstate(s["backend_rng"])
        self.step, self.epoch, self.cursor = int(s["step"]), int(s["epoch"]), int(s["cursor"])
        self._on_disk = self.step
        self._order = self._epoch_order(self.epoch)
        if self.metrics_path.exists():  # drop lines of steps after the checkpoint (they will be redone;
            # at step 0 that includes the base model's validation)
            keep = [ln for ln in self.metrics_path.read_text().splitlines()
                    if ln.strip() and self.step > 0 and json.loads(ln).get("step", 0) <= self.step]
            self.metrics_path.write_text("".join(ln + "\n" for ln in keep))
            if self.monitors is not None:  # the monitors' history: the logged summaries of the steps kept
                for ln in keep:
                    row = json.loads(ln)
                    self.monitors.observe(row["step"], from_metrics(row))
                self.monitors.stop = None
        self._log(f"resumed from {folder} at step {self.step}")

    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[verl-agentic] {msg}", file=sys.stderr)

    # ------------------------------------------------------------------ one step

    def _rollout(self, rows: list[dict], rollout_cfg: Any = None, name: str = "") -> list[dict]:
        # Step-dependent sampling seeds: a resumed run samples exactly what an uninterrupted one would.
        seed = self.seed * 7919 + self.step
        rollout_cfg = rollout_cfg or self.rollout_cfg
        record = self._recording(name, rollout_cfg, seed)
        if self.ray is not None:
            return self.ray.rollout_rows(rows, seed, self.model.state_dict(), rollout_cfg, record)
        recorder = RecordingWriter(*record) if record is not None else None
        rollout = AsyncRollout(self.backend, rollout_cfg, task_configs=self.task_configs,
                               default_task_type=self.conf.task_type, seed=seed, progress=False, recorder=recorder)
        try:
            return rollout.run_sync(rows)
        finally:
            if recorder is not None:
                recorder.close()

    def _recording(self, name: str, rollout_cfg: Any, seed: int) -> Optional[tuple[Path, dict]]:
        """``output.record``: where this rollout's recording goes (``output.dir/recordings/<name>``, made
        afresh: a step redone after a resume records again) and its header; None when not recording."""
        if not self.conf.output.record or not name:
            return None
        folder = self.out_dir / "recordings" / name
        shutil.rmtree(folder, ignore_errors=True)
        return folder, recording_header(self.conf.raw, self.backend, rollout_cfg, self.task_configs,
                                        self.conf.task_type, seed)

    def validate(self) -> dict[str, float]:
        """Greedy episodes (n=1) on the held-out rows with the current weights: ``val/*`` metrics (see
        :func:`validation_metrics`); the episodes go to ``validation/step_XXXXXX.jsonl``."""
        t0 = time.perf_counter()
        trajs = self._rollout(self.val_rows, self.val_rollout_cfg, f"validation_step_{self.step:06d}")
        rewards = self._rewards(trajs)
        for t in trajs:
            t["step"] = self.step
        (self.out_dir / "validation").mkdir(exist_ok=True)
        write_jsonl(self.out_dir / "validation" / f"step_{self.step:06d}.jsonl", trajs)
        m = {"val/" + k: v for k, v in validation_metrics(trajs, rewards).items()}
        self._heldout_trajs = trajs  # for the monitors (_observe)
        m["timing/val_s"] = time.perf_counter() - t0
        self._log(f"validation at step {self.step}: " + ", ".join(
            f"{k[4:]} {v:.3f}" for k, v in m.items() if k.startswith("val/accuracy/") or k == "val/reward/mean"))
        return m

    def _validate_after_step(self) -> bool:
        total = self.conf.trainer.total_steps
        return bool(self.val_rows) and self.test_freq > 0 and (self.step % self.test_freq == 0 or self.step == total)

    def _rewards(self, trajs: list[dict]) -> list[Optional[float]]:
        if self.scorer_config is None:
            return [float(t["reward"]) for t in trajs]
        if self.ray is not None:
            self.ray.score(trajs)
        else:
            score_trajectories(trajs, self.scorer)
        return [None if t["score"] is None else float(t["score"]) for t in trajs]

    @torch.no_grad()
    def _no_grad_pass(self, batch: TrainBatch, model, *, values: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        micro = self.conf.actor.ppo_micro_batch_size
        lps = torch.zeros_like(batch.response_mask)
        vals = torch.zeros_like(batch.response_mask) if values else None
        for idx in _chunks(batch.size, micro):
            mb = batch.select(idx)
            out = forward_batch(model, mb, self.temperature, value_head=self.value_head if values else None, bf16=self.bf16)
            lps[idx, :mb.response_len] = out.log_probs
            if values:
                vals[idx, :mb.response_len] = out.values
        return lps, vals

    def train_step(self) -> dict[str, float]:
        """One rollout + update; returns the step's metrics (also written to metrics.jsonl)."""
        core_algos, ray_trainer, verl_F = _verl()
        rollout_corr_helper = _rollout_corr_helper()
        timing: dict[str, float] = {}
        t_step = time.perf_counter()
        rows = self._next_rows()
        t0 = time.perf_counter()
        trajs = self._rollout(rows, name=f"step_{self.step + 1:06d}")
        timing["timing/rollout_s"] = time.perf_counter() - t0
        for i, t in enumerate(trajs):  # group id: the prompt's position in this step's batch
            t["step"] = self.step + 1
            t["group"] = f"{self.step + 1}-{t['index']}"
        t0 = time.perf_counter()
        rewards = self._rewards(trajs)
        timing["timing/reward_s"] = time.perf_counter() - t0
        metrics = rollout_metrics(trajs, rewards)
        if metrics["reward/missing_share"] > self.conf.trainer.warn_missing_reward_share:
            errors = Counter((t.get("score_error") or {}).get("type", "no score") for t, r in zip(trajs, rewards)
                             if r is None)
            print(f"[verl-agentic] warning: step {self.step + 1}: {int(metrics['reward/masked'])} of {len(trajs)} "
                  f"episodes have no reward ({', '.join(f'{k}: {v}' for k, v in errors.most_common())}); the step "
                  f"trains on the rest (reward/missing_share, trainer.warn_missing_reward_share="
                  f"{self.conf.trainer.warn_missing_reward_share})", file=sys.stderr)

        train = [(t, r) for t, r in zip(trajs, rewards) if r is not None and sum(t["response_mask"]) > 0]
        if not train:
            raise RuntimeError(f"step {self.step + 1}: no episode has a reward and a generated token to train on")
        batch = build_batch([t for t, _ in train], [r for _, r in train], self.pad_id,
                            uids=[t["group"] for t, _ in train], turn_rewards=self.conf.algorithm.turn_rewards)
        mask = generated = batch.response_mask

        t0 = time.perf_counter()
        missing_lp = any(lp is None for t, _ in train for lp, m in zip(t["response_logprobs"], t["response_mask"]) if m)
        if missing_lp and (self.correction.corrects or self.correction.bypass_mode):
            raise RuntimeError(f"step {self.step + 1}: algorithm.rollout_correction needs the rollout's logprobs, and "
                               f"some generated tokens have none (a backend that does not return logprobs)")
        recompute = self.recompute_old or missing_lp
        gap_measured_on = None
        if recompute:
            old, _ = self._no_grad_pass(batch, self.model)
            gap_measured_on = "batch"
            if not missing_lp:
                self._record_gap(metrics, old, batch.rollout_log_probs, mask)
            for (t, _), row in zip(train, old):
                t["trainer_logprobs"] = [round(float(x), 6) if m else None
                                         for x, m in zip(row[:len(t["response_ids"])], t["response_mask"])]
        else:
            old = batch.rollout_log_probs
        batch.extra["old_log_probs"] = old
        if self.ref_model is not None:
            batch.extra["ref_log_prob"], _ = self._no_grad_pass(batch, self.ref_model)
        if self.value_head is not None:
            _, batch.extra["values"] = self._no_grad_pass(batch, self.model, values=True)
        timing["timing/old_logprob_s"] = time.perf_counter() - t0

        data = to_dataproto(batch)
        data.batch["old_log_probs"] = old
        for k in ("ref_log_prob", "values"):
            if k in batch.extra:
                data.batch[k] = batch.extra[k]
        if self.kl_ctrl is not None:
            data, kl_metrics = ray_trainer.apply_kl_penalty(data, self.kl_ctrl, kl_penalty=self.algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        if recompute and not missing_lp:
            # as verl's trainer (decoupled mode): IS weights and rejection from pi_old vs pi_rollout, before
            # the advantages (a rejected token gets none); with rollout_is and rollout_rs off, only the metrics
            data, corr_metrics = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(
                data, self.algo.rollout_correction)
            metrics.update(corr_metrics)
            batch.response_mask = mask = data.batch["response_mask"]
            if "rollout_is_weights" in data.batch:
                batch.extra["rollout_is_weights"] = data.batch["rollout_is_weights"]
        data = ray_trainer.compute_advantage(
            data, adv_estimator=self.algo.adv_estimator, gamma=self.algo.gamma, lam=self.algo.lam,
            num_repeat=self.conf.rollout.n, norm_adv_by_std_in_grpo=self.algo.norm_adv_by_std_in_grpo,
            config=self.algo)
        batch.extra["advantages"] = data.batch["advantages"]
        batch.extra["returns"] = data.batch["returns"]
        metrics["critic/advantages/mean"] = float(verl_F.masked_mean(batch.extra["advantages"], mask))
        metrics["critic/advantages/abs_max"] = float((batch.extra["advantages"].abs() * mask).max())

        if self.conf.trainer.save_before_update:  # a crash or a stop in the update: this is the point to resume
            t0 = time.perf_counter()
            self.save_checkpoint(transient=True)
            timing["timing/save_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._weights_dirty = True  # until the step is recorded: no checkpoint can be exact meanwhile
        update = self._update(batch, measure_gap=gap_measured_on is None)
        timing["timing/update_s"] = time.perf_counter() - t0
        if gap_measured_on is None and "actor/logprob_gap_mean" in update:
            gap_measured_on = "first_mini_batch"
        metrics.update(update)
        self.step += 1
        tokens = float(batch.attention_mask.sum())
        timing["timing/step_s"] = time.perf_counter() - t_step
        metrics.update(timing)
        metrics["perf/tokens"] = tokens
        metrics["perf/generated_tokens"] = float(generated.sum())
        metrics["perf/update_tokens_per_s"] = tokens * self.conf.actor.ppo_epochs / max(timing["timing/update_s"], 1e-9)
        metrics["actor/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["data/epoch"] = float(self.epoch)
        self._heldout_trajs = []
        if self._validate_after_step():
            metrics.update(self.validate())
        self._observe(metrics, trajs, rewards)
        self._write(metrics, trajs)
        self._boundary = self._position()
        self._weights_dirty = False
        del batch, data, trajs
        _release_memory()
        return metrics

    def _observe(self, metrics: dict[str, float], trajs: list[dict], rewards: Optional[list] = None) -> None:
        """Feed this step's batch summary (its episodes, the validation's if it ran, and what the metrics
        add: entropy, KL, held-out accuracy) to the monitors; the summary and their values go into
        ``metrics``, a monitor that starts firing prints one line. A failure of the monitors is reported
        once and turns them off: they never stop training."""
        if self.monitors is None:
            return
        try:
            summary = merge(batch_summary(trajs, rewards) if trajs else {}, heldout_summary(self._heldout_trajs))
            metrics.update(numeric(summary))
            for f in self.monitors.observe(self.step, merge(summary, from_metrics(metrics))):
                print(f"[verl-agentic] WARNING {f.line()}", file=sys.stderr)
            metrics.update(self.monitors.metrics())
        except Exception as e:  # noqa: BLE001 - monitors only read; training goes on without them
            print(f"[verl-agentic] WARNING the monitors failed at step {self.step} and are off for this run: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
            self.monitors = None

    def _record_gap(self, metrics: dict, trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> None:
        diff = (trainer_lp - rollout_lp).abs() * mask
        n = float(mask.sum())
        metrics["actor/logprob_gap_mean"] = float(diff.sum() / max(n, 1.0))
        metrics["actor/logprob_gap_max"] = float(diff.max())

    def _lr_schedule(self) -> torch.optim.lr_scheduler.LambdaLR:
        """``actor.optim.lr_scheduler_type``: ``constant`` (after ``lr_warmup_steps`` of linear warm-up)
        or ``cosine`` (verl's, decaying to ``min_lr_ratio`` x lr at the last optimizer step of
        ``trainer.total_steps``, counted as full batches of ``batch_size * rollout.n`` episodes)."""
        _, _, verl_F = _verl()
        a, c = self.conf.actor, self.conf
        warmup = a.optim.lr_warmup_steps
        if a.optim.lr_scheduler_type == "constant":
            return torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)
        per_step = a.ppo_epochs * math.ceil(c.trainer.batch_size * c.rollout.n / a.ppo_mini_batch_size)
        return verl_F.get_cosine_schedule_with_warmup(
            self.optimizer, num_warmup_steps=warmup, num_training_steps=c.trainer.total_steps * per_step,
            min_lr_ratio=a.optim.min_lr_ratio, zero_indexed_step=False)

    def _rows_with_gradient(self, batch: TrainBatch) -> list[bool]:
        """Which rows the update must forward. A row whose advantages are all 0 adds nothing to the
        policy-gradient loss or its gradient under the losses in ``ZERO_AT_ZERO_ADVANTAGE`` (GRPO's
        all-wrong or all-right groups: most groups when rewards are sparse), so with
        ``actor.skip_zero_advantage`` and no other loss term (entropy bonus, KL loss, critic) it is
        not forwarded. The result is the same update: bitwise when each micro-batch holds one row,
        otherwise up to the GEMMs' summation order over other shapes (``tests/test_trainer.py``)."""
        a = self.conf.actor
        if (not a.skip_zero_advantage or a.entropy_coeff or a.use_kl_loss or self.value_head is not None
                or self.actor_cfg.policy_loss.loss_mode not in ZERO_AT_ZERO_ADVANTAGE):
            return [True] * batch.size
        adv = batch.extra["advantages"] * batch.response_mask
        return (adv.abs().amax(-1) > 0).tolist()

    def _update(self, batch: TrainBatch, measure_gap: bool) -> dict[str, float]:
        core_algos, _, verl_F = _verl()
        a = self.conf.actor
        policy_loss_fn = core_algos.get_policy_loss_fn(self.actor_cfg.policy_loss.loss_mode)  # bypass_mode too
        mode = a.loss_agg_mode
        entropy_coeff = a.entropy_coeff
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms, skipped = [], 0
        first = True
        live = self._rows_with_gradient(batch)
        for _ in range(a.ppo_epochs):
            for mini_idx in _chunks(batch.size, a.ppo_mini_batch_size):
                mini = batch.select(mini_idx)
                # the loss is normalised by the whole mini-batch (verl's global_batch_info), so leaving
                # out rows that give no gradient changes nothing but the time
                gbi = {"dp_size": 1, "batch_num_tokens": float(mini.response_mask.sum()),
                       "global_batch_size": float((mini.response_mask.sum(-1) > 0).sum())}
                self.actor_cfg.global_batch_info.clear()
                self.actor_cfg.global_batch_info.update(gbi)
                rows = [j for j, i in enumerate(mini_idx) if live[i]]
                for micro in _chunks(len(rows), a.ppo_micro_batch_size):
                    mb = mini.select([rows[j] for j in micro])
                    m = mb.response_mask
                    out = forward_batch(self.model, mb, self.temperature,
                                        entropy="grad" if entropy_coeff else "metric",
                                        value_head=self.value_head, bf16=self.bf16)
                    if first and measure_gap:
                        gap = (out.log_probs.detach() - mb.rollout_log_probs).abs() * m
                        sums["gap_sum"] += float(gap.sum())
                        sums["gap_n"] += float(m.sum())
                        sums["gap_max"] = max(sums["gap_max"], float(gap.max()))
                    pg_loss, pg_metrics = policy_loss_fn(
                        old_log_prob=mb.extra["old_log_probs"], log_prob=out.log_probs,
                        advantages=mb.extra["advantages"], response_mask=m, loss_agg_mode=mode,
                        config=self.actor_cfg, rollout_is_weights=mb.extra.get("rollout_is_weights"))
                    loss = pg_loss
                    if entropy_coeff:
                        loss = loss - entropy_coeff * core_algos.agg_loss(out.entropy, m, mode, **gbi)
                    if a.use_kl_loss:
                        kld = core_algos.kl_penalty(out.log_probs, mb.extra["ref_log_prob"], a.kl_loss_type)
                        kl_loss = core_algos.agg_loss(kld, m, mode, **gbi)
                        loss = loss + a.kl_loss_coef * kl_loss
                        sums["actor/kl_loss"] += float(kl_loss.detach())
                    if self.value_head is not None:
                        vf_loss, vf_clip = core_algos.compute_value_loss(
                            vpreds=out.values, returns=mb.extra["returns"], values=mb.extra["values"],
                            response_mask=m, cliprange_value=self.conf.critic.cliprange_value,
                            loss_agg_mode=mode, **gbi)
                        loss = loss + self.conf.critic.vf_coef * vf_loss
                        sums["critic/vf_loss"] += float(vf_loss.detach())
                        tok = float(m.sum())
                        sums["critic/vf_clipfrac"] += float(vf_clip) * tok
                        weights["critic/vf_clipfrac"] += tok
                    loss.backward()
                    sums["actor/pg_loss"] += float(pg_loss.detach())
                    tok = float(m.sum())
                    # a token mean over the rows forwarded (all rows unless some were skipped)
                    sums["actor/entropy"] += float(verl_F.masked_mean(out.entropy.detach(), m)) * tok
                    weights["actor/entropy"] += tok
                    sums["actor/updated_rows"] += float(m.shape[0])
                    for k, v in pg_metrics.items():
                        sums[k] += float(v) * tok
                        weights[k] += tok
                if first and measure_gap and rows:
                    first = False
                for p in params:  # a mini-batch with no live row still takes its (momentum) step
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                norm = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
                if not torch.isfinite(norm):
                    skipped += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    continue
                grad_norms.append(float(norm))
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        n_updates = a.ppo_epochs * len(_chunks(batch.size, a.ppo_mini_batch_size))
        out: dict[str, float] = {}
        for k, v in sums.items():
            if k.startswith("gap_"):
                continue
            out[k] = v / weights[k] if k in weights else v / n_updates
        if sums.get("gap_n"):
            out["actor/logprob_gap_mean"] = sums["gap_sum"] / sums["gap_n"]
            out["actor/logprob_gap_max"] = sums["gap_max"]
        if "actor/ppo_kl" in out:
            out["actor/kl"] = out["actor/ppo_kl"]
        if self.ref_model is not None:
            out["actor/kl_ref"] = float(verl_F.masked_mean(
                batch.extra["old_log_probs"] - batch.extra["ref_log_prob"], batch.response_mask))
        out["actor/updated_rows"] = sums["actor/updated_rows"] / (a.ppo_epochs * batch.size)
        out.setdefault("actor/pg_loss", 0.0)  # every row skipped: the loss is exactly 0
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else float("nan")
        out["actor/skipped_updates"] = float(skipped)
        return out

    def _write(self, metrics: dict[str, float], trajs: list[dict]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with JsonLinesAppender(self.metrics_path) as out:  # a full disk: an error naming the file, no torn line
            out.append({"step": self.step, **clean})
        if self.conf.trainer.save_rollouts and trajs:
            (self.out_dir / "rollouts").mkdir(exist_ok=True)
            write_jsonl(self.out_dir / "rollouts" / f"step_{self.step:06d}.jsonl", trajs)
        if self.tracker is not None:
            self.tracker.log(data={k: v for k, v in clean.items() if v is not None}, step=self.step)

    # ------------------------------------------------------------------ the run

    def fit(self) -> list[dict[str, float]]:
        """Train until ``trainer.total_steps`` (or ``stop_after_steps`` more); returns the metrics."""
        from tqdm import tqdm

        t = self.conf.trainer
        total = t.total_steps
        stop_after = t.stop_after_steps
        last = total if stop_after is None else min(total, self.step + int(stop_after))
        save_freq = t.save_freq
        history = []
        bar = tqdm(total=total, initial=self.step, desc="train", disable=self.quiet, file=sys.stderr,
                   dynamic_ncols=True)
        try:
            if self.step == 0 and self.val_rows and t.val_before_train:
                m = self.validate()  # the base model: a step-0 row with val/* (and heldout/*) only
                self._observe(m, [])
                self._write(m, [])
            while self.step < last:
                m = self.train_step()
                history.append(m)
                bar.update(1)
                labels = {"reward/mean": "reward", "accuracy/mean": "acc", "actor/logprob_gap_mean": "lp_gap"}
                bar.set_postfix({name: f"{m[k]:.3g}" for k, name in labels.items() if m.get(k) is not None},
                                refresh=False)
                if save_freq > 0 and self.step % save_freq == 0 and self.step < total:
                    self.save_checkpoint()
                if self.monitors is not None and self.monitors.stop is not None:
                    print(f"[verl-agentic] stopping after step {self.step}: {self.monitors.stop.line()} "
                          f"(trainer.monitors.stop_on={list(t.monitors.stop_on)})", file=sys.stderr)
                    break
            self.save_checkpoint()  # also when stopped early: the point to resume from
            if self.step >= total and t.save_hf_model:
                self.save_hf_model(self.out_dir / "hf_model")
        except BaseException as e:
            self._checkpoint_on_failure(e)
            raise
        finally:
            bar.close()
            self.close()
        return history

    def save_hf_model(self, folder: Path) -> None:
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        self._log(f"policy saved to {folder}")

    def close(self) -> None:
        if self.ray is not None:
            self.ray.close()
            self.ray = None
        if self.scorer is not None:
            self.scorer.close()
            self.scorer = None
        asyncio.run(self.backend.close())
        if self.tracker is not None:
            del self.tracker
            self.tracker = None
