"""Rollout correction in the trainer (``algorithm.rollout_correction``: TIS/MIS), as verl's trainer does it.

A rollout engine that computes logprobs differently from the trainer (a lower-precision rollout) samples
from a slightly different policy. In verl's decoupled mode the old logprobs are the trainer's own (so they
are recomputed whatever ``actor.recompute_old_logprobs`` says), and verl's helper turns the gap between
them and the rollout's into IS weights for the policy loss and a rejection mask on ``response_mask``,
before the advantages. ``bypass_mode`` keeps the rollout's logprobs as the old ones and does both inside
verl's ``bypass_mode`` loss (``verl_config.actor_config``). docs/training.md#rollout-correction.
"""

from __future__ import annotations

from typing import Any, Callable

from verl_agentic.config import RunConfig
from verl_agentic.trainer.batch import TrainBatch
from verl_agentic.trainer.verl_config import rollout_corr_helper


class RolloutCorrection:
    """``recompute``: whether the old logprobs are the trainer's own (recomputed before the update).
    ``verl_config``: verl's ``RolloutCorrectionConfig`` (``AlgoConfig.rollout_correction``)."""

    def __init__(self, c: RunConfig, verl_config: Any, log: Callable[[str], None]) -> None:
        rc = self.settings = c.algorithm.rollout_correction
        self.verl_config = verl_config
        self.recompute = c.actor.recompute_old_logprobs or (rc.corrects and not rc.bypass_mode)
        if self.needs_rollout_logprobs:
            how = ("bypass_mode: old logprobs = the rollout's, verl's bypass_mode loss (loss_type="
                   f"{rc.loss_type})") if rc.bypass_mode else (
                "old logprobs recomputed by the trainer" + ("" if c.actor.recompute_old_logprobs else
                                                            " (actor.recompute_old_logprobs=false overridden)"))
            log(f"rollout correction on (rollout_is={rc.rollout_is}, threshold {rc.rollout_is_threshold}; "
                f"rollout_rs={rc.rollout_rs}, threshold {rc.rollout_rs_threshold}): {how}")

    @property
    def needs_rollout_logprobs(self) -> bool:
        return self.settings.corrects or self.settings.bypass_mode

    def check(self, step: int, missing_logprobs: bool) -> None:
        """A step whose generated tokens lack the rollout's logprobs cannot be corrected: an error."""
        if missing_logprobs and self.needs_rollout_logprobs:
            raise RuntimeError(f"step {step}: algorithm.rollout_correction needs the rollout's logprobs, and some "
                               f"generated tokens have none (a backend that does not return logprobs)")

    def apply(self, data: Any, batch: TrainBatch, metrics: dict[str, float]) -> Any:
        """verl's helper on the step's ``DataProto`` (old logprobs recomputed, rollout's present): its
        ``rollout_corr/*`` metrics into ``metrics``, its rejection mask into ``batch.response_mask``, its IS
        weights into ``batch.extra["rollout_is_weights"]``; with ``rollout_is`` and ``rollout_rs`` off only
        the metrics. Returns the ``DataProto`` it made."""
        data, corr_metrics = rollout_corr_helper().compute_rollout_correction_and_add_to_batch(data, self.verl_config)
        metrics.update(corr_metrics)
        batch.response_mask = data.batch["response_mask"]
        if "rollout_is_weights" in data.batch:
            batch.extra["rollout_is_weights"] = data.batch["rollout_is_weights"]
        return data
