"""The reward-hacking and collapse monitors (``verl_agentic.monitors``) inside verl's trainer.

verl 0.9.1's v1 trainer computes a step's metrics in ``PPOTrainer._compute_metrics(batch, metrics,
timing_raw, global_steps, epoch)`` (``verl/trainer/ppo/v1/trainer_base.py:1868``), called once per
step after the update and the step's validation (``:503``) and before ``self.logger.log`` (``:514``);
it has no hook for callers. :func:`install` wraps that one method (a private name, listed in
``upstream.VERL``) when verl's trainer module is imported (:func:`install_on_import`): verl's own
metrics first, then :func:`observe_step`:

- the step's episodes are the ``agentic`` records our ``task_agent`` loop put in each sample's
  ``extra_fields`` (with the reward loop's ``reward_extra_info``), read from TransferQueue the way
  verl reads ``extra_fields`` itself (``trainer_base.py:1904``), and their rewards are verl's
  ``rm_scores`` (summed per sample, as ``_log_rollout_data`` does at ``:1309``);
- they go through the same batch summary and monitors as ``main_ppo``
  (``monitors.batch_summary`` + ``monitors.from_metrics(metrics, "verl")``: entropy, KL loss,
  held-out ``val-core/*/acc``); ``batch/*`` and ``monitor/*`` join the metrics verl logs, and a
  monitor that starts firing prints one warning line.

Settings: ``+agentic.monitors.*`` (``MonitorsConfig``: ``enabled``, ``thresholds.<name>``,
``stop_on``, ``baseline_steps``); a trainer config without an ``agentic`` section (not our loop) is
left alone. The stop rule (``stop_on``) saves a checkpoint (``_save_checkpoint``, unless this step
already saved one) and ends training after the step. Not seen here: the held-out episodes
(``heldout_answer_collapse`` needs them; verl's ``_validate`` keeps them to itself).
``VERL_AGENTIC_MONITORS=0`` leaves verl's method unwrapped.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any, Callable, Optional

from verl_agentic.interfaces import parse_section
from verl_agentic.monitors import MonitorsConfig, batch_summary, from_metrics, make_monitors, merge, numeric
from verl_agentic.verl_plugin.convert import AGENTIC_FIELD, plain
from verl_agentic.verl_plugin.on_import import after_import

logger = logging.getLogger(__name__)

STATE_ATTR = "_verl_agentic_monitors"  # the MonitorSet, kept on the trainer instance


def monitors_config(trainer_config: Any) -> Optional[MonitorsConfig]:
    """``agentic.monitors`` of verl's trainer config, checked; None without an ``agentic`` section."""
    agentic = plain(trainer_config.get("agentic")) if trainer_config is not None else None
    if not isinstance(agentic, dict):
        return None
    return parse_section(MonitorsConfig, agentic.get("monitors"), "agentic.monitors")


def episodes_from_fields(extra_fields: list, scores: list) -> tuple[list[dict], list[Optional[float]]]:
    """The episodes of samples whose ``extra_fields`` hold our ``agentic`` record (the rest are not
    ours and are left out), each with its ``reward_extra_info``, and their rewards. An episode of
    several rows is counted once, by its last row (the one verl scored)."""
    episodes, rewards = [], []
    for fields, score in zip(extra_fields, scores):
        fields = plain(fields) if fields is not None else {}
        agentic = fields.get(AGENTIC_FIELD) if isinstance(fields, dict) else None
        if not isinstance(agentic, dict) or agentic.get("row", 0) != agentic.get("rows", 1) - 1:
            continue
        episodes.append({**agentic, "reward_extra_info": fields.get("reward_extra_info") or {}})
        rewards.append(None if score is None else float(score))
    return episodes, rewards


def fields_from_tensordict(data: Any, tags: list) -> tuple[list, list]:
    """(extra_fields, reward per sample) from what TransferQueue returns for a step (a TensorDict with
    ``extra_fields`` and the jagged ``rm_scores``), padding samples (``tags``) left out. ``pop`` as verl
    does (``trainer_base.py:1909``): indexing a non-tensor column gives a ``LinkedList`` without
    ``tolist`` (a real run failed on it)."""
    keep = [not tag.get("is_padding", False) for tag in tags]
    extra = [f for f, k in zip(data.pop("extra_fields").tolist(), keep) if k]
    scores = [s for s, k in zip(data["rm_scores"].sum(dim=1).tolist(), keep) if k]
    return extra, scores


def fetch_from_transfer_queue(batch: Any) -> tuple[list, list]:
    """(extra_fields, reward per sample) of the step's samples (verl's v1 batch: a ``KVBatchMeta``)."""
    import transfer_queue as tq  # verl's trainer has it loaded; the plugin imports it only when the trainer runs

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields", "rm_scores"])
    return fields_from_tensordict(data, batch.tags)


def observe_step(trainer: Any, batch: Any, metrics: dict, global_steps: int,
                 fetch: Callable[[Any], tuple[list, list]] = fetch_from_transfer_queue) -> None:
    """Feed this step to the trainer's monitors (made on first use); see the module docstring."""
    config = monitors_config(getattr(trainer, "config", None))
    if config is None or not config.enabled:
        return
    monitors = getattr(trainer, STATE_ATTR, None)
    if monitors is None:
        monitors = make_monitors(config)
        setattr(trainer, STATE_ATTR, monitors)
    extra_fields, scores = fetch(batch)
    summary = batch_summary(*episodes_from_fields(extra_fields, scores))
    metrics.update(numeric(summary))
    for f in monitors.observe(global_steps, merge(summary, from_metrics(metrics, "verl"))):
        print(f"[verl-agentic] WARNING {f.line()}", file=sys.stderr, flush=True)
        logger.warning(f.line())
    metrics.update(monitors.metrics())
    if monitors.stop is not None and trainer.total_training_steps > global_steps:
        print(f"[verl-agentic] stopping after step {global_steps}: {monitors.stop.line()} "
              f"(agentic.monitors.stop_on={list(config.stop_on)})", file=sys.stderr, flush=True)
        save_freq = trainer.config.trainer.save_freq
        if not (save_freq > 0 and global_steps % save_freq == 0):  # verl saved none at this step
            trainer._save_checkpoint()
        trainer.total_training_steps = global_steps  # verl's loop ends after this step (trainer_base.py:467)


def observe_safely(trainer: Any, batch: Any, metrics: dict, global_steps: int,
                   fetch: Callable[[Any], tuple[list, list]] = fetch_from_transfer_queue) -> None:
    """:func:`observe_step`, but a failure of the monitors never stops training: it is reported once
    and the monitors are off for the rest of the run."""
    if getattr(trainer, STATE_ATTR, None) is False:
        return
    try:
        observe_step(trainer, batch, metrics, global_steps, fetch)
    except Exception as e:  # noqa: BLE001 - monitors only read; training goes on without them
        setattr(trainer, STATE_ATTR, False)
        line = f"[verl-agentic] WARNING the monitors failed at step {global_steps} and are off for this run: " \
               f"{type(e).__name__}: {e}"
        print(line, file=sys.stderr, flush=True)
        logger.warning(line)


TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def install(trainer_base: Any = None) -> None:
    """Wrap verl's ``PPOTrainer._compute_metrics`` (once per process; see the module docstring)."""
    if trainer_base is None:  # tests, and a process that imported the trainer before the plugin
        from verl.trainer.ppo.v1 import trainer_base

    original = getattr(trainer_base.PPOTrainer, "_compute_metrics", None)
    if original is None:  # a verl that moved it: tests/test_verl_cpu.py's guard names it (upstream.VERL)
        logger.warning("verl's PPOTrainer has no _compute_metrics: the monitors are off inside verl's trainer")
        return
    if getattr(original, "__verl_agentic_monitors__", False):
        return

    @functools.wraps(original)
    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        original(self, batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        observe_safely(self, batch, metrics, global_steps)

    _compute_metrics.__verl_agentic_monitors__ = True
    trainer_base.PPOTrainer._compute_metrics = _compute_metrics


def install_on_import() -> None:
    """:func:`install` now if verl's trainer module is loaded, else as soon as it is (``on_import``)."""
    after_import(TRAINER_MODULE, install)