"""verl's vLLM weight sync, made to fail instead of hang, and to load tied weights whatever the bucket.

verl pushes the trainer's weights into each vLLM server after every update
(``ServerAdapter.update_weights``, ``verl/workers/rollout/vllm_rollout/vllm_rollout.py``): it asks the
server's workers to receive (``update_weights_from_ipc``, a Ray call it does not wait for yet), then
sends bucket after bucket over a ZMQ socket and waits for each bucket's acknowledgement with a plain
``socket.recv()`` (``bucketed_weight_transfer.py:136``). Two faults of that code (seen on the CPU; verl's
code is the same on a GPU, where none of this has run):

- **A hang.** When loading fails on the vLLM side, no acknowledgement ever comes, and the trainer
  waits forever without an error; when the rollout server is gone before it connects (killed, out
  of memory), the sender's first ``send`` blocks forever (a REQ socket without a peer, seen here).
  Guarded, the sender's socket waits for the peer and for each acknowledgement in short polls;
  between polls it looks at the receiving call: once that has failed, the sync fails with the
  receiver's own error (``WeightSyncError``), and a receiver that connects or answers nothing for
  ``VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S`` seconds (default 600) fails it too. The sender's cleanup
  (verl's) then closes the socket and unlinks the shared-memory bucket.
- **Tied weights across buckets.** A model whose ``lm_head`` is tied to its input embeddings is
  sent with both names. vLLM's plain ``load_weights`` (verl's GPU path) skips the alias but raises when
  a bucket holds it without the weight it aliases (``vllm/model_executor/models/utils.py``,
  ``_check_skipped_aliases``: "was skipped because it is tied to"; read in vLLM's code, not run here),
  which happens whenever the two fall into different buckets. The alias carries no value of its own
  (vLLM ties the layer to the embedding), so :func:`tied_aliases` finds the model's tied names (on the
  meta device, from the model's config) and the adapter does not send them. On the CPU's in-place
  reload (``cpu/vllm_worker.py``) the alias loads without error (tests/va_vllm_reload.py's negative
  control): there the filter only spares a duplicate of the embedding per sync.
- **A tensor larger than the bucket** (shared memory, where verl cannot send one on its own) fails
  with both sizes and the setting to raise, before anything is sent for it.

Nothing of verl's is copied: :class:`GuardedServerAdapter` is verl's ``ServerAdapter`` whose
``update_weights`` filters the weights (tied aliases, oversized tensors) and then runs verl's own method,
with two hooks of its own around it. It overrides ``_execute_method`` to keep the receiving call verl
starts, and, for the length of its call (a context variable), verl's sender's socket is wrapped by
:class:`~verl_agentic.verl_plugin.weight_sync.GuardedSocket`: :func:`guard_the_sender_socket` wraps
``BucketedWeightSender._init_socket`` once per process, and the wrapper changes nothing outside a guarded
call (another adapter's sync sees verl's socket). Delta flushes (``wire_format="delta_flush"``, CUDA IPC)
are verl's own path, unguarded.

Where it applies (the plugin's registry, ``upstream.py``: ``weight_sync_guard``, ``weight_sync_sender``):
in CPU mode, where it ran (tests/test_verl_vllm.py). It never ran on a GPU, so a GPU run keeps verl's
adapter unless ``VERL_AGENTIC_WEIGHT_SYNC_GUARD=1`` switches it on (``=0`` switches it off everywhere).

This module imports verl's vLLM rollout (and so vLLM): verl loads it only when it builds a vLLM rollout.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import ray
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter

from verl_agentic.verl_plugin import upstream
from verl_agentic.verl_plugin.weight_sync import (
    GuardedSocket,
    WeightSyncError,
    checked,
    sync_timeout_s,
    tied_aliases,
)

__all__ = ["GuardedServerAdapter", "SenderGuard", "WeightSyncError", "guard_the_sender_socket", "guarded_sender"]


@dataclass
class SenderGuard:
    """What the sender's socket checks between polls: the receiving call (a Ray ``ObjectRef``'s future,
    once verl has started it), the longest wait, and the sync's name for errors."""

    timeout_s: float
    what: str
    receiver: Any = None  # concurrent.futures.Future of the receiving call, or None (this rank drives none)

    def receiver_error(self) -> Optional[BaseException]:
        if self.receiver is None or not self.receiver.done():
            return None
        return self.receiver.exception() or WeightSyncError("the receiving call returned before the last bucket")


_GUARD: contextvars.ContextVar[Optional[SenderGuard]] = contextvars.ContextVar("verl_agentic_sender_guard",
                                                                               default=None)


def guard_the_sender_socket() -> None:
    """Wrap verl's ``BucketedWeightSender._init_socket`` (once per process): after verl's own, the socket is
    a ``GuardedSocket`` when a guarded sync is under way in this context, else left as verl made it."""
    original = BucketedWeightSender._init_socket
    if getattr(original, "__verl_agentic_guard__", False):
        return

    @functools.wraps(original)
    def _init_socket(sender: Any) -> None:
        original(sender)
        guard = _GUARD.get()
        if guard is not None:
            sender.socket = GuardedSocket(sender.socket, guard.receiver_error, guard.timeout_s, guard.what)

    _init_socket.__verl_agentic_guard__ = True
    BucketedWeightSender._init_socket = _init_socket


@contextlib.contextmanager
def guarded_sender(guard: SenderGuard) -> Iterator[SenderGuard]:
    """Within this block (this task and the calls it awaits), verl's senders wait as ``guard`` says."""
    token = _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(token)


upstream.apply("weight_sync_sender")  # this module loads where verl builds the guarded adapter


class GuardedServerAdapter(ServerAdapter):
    """verl's vLLM ``ServerAdapter``; ``update_weights`` is verl's, guarded (see the module docstring)."""

    async def _execute_method(self, method: str, *args: Any, **kwargs: Any) -> Any:
        result = await super()._execute_method(method, *args, **kwargs)
        guard = _GUARD.get()
        if guard is not None and method == "update_weights_from_ipc" and isinstance(result, ray.ObjectRef):
            guard.receiver = result.future()  # the receiving call verl just started (non_block), not awaited yet
        return result

    async def update_weights(self, weights: Any, global_steps: Optional[int] = None,
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":  # delta flushes need CUDA IPC: verl's own path
            return await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        bucket_mb = self.config.checkpoint_engine.update_weights_bucket_megabytes
        weights = checked(weights, tied_aliases(self.model_config), bucket_mb if self.use_shm else None)
        guard = SenderGuard(sync_timeout_s(), f"weight sync for step {global_steps} (replica {self.replica_rank})")
        with guarded_sender(guard):
            return await super().update_weights(weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
