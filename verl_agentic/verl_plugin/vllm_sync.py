"""verl's vLLM weight sync, made to fail instead of hang, and to load tied weights whatever the bucket.

verl pushes the trainer's weights into each vLLM server after every update
(``ServerAdapter.update_weights``, ``verl/workers/rollout/vllm_rollout/vllm_rollout.py``): it asks the
server's workers to receive (``update_weights_from_ipc``, a Ray call it does not wait for yet), then
sends bucket after bucket over a ZMQ socket and waits for each bucket's acknowledgement with a plain
``socket.recv()`` (``bucketed_weight_transfer.py:136``). Two faults, on GPU as on CPU:

- **A hang.** When loading fails on the vLLM side, no acknowledgement ever comes, and the trainer
  waits forever without an error; when the rollout server is gone before it connects (killed, out
  of memory), the sender's first ``send`` blocks forever (a REQ socket without a peer, seen here).
  :class:`GuardedWeightSender` waits for the peer and for each acknowledgement in short polls;
  between polls it looks at the receiving call: once that has failed, the sync fails with the
  receiver's own error (``WeightSyncError``), and a receiver that connects or answers nothing for
  ``VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S`` seconds (default 600) fails it too. The sender's cleanup
  (verl's) then closes the socket and unlinks the shared-memory bucket.
- **Tied weights across buckets.** A model whose ``lm_head`` is tied to its input embeddings is
  sent with both names; vLLM skips the alias but raises when a bucket holds it without the weight it
  aliases (``vllm/model_executor/models/utils.py:477``, "was skipped because it is tied to"), which
  happens whenever the two fall into different buckets. The alias carries no value of its own (vLLM
  ties the layer to the embedding), so :func:`tied_aliases` finds the model's tied names (on the meta
  device, from the model's config) and the adapter does not send them.
- **A tensor larger than the bucket** (shared memory, where verl cannot send one on its own) fails
  with both sizes and the setting to raise, before anything is sent for it.

:class:`GuardedServerAdapter` is verl's adapter with that ``update_weights``; the plugin puts it in
verl's rollout registry for ``("vllm", "async")`` (``verl/workers/rollout/base.py:89``), in every
mode, GPU included. ``VERL_AGENTIC_WEIGHT_SYNC_GUARD=0`` leaves verl's adapter in place.

This module imports verl's vLLM rollout (and so vLLM): verl loads it only when it builds a vLLM rollout.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import torch

from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from verl_agentic.verl_plugin.weight_sync import (
    DEFAULT_TIMEOUT_S,
    GuardedSocket,
    WeightSyncError,
    checked,
    sync_timeout_s,
    tied_aliases,
)

logger = logging.getLogger(__name__)

__all__ = ["GuardedServerAdapter", "GuardedWeightSender", "WeightSyncError"]


class GuardedWeightSender(BucketedWeightSender):
    """verl's bucketed sender whose waits for the receiver end (see the module docstring).

    Args:
        receiver: the Ray ``ObjectRef`` of the receiving call (``update_weights_from_ipc``), or None
            where this rank does not drive it (then only the timeout applies).
        timeout_s: the longest wait for one acknowledgement.
        what: names the sync in errors, e.g. ``"weight sync for step 3"``.
    """

    def __init__(self, *args: Any, receiver: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 what: str = "weight sync", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._receiver = receiver.future() if receiver is not None else None
        self._timeout_s = timeout_s
        self._what = what

    def receiver_error(self) -> Optional[BaseException]:
        if self._receiver is None or not self._receiver.done():
            return None
        return self._receiver.exception() or WeightSyncError("the receiving call returned before the last bucket")

    def _init_socket(self) -> None:
        super()._init_socket()
        self.socket = GuardedSocket(self.socket, self.receiver_error, self._timeout_s, self._what)


class GuardedServerAdapter(ServerAdapter):
    """verl's vLLM ``ServerAdapter`` with :class:`GuardedWeightSender` and without tied aliases."""

    @torch.no_grad()
    async def update_weights(self, weights: Any, global_steps: Optional[int] = None,
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":  # delta flushes need CUDA IPC: verl's own path
            return await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        # the steps of verl's update_weights (vllm_rollout.py), with the guarded sender
        start = time.time()
        receiver = await self._execute_method("update_weights_from_ipc", non_block=True,
                                              kwargs={**kwargs, "use_shm": self.use_shm})
        bucket_mb = self.config.checkpoint_engine.update_weights_bucket_megabytes
        sender = GuardedWeightSender(zmq_handle=self.zmq_handle, bucket_size_mb=bucket_mb, use_shm=self.use_shm,
                                     receiver=receiver, timeout_s=sync_timeout_s(),
                                     what=f"weight sync for step {global_steps} (replica {self.replica_rank})")
        weights = checked(weights, tied_aliases(self.model_config), bucket_mb if self.use_shm else None)
        await sender.async_send_weights(weights)
        if receiver is not None:
            await receiver
        if self._has_server:
            await self.server_handle.clear_kv_cache.remote()
            if global_steps is not None:
                await self.server_handle.set_global_steps.remote(global_steps)
        if self.replica_rank == 0 and self.rollout_rank == 0:
            logger.info("update_weights done, time cost: %.2fs", time.time() - start)
