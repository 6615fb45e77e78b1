"""The single-machine trainer: rollouts -> rewards -> advantages -> policy update, on verl's algorithms.

``PPOTrainer`` is the recipe; it reads top to bottom as the algorithm. One step (``train_step``)::

    rows = next prompts                          (data.py: seeded shuffle, resumable position, bad rows)
    trajectories = AsyncRollout(rows, n)         (the HF backend shares the policy's weights)
    rewards = reward manager (or the episodes' own rewards); a warning when many are missing
    batch = pad (verl layout), token-level scores on each episode's last generated token
    old logprobs = rollout logprobs | recomputed (actor.recompute_old_logprobs, or rollout correction on;
                   the gap is logged); [ref logprobs, old values] (when KL or GAE need them)
    advantages      [in-reward KL: verl ray_trainer.apply_kl_penalty]
                    [rollout correction (correction.py): verl's helper, TIS/MIS weights and rejection]
                    verl ray_trainer.compute_advantage -> core_algos registry (grpo, rloo, gae, turn_loo, ...)
    update          (actor.py) per mini-batch, micro-batches accumulating: verl's policy-loss registry
                    (clipped PPO, ...), agg_loss modes, entropy bonus, KL loss, value loss; clip; AdamW
    [validation]    greedy episodes (n=1) on data.val_path every trainer.test_freq steps -> val/*
    monitors        (monitoring.py) the step's batch summary -> reward-hacking / collapse monitors
    log             (metrics.py) metrics.jsonl, rollouts/step_XXXXXX.jsonl, verl's Tracking
    checkpoint      (safety.py, checkpoint.py) the step boundary: as each step begins (crash safety),
                    every trainer.save_freq steps, at the end, and whenever a stop or a crash ends the run

The collaborators are built in one place (``__init__``) and called from the recipe; ``output.record``
(recording.py) records each rollout for replay. The loss only sees tokens whose ``response_mask`` is 1
(the model's own tokens): every loss term is aggregated by verl's ``agg_loss`` over that mask.
"""

from __future__ import annotations

import asyncio
import copy
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

import verl_agentic.trainer.checkpoint as ckpt
from verl_agentic.backends.hf import HFBackend, hf_options
from verl_agentic.config import RunConfig, check_task_scorers, reward_manager, reward_settings
from verl_agentic.interfaces import ConfigError
from verl_agentic.models.embedded import resolve_model_path
from verl_agentic.reward import REWARD_MANAGERS, score_trajectories
from verl_agentic.rollout import AsyncRollout, write_jsonl
from verl_agentic.rollout.trajectory import last_turn_reward, training_rows
from verl_agentic.tasks import get_task
from verl_agentic.trainer.actor import Actor, logprob_gap
from verl_agentic.trainer.batch import TrainBatch, build_batch, to_dataproto
from verl_agentic.trainer.correction import RolloutCorrection
from verl_agentic.trainer.data import TrainData
from verl_agentic.trainer.metrics import MetricsLog, rollout_metrics, validation_metrics, warn_missing_rewards
from verl_agentic.trainer.monitoring import StepMonitors
from verl_agentic.trainer.ray_workers import RayWorkers
from verl_agentic.trainer.recording import RolloutRecording, recording_writer
from verl_agentic.trainer.safety import CrashSafety
from verl_agentic.trainer.verl_config import actor_config, algo_config, training_config, verl_modules


class PPOTrainer:
    """Trains ``model.path`` on ``task_type`` rollouts. See the module docstring and ``config/ppo.yaml``."""

    def __init__(self, cfg: DictConfig | RunConfig, model: Any = None, tokenizer: Any = None) -> None:
        self.cfg = cfg
        c = self.conf = training_config(cfg)  # every section checked once, before anything loads
        t = c.trainer
        self.quiet, self.seed = c.output.quiet, c.seed
        get_task(c.task_type)
        self.algo, self.actor_cfg = algo_config(c), actor_config(c)
        self.rollout_cfg = c.rollout
        self.val_rollout_cfg = replace(c.rollout, n=1, temperature=0.0)  # greedy, one episode a row
        self.out_dir = Path(c.output.dir)

        # the collaborators, each a module of trainer/ with its own tests
        self.data = TrainData(c)  # rows, held-out rows, bad rows, the position in them
        self.correction = RolloutCorrection(c, self.algo.rollout_correction, self._log)  # TIS/MIS, verl's way
        self.monitors = StepMonitors(t.monitors, t.monitors.enabled)  # reward hacking and collapse
        self.recording = RolloutRecording(c, self.out_dir)  # output.record
        self.scorer_config = reward_settings(c, progress=False)  # checked now, not in the Ray actor
        self.scorer = None if t.use_ray else reward_manager(c)  # with Ray: in its actor (its process pool too)
        if c.reward is not None and REWARD_MANAGERS.get(c.reward.manager).local_scorers:
            check_task_scorers(self.data.tasks)  # a task's own scorer name: before the model loads
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # written first, so tools (the inspector) can read a run that is still going
        OmegaConf.save(OmegaConf.create(c.raw), self.out_dir / "config.yaml")
        self.data.write_skipped(self.out_dir, self._log)

        _seed_everything(self.seed)
        self.model, self.tokenizer = _load_policy(c, model, tokenizer)
        # The rollout generates with the very weights being trained: no weight sync.
        self.hf_options = hf_options(c.generation.hf)
        self.backend = HFBackend(self.model, self.tokenizer, max_batch_size=c.generation.max_batch_size,
                                 seed=self.seed, **self.hf_options)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.backend.stop_token_ids[0]
        self.ref_model = _frozen_copy(self.model) if c.actor.use_kl_loss or self.algo.use_kl_in_reward else None
        self.actor = Actor(self.model, c, self.actor_cfg, self.algo.adv_estimator)  # optimizer, update
        core_algos, _, _ = verl_modules()
        self.kl_ctrl = core_algos.get_kl_controller(self.algo.kl_ctrl) if self.algo.use_kl_in_reward else None
        self.log = MetricsLog(c, self.out_dir)  # metrics.jsonl, rollouts/, verl's Tracking
        self.ray = RayWorkers(c, self.model, self.tokenizer, self.hf_options, self.scorer_config,
                              dict(t.ray_init)) if t.use_ray else None
        self.safety = CrashSafety(self.out_dir / "checkpoints", self.actor.state_dict, t.max_checkpoints,
                                  t.save_step_boundary)  # the last step boundary, on disk when it matters
        self.step = 0
        if t.resume:
            self._resume()
        self.safety.step_recorded(self._position())

    # ------------------------------------------------------------------ the run

    def fit(self) -> list[dict[str, float]]:
        """Train until ``trainer.total_steps`` (or ``stop_after_steps`` more); returns the metrics."""
        t = self.conf.trainer
        last = t.total_steps if t.stop_after_steps is None else min(t.total_steps, self.step + int(t.stop_after_steps))
        history = []
        bar = tqdm(total=t.total_steps, initial=self.step, desc="train", disable=self.quiet, file=sys.stderr,
                   dynamic_ncols=True)
        try:
            if self.step == 0 and self.data.val_rows and t.val_before_train:
                self._validate_base_model()
            while self.step < last:
                history.append(self.train_step())
                _show_progress(bar, history[-1])
                if t.save_freq > 0 and self.step % t.save_freq == 0 and self.step < t.total_steps:
                    self.safety.save()
                if self.monitors.stop is not None:
                    print(f"[verl-agentic] stopping after step {self.step}: {self.monitors.stop.line()} "
                          f"(trainer.monitors.stop_on={list(t.monitors.stop_on)})", file=sys.stderr)
                    break
            self.safety.save()  # also when stopped early: the point to resume from
            if self.step >= t.total_steps and t.save_hf_model:
                self.save_hf_model(self.out_dir / "hf_model")
        except BaseException as e:
            self.safety.on_failure(e)
            raise
        finally:
            bar.close()
            self.close()
        return history

    def train_step(self) -> dict[str, float]:
        """One step of the algorithm: rollout, score, advantages, update, log; returns the step's metrics
        (also written to metrics.jsonl). The boundary it ends at is the next checkpoint's."""
        timing: dict[str, float] = {}
        t_step = time.perf_counter()
        with _timed(timing, "save"):
            self.safety.step_begins()  # the boundary on disk: a crash, kill or stop in the step leaves it
        with _timed(timing, "rollout"):
            trajs = self._rollout(self.data.next_rows(), name=f"step_{self.step + 1:06d}")
        for t in trajs:  # group id: the prompt's position in this step's batch
            t["step"], t["group"] = self.step + 1, f"{self.step + 1}-{t['index']}"
        with _timed(timing, "reward"):
            rewards = self._rewards(trajs)
        metrics = rollout_metrics(trajs, rewards)
        warn_missing_rewards(self.step + 1, trajs, rewards, metrics, self.conf.trainer.warn_missing_reward_share)

        batch, rows, episode_of = self._batch(trajs, rewards)
        if len(set(episode_of)) != len(episode_of):  # an agent's episodes of several rows
            metrics["batch/rows"], metrics["batch/episodes"] = float(len(episode_of)), float(len(set(episode_of)))
        generated = batch.response_mask
        with _timed(timing, "old_logprob"):
            recomputed, missing = self._old_logprobs(batch, rows, metrics)
        self._advantages(batch, metrics, correct=recomputed and not missing, episode_of=episode_of)
        self.safety.update_begins()  # the weights are neither step's until the step is recorded
        with _timed(timing, "update"):
            metrics.update(self.actor.update(batch, measure_gap=not recomputed))
        self.step += 1
        metrics.update(self._step_figures(batch, generated, timing, t_step))

        heldout: list[dict] = []
        if self._validate_after_step():
            val, heldout = self._validation()
            metrics.update(val)
        self.monitors.observe(self.step, metrics, trajs, rewards, heldout)
        self.log.write(self.step, metrics, trajs)
        self.safety.step_recorded(self._position())
        del batch, trajs
        _release_memory()
        return metrics

    # ------------------------------------------------------------------ the steps of a step

    def _rollout(self, rows: list[dict], rollout_cfg: Any = None, name: str = "") -> list[dict]:
        # Step-dependent sampling seeds: a resumed run samples exactly what an uninterrupted one would.
        seed = self.seed * 7919 + self.step
        rollout_cfg = rollout_cfg or self.rollout_cfg
        record = self.recording.target(name, self.backend, rollout_cfg, seed)
        if self.ray is not None:
            return self.ray.rollout_rows(rows, seed, self.model.state_dict(), rollout_cfg, record)
        with recording_writer(record) as recorder:
            return AsyncRollout(self.backend, rollout_cfg, task_configs=self.conf.task,
                                default_task_type=self.conf.task_type, seed=seed, progress=False,
                                recorder=recorder).run_sync(rows)

    def _rewards(self, trajs: list[dict]) -> list[Optional[float]]:
        if self.scorer_config is None:
            return [float(t["reward"]) for t in trajs]
        if self.ray is not None:
            self.ray.score(trajs)
        else:
            score_trajectories(trajs, self.scorer)
        return [None if t["score"] is None else float(t["score"]) for t in trajs]

    def _batch(self, trajs: list[dict], rewards: list[Optional[float]]) -> tuple[TrainBatch, list[dict], list[int]]:
        """The training rows of the episodes with a reward (a row without a generated token is left out; a
        step without any row is an error), padded; an episode of several rows (an agent whose history
        changed) gives each its group, and its reward to the last (``episode_advantages`` joins them).
        Returns the batch, each row's dict (the trajectory, or its entry of ``rows_before``: where its
        ``trainer_logprobs`` go) and each row's episode."""
        rows, scores, groups, episode_of = [], [], [], []
        for e, (t, r) in enumerate((t, r) for t, r in zip(trajs, rewards) if r is not None):
            targets = [*(t.get("rows_before") or []), t]
            kept = [(row, target) for row, target in zip(training_rows(t), targets) if sum(row["response_mask"]) > 0]
            for k, (row, target) in enumerate(kept):
                rows.append((row, target))
                # the episode's reward once, on its last row; an earlier row's last token carries what a
                # turn's token carries inside a row: its turn reward (algorithm.turn_rewards) or nothing
                scores.append(r if k == len(kept) - 1 else
                              last_turn_reward(row) if self.conf.algorithm.turn_rewards else 0.0)
                groups.append(t["group"])
                episode_of.append(e)
        if not rows:
            raise RuntimeError(f"step {self.step + 1}: no episode has a reward and a generated token to train on")
        batch = build_batch([row for row, _ in rows], scores, self.pad_id, uids=groups,
                            turn_rewards=self.conf.algorithm.turn_rewards)
        return batch, [target for _, target in rows], episode_of

    def _old_logprobs(self, batch: TrainBatch, episodes: list[dict], metrics: dict) -> tuple[bool, bool]:
        """The old logprobs into ``batch.extra``: the rollout's, or the trainer's own (recomputed for
        ``actor.recompute_old_logprobs``, rollout correction, or a backend without logprobs; the gap to the
        rollout's is logged, and each episode gets its ``trainer_logprobs``); then the reference's (KL) and
        the old values (GAE). Returns (recomputed, some rollout logprobs missing)."""
        missing = any(lp is None for t in episodes for lp, m in zip(t["response_logprobs"], t["response_mask"]) if m)
        self.correction.check(self.step + 1, missing)
        recompute = self.correction.recompute or missing
        old = batch.rollout_log_probs
        if recompute:
            old, _ = self.actor.no_grad_pass(batch)
            if not missing:
                metrics.update(logprob_gap(old, batch.rollout_log_probs, batch.response_mask))
            for t, row in zip(episodes, old):
                t["trainer_logprobs"] = [round(float(x), 6) if m else None
                                         for x, m in zip(row[:len(t["response_ids"])], t["response_mask"])]
        batch.extra["old_log_probs"] = old
        if self.ref_model is not None:
            batch.extra["ref_log_prob"], _ = self.actor.no_grad_pass(batch, self.ref_model)
        if self.actor.value_head is not None:
            _, batch.extra["values"] = self.actor.no_grad_pass(batch, values=True)
        return recompute, missing

    def _advantages(self, batch: TrainBatch, metrics: dict, correct: bool, episode_of: list[int]) -> None:
        """verl's, in verl's order: the in-reward KL penalty, rollout correction (``correct``: the old
        logprobs are the trainer's and the rollout's are known), the estimator; advantages and returns
        into ``batch.extra``. Episodes of several rows: the estimator sees each episode as one sequence,
        its rows joined, and each row gets its own part back (``episode_advantages``)."""
        _, ray_trainer, verl_F = verl_modules()
        data = to_dataproto(batch)
        for k in ("old_log_probs", "ref_log_prob", "values"):
            if k in batch.extra:
                data.batch[k] = batch.extra[k]
        if self.kl_ctrl is not None:
            data, kl_metrics = ray_trainer.apply_kl_penalty(data, self.kl_ctrl, kl_penalty=self.algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        if correct:  # before the advantages: a rejected token gets none
            data = self.correction.apply(data, batch, metrics)
        a = self.algo

        def estimate(d):
            return ray_trainer.compute_advantage(d, adv_estimator=a.adv_estimator, gamma=a.gamma, lam=a.lam,
                                                 num_repeat=self.conf.rollout.n,
                                                 norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo, config=a)

        if len(set(episode_of)) == len(episode_of):
            data = estimate(data)
        else:
            data = episode_advantages(data, episode_of, estimate)
        batch.extra["advantages"] = data.batch["advantages"]
        batch.extra["returns"] = data.batch["returns"]
        mask = batch.response_mask
        metrics["critic/advantages/mean"] = float(verl_F.masked_mean(batch.extra["advantages"], mask))
        metrics["critic/advantages/abs_max"] = float((batch.extra["advantages"].abs() * mask).max())

    def _step_figures(self, batch: TrainBatch, generated: torch.Tensor, timing: dict[str, float],
                      t_step: float) -> dict[str, float]:
        """The step's timings and throughput, the learning rate and the data epoch."""
        timing["timing/step_s"] = time.perf_counter() - t_step
        tokens = float(batch.attention_mask.sum())
        return {**timing, "perf/tokens": tokens, "perf/generated_tokens": float(generated.sum()),
                "perf/update_tokens_per_s": tokens * self.conf.actor.ppo_epochs / max(timing["timing/update_s"], 1e-9),
                "actor/lr": self.actor.lr, "data/epoch": float(self.data.epoch)}

    # ------------------------------------------------------------------ validation

    def validate(self) -> dict[str, float]:
        """Greedy episodes (n=1) on the held-out rows with the current weights: ``val/*`` metrics (see
        :func:`validation_metrics`); the episodes go to ``validation/step_XXXXXX.jsonl``."""
        return self._validation()[0]

    def _validation(self) -> tuple[dict[str, float], list[dict]]:
        t0 = time.perf_counter()
        trajs = self._rollout(self.data.val_rows, self.val_rollout_cfg, f"validation_step_{self.step:06d}")
        rewards = self._rewards(trajs)
        for t in trajs:
            t["step"] = self.step
        (self.out_dir / "validation").mkdir(exist_ok=True)
        write_jsonl(self.out_dir / "validation" / f"step_{self.step:06d}.jsonl", trajs)
        m = {"val/" + k: v for k, v in validation_metrics(trajs, rewards).items()}
        m["timing/val_s"] = time.perf_counter() - t0
        self._log(f"validation at step {self.step}: " + ", ".join(
            f"{k[4:]} {v:.3f}" for k, v in m.items() if k.startswith("val/accuracy/") or k == "val/reward/mean"))
        return m, trajs

    def _validate_base_model(self) -> None:
        """Before the first step: a step-0 row with the base model's val/* (and heldout/*) only."""
        m, heldout = self._validation()
        self.monitors.observe(self.step, m, [], heldout=heldout)
        self.log.write(self.step, m, [])

    def _validate_after_step(self) -> bool:
        t = self.conf.trainer
        return bool(self.data.val_rows) and t.test_freq > 0 and (self.step % t.test_freq == 0 or self.step == t.total_steps)

    # ------------------------------------------------------------------ checkpoints and stops

    def _position(self) -> dict[str, Any]:
        """Where the run is, between two steps: the step, the data position, the KL coefficient, the RNGs."""
        return {
            "step": self.step, **self.data.position(),
            "kl_coef": self.kl_ctrl.value if self.kl_ctrl is not None else None,
            "rng": ckpt.rng_state(),
            "backend_rng": self.ray.backend_rng() if self.ray is not None else self.backend._seed_rng.getstate(),
        }

    def save_checkpoint(self) -> Path:
        """The checkpoint of the last step boundary (not written again when it is on disk)."""
        return self.safety.save()

    def request_stop(self) -> None:
        """Stop the run at once (raises ``KeyboardInterrupt``): ``fit`` then leaves the checkpoint of the
        last step boundary (on disk since the step began, with ``trainer.save_step_boundary``) and
        re-raises; the step in progress is dropped and redone on resume. Meant for a signal handler
        (``main_ppo``'s, for SIGTERM and SIGINT)."""
        raise KeyboardInterrupt("stop requested")

    def _resume(self) -> None:
        s, folder = self.safety.load_latest()
        if s is None:
            self._log(f"resume: no checkpoint in {self.safety.root}, starting at step 0")
            return
        self.actor.load_state_dict(s)
        if self.kl_ctrl is not None and s["kl_coef"] is not None:
            self.kl_ctrl.value = s["kl_coef"]
        ckpt.set_rng_state(s["rng"])
        if self.ray is not None:
            self.ray.set_backend_rng(s["backend_rng"])
        else:
            self.backend._seed_rng.setstate(s["backend_rng"])
        self.step = int(s["step"])
        self.data.restore(s["epoch"], s["cursor"])
        self.monitors.replay(self.log.keep_until(self.step))  # the lines of later steps are redone
        self._log(f"resumed from {folder} at step {self.step}")

    # ------------------------------------------------------------------ the end

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
        self.log.close()

    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[verl-agentic] {msg}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# the recipe's small helpers


def episode_advantages(data: Any, episode_of: list[int], estimate: Any) -> Any:
    """Advantages for a batch whose episodes may span several rows (``episode_of[i]``: row i's episode).

    ``estimate`` (verl's estimator) sees each episode as one sequence: its rows' response positions joined
    in order, with one masked position between two rows so that their turns stay apart. Every tensor of
    the batch aligned with the responses is joined so (rewards, mask, values, log-probs); the other
    fields are the episode's first row's. So a GRPO group counts episodes, not rows, and gives every row
    of an episode that episode's advantage; ``turn_loo`` counts an episode's turns across its rows; GAE
    runs through them. Each row gets back the advantages and returns of its own positions. The caller
    puts the episode's reward on its last row only (``PPOTrainer._batch``)."""
    from verl import DataProto

    mask = data.batch["response_mask"]
    width = mask.shape[1]
    lengths = [int(x) for x in data.batch["attention_mask"][:, -width:].sum(-1)]
    members: dict[int, list[int]] = {}
    for i, e in enumerate(episode_of):
        members.setdefault(e, []).append(i)
    place: dict[int, tuple[int, int]] = {}  # row -> (episode's row in the joined batch, its first position)
    joined_width = 1
    for j, rows in enumerate(members.values()):
        at = 0
        for i in rows:
            place[i] = (j, at)
            at += lengths[i] + 1
        joined_width = max(joined_width, at - 1)
    aligned = {k: v for k, v in data.batch.items() if v.dim() == 2 and v.shape[1] == width}
    joined = {k: v.new_zeros((len(members), joined_width)) for k, v in aligned.items()}
    for i, (j, at) in place.items():
        for k, v in aligned.items():
            joined[k][j, at:at + lengths[i]] = v[i, :lengths[i]]
    first = np.array([rows[0] for rows in members.values()])
    out = estimate(DataProto.from_dict(tensors=joined, non_tensors={k: v[first] for k, v in data.non_tensor_batch.items()},
                                       meta_info=dict(data.meta_info)))
    for key in ("advantages", "returns"):
        value = torch.zeros_like(mask, dtype=out.batch[key].dtype)
        for i, (j, at) in place.items():
            value[i, :lengths[i]] = out.batch[key][j, at:at + lengths[i]]
        data.batch[key] = value * mask.to(value.dtype)
    return data


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _load_policy(c: RunConfig, model: Any, tokenizer: Any) -> tuple[torch.nn.Module, Any]:
    """``model.path`` (the embedded model by default) in fp32, or the given model and its tokenizer."""
    if model is None:
        path = resolve_model_path(c.model.path)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer is None:
        raise ConfigError("PPOTrainer: a model was given without its tokenizer")
    return model.float(), tokenizer


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy (KL loss or in-reward KL): the initial weights, frozen."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


@contextmanager
def _timed(timing: dict[str, float], name: str) -> Iterator[None]:
    """``timing/<name>_s``: the wall time of the block."""
    t0 = time.perf_counter()
    yield
    timing[f"timing/{name}_s"] = time.perf_counter() - t0


def _show_progress(bar: Any, m: dict[str, float]) -> None:
    labels = {"reward/mean": "reward", "accuracy/mean": "acc", "actor/logprob_gap_mean": "lp_gap"}
    bar.update(1)
    bar.set_postfix({name: f"{m[k]:.3g}" for k, name in labels.items() if m.get(k) is not None}, refresh=False)


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
