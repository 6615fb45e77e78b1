"""Every private name of verl and vLLM that the plugin relies on, in one place.

verl and vLLM document neither list below; the plugin's patches, subclasses and registry entries use
them. The tests import each one (``tests/test_verl_cpu.py`` in this environment; the vLLM-side list
in vLLM's environment, ``tests/test_verl_vllm.py``), so an upgrade that moves one fails there, by
name, instead of inside a training run. Each entry: (module, attribute, who uses it and why).
"""

from __future__ import annotations

# importable wherever verl is (this package's environment)
VERL = (
    ("verl.utils.distributed", "initialize_global_process_group_ray", "cpu/patches.py: the gloo backend string"),
    ("verl.workers.engine_workers", "initialize_global_process_group_ray", "cpu/patches.py: imported there by name"),
    ("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy", "cpu/patches.py: no pinned memory on CPU"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead", "cpu/patches.py: engines for 'cpu'"),
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithValueHead", "cpu/patches.py: engines for 'cpu'"),
    ("verl.workers.engine.base", "EngineRegistry", "cpu/patches.py: engines for 'cpu'"),
    ("verl.workers.rollout.base", "_ROLLOUT_REGISTRY", "cpu/__init__.py (hf adapter), __init__.py (guarded vLLM adapter)"),
    ("verl.workers.rollout.replica", "RolloutReplicaRegistry", "cpu/__init__.py: the hf and CPU vllm replicas"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_compute_metrics", "monitors.py: wrapped, the step's monitors"),
    ("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_save_checkpoint", "monitors.py: the stop rule's checkpoint"),
    ("verl.experimental.agent_loop.agent_loop.AgentLoopOutput", "as_dict",
     "turn_rewards.py: per-turn rewards added to rm_scores"),
)

# importable only where vLLM is (vLLM's environment, GPU images)
VLLM_SIDE = (
    ("verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter", "_execute_method",
     "vllm_sync.py: starts the receiving call without waiting"),
    ("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightSender", "_init_socket",
     "vllm_sync.py: wraps the socket the sender waits on"),
    ("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightReceiver", "_cleanup",
     "cpu/vllm_worker.py: lets a failed load report its own error"),
    ("verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension", "update_weights_from_ipc",
     "cpu/vllm_worker.py: replaced by the in-place reload"),
    ("verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension", "_get_zmq_handle",
     "cpu/vllm_worker.py: the socket verl's sender binds"),
    ("verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer", "_get_worker_extension_cls",
     "cpu/vllm_replica.py: the worker extension"),
    ("vllm.v1.engine.async_llm.AsyncLLM", "pause_generation",
     "cpu/vllm_replica.py: verl's wait_for_inflight_requests flag as vLLM 0.32's mode"),
    ("vllm.model_executor.model_loader.reload", "initialize_layerwise_reload", "cpu/vllm_worker.py"),
    ("vllm.model_executor.model_loader.reload", "finalize_layerwise_reload", "cpu/vllm_worker.py"),
    ("vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod", "process_weights_after_loading",
     "cpu/vllm_worker.py: repacks a tied lm_head"),
)


def missing(names: tuple) -> list[str]:
    """The entries of ``names`` that no longer resolve (``module[.Class]``, attribute)."""
    import importlib

    gone = []
    for target, attribute, _ in names:
        module_name, obj = target, None
        while obj is None:
            try:
                obj = importlib.import_module(module_name)
            except ModuleNotFoundError:
                if "." not in module_name:
                    gone.append(f"{target}.{attribute}")
                    break
                module_name = module_name.rpartition(".")[0]
        if obj is None:
            continue
        for part in target[len(module_name):].split(".")[1:]:
            obj = getattr(obj, part, None)
        if obj is None or not hasattr(obj, attribute):
            gone.append(f"{target}.{attribute}")
    return gone
