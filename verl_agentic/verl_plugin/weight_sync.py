"""How verl's weight sync waits for the rollout, and what it sends: the parts of ``vllm_sync.py``
that need no vLLM (so they are tested in this package's own environment).

- ``GuardedSocket``: a ZMQ socket whose ``send`` and ``recv`` give up, with the rollout's own error,
  once the receiving call has failed, and with a timeout when the rollout connects or answers nothing
  (``VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S``, default 600 s for one wait).
- ``tied_aliases``: the parameter names that only alias another (a tied ``lm_head.weight``), which
  the sync leaves out.
- ``checked``: the weights to send, without those names, and with a clear error for a tensor that
  cannot fit in a shared-memory bucket.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
import zmq

from verl_agentic.shm import SHM_DIR, WEIGHT_BUCKETS, orphans, remove_orphans

logger = logging.getLogger(__name__)

TIMEOUT_ENV = "VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600.0
POLL_MS = 200


class WeightSyncError(RuntimeError):
    """A weight push into the rollout that failed on the rollout side, or got no answer in time."""


def sync_timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV, "")
    try:
        timeout = float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        raise WeightSyncError(f"{TIMEOUT_ENV} must be a number of seconds, got {value!r}") from None
    if timeout <= 0:
        raise WeightSyncError(f"{TIMEOUT_ENV} must be > 0, got {value!r}")
    return timeout


def _last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


class GuardedSocket:
    """A ZMQ socket whose waits give up when the receiver has failed or the deadline passes.

    verl's sender blocks twice per message: in ``send`` until a receiver is connected (a REQ socket
    with no peer blocks, e.g. when the rollout died before it connected) and in ``recv`` until the
    acknowledgement comes. Both wait here in short polls, checking the receiving call between polls.
    """

    def __init__(self, socket: Any, receiver_error: Callable[[], Optional[BaseException]], timeout_s: float,
                 what: str):
        self._socket = socket
        self._receiver_error = receiver_error
        self._timeout_s = timeout_s
        self._what = what
        self.replies = 0

    def _wait(self, event: int) -> None:
        deadline = time.monotonic() + self._timeout_s
        while not self._socket.poll(POLL_MS, event):
            error = self._receiver_error()
            if error is not None and not self._socket.poll(1000, event):  # (an acknowledgement sent last thing)
                raise WeightSyncError(f"{self._what}: the rollout failed while receiving the weights (after "
                                      f"{self.replies} acknowledged messages): {_last_line(error)}") from error
            if time.monotonic() > deadline:
                state = "acknowledged nothing" if event == zmq.POLLIN else "did not connect to receive"
                raise WeightSyncError(f"{self._what}: the rollout {state} for {self._timeout_s:.0f} s "
                                      f"(after {self.replies} messages); set {TIMEOUT_ENV} to wait longer")

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._wait(zmq.POLLOUT)
        return self._socket.send(*args, **kwargs)

    def send_pyobj(self, *args: Any, **kwargs: Any) -> Any:
        self._wait(zmq.POLLOUT)
        return self._socket.send_pyobj(*args, **kwargs)

    def recv(self, *args: Any, **kwargs: Any) -> Any:
        self._wait(zmq.POLLIN)
        self.replies += 1
        return self._socket.recv(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._socket, name)


def aliases(named: Iterable[tuple[Any, Any]], key: Callable[[Any], Any] = id) -> list[Any]:
    """The names (first items) whose object (second item, compared by ``key``) an earlier name already
    has: the second and later names of a tied weight. The one tied-weight rule of the plugin: the sync
    leaves these out (:func:`tied_aliases`), the hf rollout accepts them (``cpu/hf_rollout.py``), vLLM's
    worker repacks the layers they name (``cpu/vllm_worker.py``)."""
    seen, out = set(), []
    for name, obj in named:
        k = key(obj)
        if k in seen:
            out.append(name)
        else:
            seen.add(k)
    return out


@functools.lru_cache(maxsize=8)
def _tied_aliases(path: str, trust_remote_code: bool) -> frozenset[str]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return frozenset(aliases(model.named_parameters(remove_duplicate=False)))


def tied_aliases(model_config: Any) -> frozenset[str]:
    """The parameter names of the model that only alias an earlier one (a tied ``lm_head.weight``),
    from an empty copy of the model built on the meta device. Empty, with a warning, for a model
    that cannot be built that way (it is then sent as verl sends it)."""
    path = getattr(model_config, "local_hf_config_path", None) or getattr(model_config, "local_path", None) \
        or model_config.path
    try:
        return _tied_aliases(str(path), bool(getattr(model_config, "trust_remote_code", False)))
    except Exception as e:  # a model class transformers cannot build from its config
        logger.warning("weight sync: cannot tell the tied weights of %s (%s); sending every name", path, e)
        return frozenset()


def checked(weights: Iterable[tuple[str, torch.Tensor]], skip: frozenset[str],
            bucket_mb: Optional[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights to send: without the names in ``skip``, and, where every tensor must fit in one
    bucket (``bucket_mb``: shared memory, no CUDA IPC), an error naming both sizes for one that does
    not (verl's own check is an ``assert`` after the earlier buckets went out)."""
    for name, tensor in weights:
        if name in skip:
            continue
        if bucket_mb is not None and tensor.nbytes > bucket_mb << 20:
            need = -(-tensor.nbytes // (1 << 20))
            raise WeightSyncError(
                f"{name} ({tuple(tensor.shape)}, {tensor.dtype}) is {need} MB and the weight-sync bucket is "
                f"{bucket_mb} MB: set actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes "
                f"to at least {need}")
        yield name, tensor


def orphaned_buckets(shm_dir: str = SHM_DIR) -> list[str]:
    """verl's shared-memory weight buckets of this user that no process maps or holds open.

    verl's sender creates the segment and keeps it mapped until its cleanup unlinks it; a sender
    killed before that (SIGKILL, out of memory) leaves it behind, and nothing else ever removes it.
    A segment in use is mapped by its sender, so an unmapped one is litter (``verl_agentic.shm``)."""
    return orphans(WEIGHT_BUCKETS, shm_dir)


def remove_orphaned_buckets(shm_dir: str = SHM_DIR) -> list[str]:
    """Remove :func:`orphaned_buckets`; returns what was removed. Another user's bucket, or one this
    user may not remove, is left alone without an error."""
    return remove_orphans(WEIGHT_BUCKETS, shm_dir)


GUARDED_ADAPTER = "verl_agentic.verl_plugin.vllm_sync.GuardedServerAdapter"


def register_guarded_adapter() -> None:
    """Put :data:`GUARDED_ADAPTER` in verl's rollout registry for ``("vllm", "async")`` (a private dict,
    ``verl/workers/rollout/base.py:89``); verl imports it only when it builds a vLLM rollout. The registry
    (``upstream.py``: ``weight_sync_guard``) applies this in CPU mode, and on a GPU only when switched on."""
    from verl.workers.rollout import base as rollout_base

    rollout_base._ROLLOUT_REGISTRY["vllm", "async"] = GUARDED_ADAPTER
