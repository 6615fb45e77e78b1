"""Inside vLLM's CPU worker process: verl's weight sync, loaded in place so vLLM keeps its fast kernels.

vLLM's CPU backend repacks every linear layer for its GEMM kernels once the weights are loaded and
leaves an empty ``Parameter`` behind (``vllm/model_executor/layers/linear.py:206-216`` ->
``layers/utils.py:470-600``, ``remove_weight=True``). verl's sync (``vLLMColocateWorkerExtension``,
``verl/workers/rollout/vllm_rollout/utils.py:405``) calls ``model.load_weights`` on that model and
fails (``'Parameter' object has no attribute 'weight_loader'``, ``linear.py:1341``). vLLM has an
in-place reload for exactly this (``vllm/model_executor/model_loader/reload/``): it puts each layer
back in checkpoint form on the meta device, buffers the incoming weights per layer, and when a layer
is complete materializes it, loads it, runs the layer's own post-processing (the repack) and copies
the result into the original storage. :class:`InPlaceReload` drives it bucket by bucket, as verl
sends the weights, and adds what a sync must not lack:

- each bucket's tensors are copied out of the transfer buffer, which the next bucket overwrites while
  a layer split across buckets is still buffered;
- layers that share a weight with a reloaded one (a tied ``lm_head``) are repacked from it: the
  reload copies the new values into the shared storage, but the packed copy of the layer that loaded
  nothing would stay stale (``vocab_parallel_embedding.py:67-71`` keeps the weight and packs a copy);
- every parameter of the model must arrive, or the sync fails naming what is missing (vLLM's reload
  only logs it and keeps the old values);
- each sync is recorded (``weight_log.py``: a fingerprint of the tensors that arrived, the largest
  change of the weights vLLM keeps readable, the time), so a run can show that each update reached vLLM.

:class:`CPUWorkerExtension` is verl's worker extension with its ``update_weights_from_ipc`` replaced
by this. verl's receiver is reused as is, but for its cleanup: when loading fails, the bucket's views
into the shared-memory buffer are still alive and ``SharedMemory.close`` raises ``BufferError``
(``bucketed_weight_transfer.py:340``), which hides the real error; ``_Receiver`` lets the real one
through (the sender unlinks the segment, so nothing stays in /dev/shm).

This module imports vLLM: only vLLM's worker processes (and tests in vLLM's environment) load it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional

import torch

from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from verl_agentic.verl_plugin.cpu.weight_log import log_push, weight_fingerprint
from verl_agentic.verl_plugin.weight_sync import aliases

logger = logging.getLogger(__name__)


class WeightLoadError(RuntimeError):
    """A weight sync that vLLM's worker could not complete; the message says what went wrong."""


def _tied_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose ``weight`` is the same ``Parameter`` as an earlier module's (a tied lm_head)."""
    return aliases((m, m._parameters["weight"]) for m in model.modules() if m._parameters.get("weight") is not None)


class InPlaceReload:
    """One weight sync into a live vLLM model: ``begin()``, ``load(bucket)`` per bucket, ``finish()``.

    ``finish()`` returns the sync's record and raises ``WeightLoadError`` when a parameter of the
    model did not arrive. ``abort()`` ends a failed sync (layers not yet complete keep their old
    weights; the step that asked for the sync fails).
    """

    def __init__(self, model: torch.nn.Module, model_config: Any):
        self.model = model
        self.model_config = model_config
        self.expected = {name for name, _ in model.named_parameters()}
        self.loaded: set[str] = set()
        self.tensors = 0
        self.buckets = 0
        self.fingerprint = 0.0
        self.started = 0.0

    def begin(self) -> None:
        self.started = time.perf_counter()
        initialize_layerwise_reload(self.model)

    def load(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        # copies: a layer whose weights span two buckets keeps the first part buffered until the
        # second arrives, and the transfer buffer is overwritten in between
        self.loaded |= set(self.model.load_weights([(name, t.clone()) for name, t in bucket]))
        self.fingerprint += weight_fingerprint(bucket)
        self.tensors += len(bucket)
        self.buckets += 1

    def repack_tied(self) -> None:
        """Repack the layers that share a weight with an earlier one (a tied ``lm_head``) from the shared,
        now updated, weight. Without it their packed copy keeps the old values (tests/va_vllm_reload.py's
        negative control measures the logprobs then)."""
        for module in _tied_modules(self.model):
            module.quant_method.process_weights_after_loading(module)

    def abort(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)

    def finish(self) -> dict[str, Any]:
        finalize_layerwise_reload(self.model, self.model_config)
        self.repack_tied()
        missing = sorted(self.expected - self.loaded)
        if missing:
            raise WeightLoadError(f"vLLM weight sync: {len(missing)} of the model's {len(self.expected)} parameters "
                                  f"did not arrive, e.g. {missing[:5]}; they keep their old values")
        return {"tensors": self.tensors, "buckets": self.buckets, "parameters": len(self.loaded), "missing": 0,
                "fingerprint": self.fingerprint, "load_s": round(time.perf_counter() - self.started, 3)}


class _Receiver(BucketedWeightReceiver):
    """verl's receiver, except that a failed load reports its own error, not ``BufferError``."""

    def _cleanup(self) -> None:
        try:
            super()._cleanup()
        except BufferError:  # views of the failed bucket still point into the segment
            self.buffer = self.shm = None
            if self.socket is not None:
                self.socket.close(linger=0)
                self.socket = None


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension with the in-place weight sync (see the module docstring).

    vLLM mixes it into its worker class (no ``__init__`` of its own): the sync count and the last
    readable weights live in attributes set on the first sync. ``reload_class`` drives each sync (a
    subclass may name its own; the tests' failing load does: tests/va_vllm_faults.py)."""

    reload_class = InPlaceReload

    def update_weights_from_ipc(self, peft_config: Optional[dict] = None, base_sync_done: bool = False,
                                use_shm: bool = False, **kwargs: Any) -> None:
        if peft_config:
            raise NotImplementedError("the vLLM rollout on CPU takes full weights, not LoRA adapters "
                                      "(set actor_rollout_ref.model.lora.merge=true)")
        model = self.model_runner.model
        reload = self.reload_class(model, self.model_runner.vllm_config.model_config)
        pushes = getattr(self, "_va_pushes", 0)

        def on_bucket(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
            reload.load(weights)

        reload.begin()
        try:
            _Receiver(zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"),
                      use_shm=use_shm).receive_weights(on_bucket_received=on_bucket)
        except BaseException:
            reload.abort()
            raise
        record = reload.finish()
        # packed linear layers keep their weights inside the kernel: compare what stays readable
        # (embeddings, norms), which every update of a trained model changes too
        readable = {name: p.detach().clone() for name, p in model.named_parameters() if p.numel() > 0}
        last = getattr(self, "_va_last", None)
        change = None if last is None else max(float((readable[k].float() - v.float()).abs().max())
                                               for k, v in last.items())
        self._va_pushes, self._va_last = pushes + 1, readable
        log_push({"push": pushes, **record, "max_abs_change": change, "readable": len(readable), "pid": os.getpid()},
                 "vLLM worker")
