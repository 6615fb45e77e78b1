"""Which of verl's trainer modes (``trainer.v1.trainer_mode``) run on the CPU, and the error for the one that does not.

- ``sync`` and ``colocate_async`` run with both rollouts (``hf``, ``vllm``): the rollout shares the
  trainer's processes and takes the weights through verl's ``naive`` checkpoint engine.
- ``separate_async`` does not. verl's ``PPOTrainerSeparateAsync.__init__``
  (``verl/trainer/ppo/v1/trainer_separate_async.py:64-70``) asserts a standalone rollout pool
  (``actor_rollout_ref.rollout.nnodes`` and ``n_gpus_per_node`` > 0) and a checkpoint engine other
  than ``naive``; verl's others (``nccl``, ``nixl``, ``mooncake``, ``hccl``: ``verl/checkpoint_engine/``)
  move the weights over accelerator transports, and no CPU one exists. Rather than an
  ``AssertionError`` deep in a Ray actor's traceback, CPU mode replaces that constructor's first step
  with :data:`SEPARATE_ASYNC_ON_CPU` (once verl's trainer loads the module: ``on_import``), and the
  launch script prints it before anything starts.
"""

from __future__ import annotations

from typing import Any

from verl_agentic.interfaces import ConfigError
from verl_agentic.verl_plugin.on_import import after_import

SEPARATE_ASYNC_MODULE = "verl.trainer.ppo.v1.trainer_separate_async"
SEPARATE_ASYNC_ON_CPU = (
    "trainer.v1.trainer_mode=separate_async does not run on the CPU: it needs a standalone rollout pool and a "
    "checkpoint engine other than naive (verl's nccl, nixl, mooncake and hccl all move weights between "
    "accelerators; verl/trainer/ppo/v1/trainer_separate_async.py:64-70); use trainer.v1.trainer_mode=colocate_async "
    "(partial rollouts across weight updates, staleness control) or sync")


def refuse_separate_async_on_import() -> None:
    """:func:`refuse_separate_async` once verl's trainer imports the module (``on_import``)."""
    after_import(SEPARATE_ASYNC_MODULE, refuse_separate_async)


def refuse_separate_async(module: Any) -> None:
    """Make verl's separate-async trainer fail with :data:`SEPARATE_ASYNC_ON_CPU` (CPU mode only)."""
    cls = module.PPOTrainerSeparateAsync

    def __init__(self: Any, config: Any) -> None:
        raise ConfigError(SEPARATE_ASYNC_ON_CPU)

    cls.__init__ = __init__


__all__ = ["refuse_separate_async", "refuse_separate_async_on_import", "SEPARATE_ASYNC_MODULE", "SEPARATE_ASYNC_ON_CPU"]
