"""verl's vLLM replica and server for the CPU: the same classes, with the in-place weight sync.

Loaded by ``vllm_setup.load_replica`` when verl builds a ``vllm`` rollout in CPU mode (it imports
vLLM). The only change to verl's server is the worker extension it hands vLLM (verl's hook
``vLLMHttpServer._get_worker_extension_cls``), and a check of the settings vLLM's CPU engine refuses
before anything starts.
"""

from __future__ import annotations

from typing import Any

import ray

from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from verl_agentic.verl_plugin.cpu.vllm_setup import WORKER_EXTENSION, check_rollout_config


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server with :class:`~verl_agentic.verl_plugin.cpu.vllm_worker.CPUWorkerExtension`."""

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica serving :class:`CPUvLLMHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_rollout_config(self.config)
        self.server_class = ray.remote(CPUvLLMHttpServer)
