"""The ``hf`` rollout for verl's trainer: generation from our ``HFBackend`` in a Ray actor.

verl has no CPU rollout: its replicas are vLLM, SGLang and TRT-LLM servers. This module adds one
that serves generation with ``verl_agentic.backends.hf.HFBackend`` (batched decoding of
concurrent requests, token ids and logprobs) and receives the actor's new weights every step
through verl's own weight-sync path. Three pieces, as verl's vLLM rollout has them::

    trainer (v1)                      training worker process              rollout server actor
    ------------                      -----------------------              --------------------
    LLMServerManager ── HFReplica.launch_servers() ──────────────────────> HFRolloutServer
    agent loops ── LLMServerClient.generate ─────────────────────────────> .generate -> TokenOutput
    CheckpointEngineManager("naive")
      -> actor_wg.update_weights ──> HFRolloutAdapter.update_weights ────> .update_weights
         (engine_workers.py:728-823:   (a BaseRollout: full HF-named        (load_state_dict; checks
          resume(["weights"]),          tensors from FSDP, one dict)         nothing is missing)
          update_weights, barrier,
          resume(["kv_cache"]))

Select it with ``actor_rollout_ref.rollout.name=hf`` in CPU mode (``VERL_PLATFORM=cpu``; see
``verl_plugin/cpu/__init__.py``). One replica per training rank (``tensor_model_parallel_size=1``);
the server actor is named ``verl_agentic_hf_server_<replica rank>`` so the adapter in the training
worker finds it.

Every weight push is checked: the pushed names must cover the server model's state dict (tied
weights aside) and contain nothing else, or the push fails with the names. Each push is recorded
(``weight_log.py``: global step, tensors, a weight fingerprint, the largest change from the previous
push), so a run can show that each update reached the rollout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Generator, Optional

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from verl_agentic.interfaces import WEIGHT_DTYPE_NAMES, ConfigError, canonical_weight_dtype
from verl_agentic.verl_plugin.cpu.weight_log import log_push, weight_fingerprint
from verl_agentic.verl_plugin.weight_sync import aliases

logger = logging.getLogger(__name__)

SERVER_NAME = "verl_agentic_hf_server_{rank}"
HF_WEIGHT_DTYPE_KEY = "actor_rollout_ref.rollout.engine_kwargs.hf.weight_dtype"
HF_SERVER_CLASS_KEY = "actor_rollout_ref.rollout.engine_kwargs.hf.server_class"


def _ray_node() -> Optional[str]:
    """This process's Ray node id (None outside Ray: a server built in a test's own process)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _hf_engine_kwargs(config: Any) -> Any:
    """``rollout.engine_kwargs.hf`` (the hf rollout's own settings), or an empty dict."""
    kwargs = getattr(config, "engine_kwargs", None) or {}
    return (kwargs.get("hf") if hasattr(kwargs, "get") else None) or {}


def hf_server_class(config: Any) -> type:
    """The server actor's class: ``HFRolloutServer`` unless ``engine_kwargs.hf.server_class`` names a
    subclass (``module.Class``, importable in the Ray workers), as vLLM's ``worker_extension_cls`` names
    its worker's extension. The tests use it to pace generation against the trainer's updates."""
    name = _hf_engine_kwargs(config).get("server_class")
    if not name:
        return HFRolloutServer
    import importlib

    module, _, attr = str(name).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{HF_SERVER_CLASS_KEY}={name!r}: cannot import it ({e})") from e
    if not (isinstance(cls, type) and issubclass(cls, HFRolloutServer)):
        raise ConfigError(f"{HF_SERVER_CLASS_KEY}={name!r}: not a subclass of {HFRolloutServer.__qualname__} "
                         f"(write it as module.Class)")
    return cls


def hf_weight_dtype(config: Any) -> str:
    """The hf rollout's precision: float32 (the trainer's) unless ``engine_kwargs.hf.weight_dtype`` asks
    for ``bfloat16`` or ``int8`` (bf16/int8 copies of the linear weights; the pushed weights stay fp32).
    verl's ``rollout.dtype`` is not used: its default is bfloat16 (vLLM's and SGLang's precision), so
    following it would make every hf rollout low-precision without anyone asking (or refused on a CPU
    without AVX512-BF16). When it differs, one line says so and names the key."""
    name = canonical_weight_dtype(_hf_engine_kwargs(config).get("weight_dtype", "float32"), HF_WEIGHT_DTYPE_KEY)
    verl_dtype = str(getattr(config, "dtype", None) or "").removeprefix("torch.").lower()
    if verl_dtype and WEIGHT_DTYPE_NAMES.get(verl_dtype, verl_dtype) != name:
        logger.info("hf rollout: generating in %s; actor_rollout_ref.rollout.dtype=%s is for vLLM/SGLang "
                    "(set %s=bfloat16 for a bf16 hf rollout)", name, verl_dtype, HF_WEIGHT_DTYPE_KEY)
    return name


class HFRolloutServer:
    """A rollout server (a Ray actor): ``generate`` for verl's ``LLMServerClient``, and the control
    calls verl makes on every replica's servers.

    Partial rollouts (verl's async trainers, ``trainer.v1.trainer_mode=colocate_async``), as verl's
    vLLM server does them (``vllm_async_server.py``: ``abort_all_requests``, ``_park_until_admitted``,
    ``resume_generation``): ``abort_all_requests`` closes the submission gate and answers every
    request in flight with the tokens and logprobs it has (``stop_reason="aborted"``; verl's
    ``FullyAsyncLLMServerClient`` resumes it with prompt + those tokens); requests arriving behind
    the closed gate wait for ``resume_generation`` (or are answered ``aborted`` at once with
    ``reject_request``). Every output carries the policy version its tokens came from
    (``extra_fields["global_steps"]``, the step of the weights in use when the request was admitted;
    the backend ends a request rather than let it continue across a weight change). Sleep, wake-up
    and the KV-cache calls are no-ops for an in-process model on the host.
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        # in the rollout worker, when verl builds it (the module is imported by every verl process)
        from verl_agentic.backends.hf import HFBackend
        from verl_agentic.verl_plugin.backend import BackendLLMClient

        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        path = model_config.local_path
        tokenizer = AutoTokenizer.from_pretrained(model_config.local_tokenizer_path or path,
                                                  trust_remote_code=model_config.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                     trust_remote_code=model_config.trust_remote_code)
        # no packed fp32 linear copies here: this actor shares the machine with verl's FSDP workers, and a
        # second copy of the weights (and its repack after every push) cost memory Ray then reclaims by
        # killing an actor (NODE_OUT_OF_MEMORY, seen on 24 GB); the KV cache is kept to 1 GB.
        self.backend = HFBackend(model, tokenizer, max_batch_size=int(config.max_num_seqs or 64),
                                 seed=int(getattr(config, "seed", 0) or 0) + replica_rank,
                                 packed_linear=False, kv_cache_gb=1.0, weight_dtype=hf_weight_dtype(config),
                                 weight_dtype_setting=HF_WEIGHT_DTYPE_KEY)
        # verl's generate signature and sampling dict -> our backend (refuses what it cannot do)
        self.client = BackendLLMClient(self.backend, default_max_tokens=int(config.response_length))
        self.tied = self._tied_names(model)
        self.expected = set(model.state_dict()) - self.tied
        self.global_steps: Optional[int] = None
        self.last_state: Optional[dict[str, torch.Tensor]] = None
        self.pushes = 0
        self._gate = asyncio.Event()  # set: requests are admitted
        self._gate.set()
        self._rejecting = False
        logger.info("hf rollout server %d: %s (%d tensors, max batch %d, weights %s)", replica_rank, path,
                    len(self.expected), self.backend.max_batch_size, self.backend.weight_dtype)

    @staticmethod
    def _tied_names(model: Any) -> set[str]:
        """State-dict names that share storage with an earlier name (e.g. ``lm_head.weight`` tied to
        the input embeddings): the trainer may send either."""
        return set(aliases(model.state_dict(keep_vars=True).items(), key=lambda tensor: tensor.data_ptr()))

    # -- generation -------------------------------------------------------------------------
    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> TokenOutput:
        while not self._gate.is_set():  # a weight update is under way
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted",
                                   extra_fields={"global_steps": self.global_steps})
            await self._gate.wait()
        version = self.global_steps  # the weights this request's tokens come from (see the class docstring)
        out = await self.client.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                         image_data=image_data, video_data=video_data, **kwargs)
        out.extra_fields = {"global_steps": version}
        return out

    # -- weights ----------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: Optional[int] = None,
                             sender_node: Optional[str] = None) -> dict:
        """Load a push; ``sender_node`` is the Ray node of the training worker that sent it (recorded)."""
        names = set(state)
        missing = sorted(self.expected - names)
        unexpected = sorted(names - self.expected - self.tied)
        if missing or unexpected:
            raise RuntimeError(f"hf rollout server {self.replica_rank}: weight push for step {global_steps} has "
                               f"missing tensors {missing[:10]} (of {len(missing)}) and unexpected tensors "
                               f"{unexpected[:10]} (of {len(unexpected)})")
        start = time.perf_counter()
        model = self.backend.model
        # no forward pass may run while the weights change; the backend drops its KV cache after
        await self.backend.call_between_steps(lambda: model.load_state_dict(state, strict=False))
        fingerprint = weight_fingerprint((k, v) for k, v in model.state_dict().items() if k in self.expected)
        change = None
        if self.last_state is not None:
            change = max(float((state[k].float() - self.last_state[k].float()).abs().max()) for k in self.expected)
        record = {"replica": self.replica_rank, "push": self.pushes, "global_steps": global_steps,
                  "node": _ray_node(), "sender_node": sender_node, "tensors": len(names), "missing": len(missing),
                  "fingerprint": fingerprint, "max_abs_change": change, "load_s": round(time.perf_counter() - start, 3)}
        self.last_state = {k: v.detach().clone() for k, v in state.items() if k in self.expected}
        self.global_steps = global_steps
        self.pushes += 1
        log_push(record, f"hf rollout server {self.replica_rank}")
        return record

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # -- partial rollouts ---------------------------------------------------------------------
    async def abort_all_requests(self, reject_request: bool = False, **kwargs: Any) -> dict:
        """Close the gate, then answer every request in flight with what it has (see the class docstring)."""
        self._gate.clear()
        self._rejecting = reject_request
        aborted = await self.backend.abort_all()  # counted in the engine's stats ("aborted")
        logger.info("hf rollout server %d: aborted %d requests", self.replica_rank, aborted)
        return {"aborted_count": aborted, "request_ids": []}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._gate.set()

    # -- control calls: nothing to free or pause for an in-process model -----------------------
    async def wake_up(self, tags: Optional[list[str]] = None) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def wait_for_requests_to_drain(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...

    def stats(self) -> dict:
        return {**self.backend.stats(), "weight_pushes": self.pushes, "global_steps": self.global_steps}


class HFReplica(RolloutReplica):
    """One ``HFRolloutServer`` per replica, on the node of its training worker (as verl's vLLM replica
    places its servers: ``vllm_async_server.py``, ``launch_servers``), so a weight push stays on its node."""

    async def launch_servers(self) -> None:
        if self.world_size != 1:
            raise ValueError(f"the hf rollout serves one process per replica: set "
                             f"actor_rollout_ref.rollout.tensor_model_parallel_size=1 (world size is {self.world_size})")
        placement = {}
        if self.workers:  # hybrid (sync, colocate_async): the replica's training worker is known
            node = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
            placement["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        server = ray.remote(hf_server_class(self.config)).options(
            name=SERVER_NAME.format(rank=self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0,
            **placement,
        ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        await server.stats.remote()  # wait until the model is loaded: errors surface here
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"hf-rollout-{self.replica_rank}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFRolloutAdapter(BaseRollout):
    """The ``BaseRollout`` verl builds inside each training worker (``engine_workers.py``): it
    forwards the weights verl's naive checkpoint engine hands it to this replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        world = 1  # tensor_model_parallel_size is 1 (HFReplica checks)
        self.replica_rank = rank // world
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:  # the replica starts its server after the workers: look it up on first use
            self._server = ray.get_actor(SERVER_NAME.format(rank=self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf rollout takes full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the hf rollout does not take LoRA adapters (set model.lora.merge=true)")
        state = {}
        for name, tensor in weights:
            if hasattr(tensor, "full_tensor"):  # a DTensor: gather it
                tensor = tensor.full_tensor()
            state[name] = tensor.detach().to("cpu", copy=True)
        await self._server_handle().update_weights.remote(state, kwargs.get("global_steps"),
                                                           sender_node=_ray_node())
