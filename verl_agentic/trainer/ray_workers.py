"""``trainer.use_ray=true``: the rollout and the reward scoring run in Ray actors.

The trainer process keeps the policy being trained; the rollout actor holds its own copy of
the model for an HF backend and receives the new weights (through Ray's object store) before
every rollout, so it always samples from the current policy. The reward actor owns the
reward manager (a prime pool then lives in its process, not the trainer's). Episodes sample
with the same per-request seeds as in-process, so a Ray step generates the same tokens as a
local one from the same weights.

Ray is started on first use with ``ray_init`` settings (``trainer.ray_init.num_cpus`` ...), or
joins a running cluster when ``RAY_ADDRESS`` is set.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any, Optional

import torch

from verl_agentic.backends.hf import HFBackend
from verl_agentic.config import RunConfig
from verl_agentic.registry import import_modules
from verl_agentic.reward import RewardConfig, make_reward_manager, score_trajectories
from verl_agentic.rollout import AsyncRollout
from verl_agentic.trainer.recording import recording_writer


class RolloutWorker:
    """Runs ``AsyncRollout`` against an HF backend of its own (a Ray actor)."""

    def __init__(self, model_config: Any, tokenizer: Any, rollout_cfg: Any, task_configs: dict,
                 default_task_type: str, max_batch_size: int, seed: int, hf_options: dict | None = None,
                 imports: tuple = ()) -> None:
        from transformers import AutoModelForCausalLM

        import_modules(imports, "imports")  # the user's tasks register in this process too

        config = copy.deepcopy(model_config)
        # the trainer's backend may have switched the model to our grouped attention, which is
        # registered per process: build with sdpa, this process's HFBackend switches it again
        config._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        self.backend = HFBackend(model, tokenizer, max_batch_size=max_batch_size, seed=seed, **(hf_options or {}))
        self.rollout_cfg = rollout_cfg
        self.task_configs = task_configs
        self.default_task_type = default_task_type

    def set_weights(self, state_dict: dict) -> None:
        self.backend.model.load_state_dict(state_dict)

    def set_backend_rng(self, state: Any) -> None:
        self.backend._seed_rng.setstate(state)

    def backend_rng(self) -> Any:
        return self.backend._seed_rng.getstate()

    def rollout(self, rows: list[dict], seed: int, rollout_cfg: Any = None, record: Any = None) -> list[dict]:
        """``record``: ``(folder, header)`` of ``output.record`` (the trainer's; this process writes it)."""
        with recording_writer(record) as recorder:
            return AsyncRollout(self.backend, rollout_cfg or self.rollout_cfg, task_configs=self.task_configs,
                                default_task_type=self.default_task_type, seed=seed, progress=False,
                                recorder=recorder).run_sync(rows)

    def close(self) -> None:
        asyncio.run(self.backend.close())


class RewardWorker:
    """Scores trajectories with the configured reward manager (a Ray actor)."""

    def __init__(self, reward_config: dict) -> None:
        self.manager = make_reward_manager(RewardConfig.from_dict(reward_config))

    def score(self, trajectories: list[dict]) -> list[dict]:
        score_trajectories(trajectories, self.manager)
        return [{"score": t["score"], "score_extra": t["score_extra"], "score_error": t["score_error"]}
                for t in trajectories]

    def close(self) -> None:
        self.manager.close()


class RayWorkers:
    """The trainer's handle on the two actors: the rollout's (a copy of ``model``, with ``hf_options``)
    and, when there is a reward manager (``scorer_config``), the reward's."""

    def __init__(self, c: RunConfig, model: Any, tokenizer: Any, hf_options: dict, scorer_config: Optional[dict],
                 ray_init: dict) -> None:
        import ray  # Ray is optional (trainer.use_ray)

        if not ray.is_initialized():
            ray.init(**ray_init)
        self._ray = ray
        self.rollout = ray.remote(RolloutWorker).options(num_cpus=0).remote(
            model.config, tokenizer, c.rollout, c.task, c.task_type, c.generation.max_batch_size, c.seed,
            hf_options, c.imports)
        self.reward = None
        if scorer_config is not None:
            self.reward = ray.remote(RewardWorker).options(num_cpus=0).remote(scorer_config)

    def rollout_rows(self, rows: list[dict], seed: int, state_dict: dict, rollout_cfg: Any = None,
                     record: Any = None) -> list[dict]:
        ray = self._ray
        weights = ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
        ray.get(self.rollout.set_weights.remote(weights))
        return ray.get(self.rollout.rollout.remote(rows, seed, rollout_cfg, record))

    def score(self, trajectories: list[dict]) -> None:
        results = self._ray.get(self.reward.score.remote(trajectories))
        for t, r in zip(trajectories, results):
            t.update(r)

    def backend_rng(self) -> Any:
        return self._ray.get(self.rollout.backend_rng.remote())

    def set_backend_rng(self, state: Any) -> None:
        self._ray.get(self.rollout.set_backend_rng.remote(state))

    def close(self) -> None:
        ray = self._ray
        for actor in (self.rollout, self.reward):
            if actor is not None:
                try:
                    ray.get(actor.close.remote(), timeout=30)
                finally:
                    ray.kill(actor)
