"""verl's weight sync as the plugin guards it (verl_agentic/verl_plugin/weight_sync.py), in this
environment: a real ZMQ socket pair, real model configs. The vLLM side runs in tests/test_verl_vllm.py."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
import types

import pytest
import torch
import zmq

from verl_agentic.verl_plugin.weight_sync import (
    TIMEOUT_ENV,
    GuardedSocket,
    WeightSyncError,
    checked,
    sync_timeout_s,
    tied_aliases,
)


@pytest.fixture
def socket_pair():
    """verl's layout: the sender binds a REQ socket, the receiver connects a REP socket."""
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    port = req.bind_to_random_port("tcp://127.0.0.1")
    rep = ctx.socket(zmq.REP)
    rep.connect(f"tcp://127.0.0.1:{port}")
    yield req, rep
    req.close(linger=0)
    rep.close(linger=0)


def _receiver(future: concurrent.futures.Future):
    return lambda: (future.exception() or WeightSyncError("returned early")) if future.done() else None


def test_a_receiver_that_fails_mid_sync_fails_the_sender_with_its_error(socket_pair):
    """What hangs verl's own sender forever: the receiver acknowledges one bucket, then fails on the
    next and never answers. The guarded wait ends as soon as the receiving call has failed, with its
    error as the cause."""
    req, rep = socket_pair
    receiving = concurrent.futures.Future()
    sender = GuardedSocket(req, _receiver(receiving), timeout_s=120, what="weight sync for step 3")
    sender.send_pyobj({"bucket": 0})
    assert rep.recv_pyobj() == {"bucket": 0}
    rep.send(b"")
    assert sender.recv() == b"" and sender.replies == 1
    sender.send_pyobj({"bucket": 1})
    assert rep.recv_pyobj() == {"bucket": 1}  # the receiver got it, and fails loading it
    cause = ValueError("size mismatch for model.norm.weight: copying a param with shape [4]")
    threading.Timer(0.5, receiving.set_exception, (cause,)).start()
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"weight sync for step 3: the rollout failed while receiving the "
                                              r"weights \(after 1 acknowledged messages\): size mismatch") as err:
        sender.recv()
    assert time.monotonic() - start < 5.0
    assert err.value.__cause__ is cause


def test_an_acknowledgement_sent_just_before_the_receiver_returns_is_not_an_error(socket_pair):
    req, rep = socket_pair
    done = concurrent.futures.Future()
    sender = GuardedSocket(req, _receiver(done), timeout_s=120, what="sync")
    sender.send_pyobj({"bucket": 0, "is_last": True})
    rep.recv_pyobj()
    done.set_result(None)  # the receiving call has returned ...
    threading.Timer(0.3, rep.send, (b"",)).start()  # ... and its last acknowledgement is still on the way
    assert sender.recv() == b""


def test_a_receiver_that_answers_nothing_times_out_naming_the_setting(socket_pair, monkeypatch):
    req, rep = socket_pair
    sender = GuardedSocket(req, lambda: None, timeout_s=1.0, what="weight sync for step 1")
    sender.send_pyobj({"bucket": 0})
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=f"acknowledged nothing for 1 s .*set {TIMEOUT_ENV}"):
        sender.recv()
    assert 0.9 < time.monotonic() - start < 5.0
    monkeypatch.setenv(TIMEOUT_ENV, "45")
    assert sync_timeout_s() == 45.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(WeightSyncError, match=TIMEOUT_ENV):
            sync_timeout_s()


def test_tied_aliases_are_the_names_that_share_a_parameter(smol_dir, tiny_qwen_dir, tmp_path):
    """SmolLM2 and the tiny Qwen2 tie lm_head to the input embeddings: lm_head.weight is the alias
    the sync leaves out. An untied copy of the config has none."""
    from transformers import AutoConfig

    for path in (smol_dir, tiny_qwen_dir):
        assert tied_aliases(types.SimpleNamespace(local_path=str(path), trust_remote_code=False)) == {"lm_head.weight"}
    config = AutoConfig.from_pretrained(tiny_qwen_dir)
    config.tie_word_embeddings = False
    config.save_pretrained(tmp_path)
    assert tied_aliases(types.SimpleNamespace(local_path=str(tmp_path), trust_remote_code=False)) == frozenset()
    # a folder transformers cannot build a model from: nothing is left out (a warning says why)
    assert tied_aliases(types.SimpleNamespace(local_path=str(tmp_path / "none"), trust_remote_code=False)) == frozenset()


def test_checked_leaves_out_aliases_and_names_both_sizes_of_a_tensor_too_big_for_the_bucket():
    weights = [("model.embed_tokens.weight", torch.zeros(1024, 512)), ("model.norm.weight", torch.zeros(512)),
               ("lm_head.weight", torch.zeros(1024, 512))]
    sent = [name for name, _ in checked(iter(weights), frozenset({"lm_head.weight"}), bucket_mb=4)]
    assert sent == ["model.embed_tokens.weight", "model.norm.weight"]
    assert len(list(checked(iter(weights), frozenset(), bucket_mb=None))) == 3  # CUDA IPC: any size
    stream = checked(iter(weights), frozenset(), bucket_mb=1)
    with pytest.raises(WeightSyncError, match=r"model.embed_tokens.weight \(\(1024, 512\), torch.float32\) is 2 MB "
                                              r"and the weight-sync bucket is 1 MB: set .*update_weights_bucket_megabytes"
                                              r" to at least 2"):
        next(stream)


def test_a_rollout_that_is_gone_before_it_connects_fails_the_first_send():
    """verl's sender binds a REQ socket and sends the bucket's address first: with no receiver ever
    connecting (the rollout server died), ``send`` blocks forever. Guarded, the failed receiving call
    ends it."""
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.bind_to_random_port("tcp://127.0.0.1")
    try:
        receiving = concurrent.futures.Future()
        sender = GuardedSocket(req, _receiver(receiving), timeout_s=120, what="weight sync for step 2")
        threading.Timer(0.5, receiving.set_exception, (RuntimeError("The actor died unexpectedly"),)).start()
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="step 2: the rollout failed .*The actor died unexpectedly"):
            sender.send_pyobj({"name": "verl_weights_x", "size": 1})
        assert time.monotonic() - start < 5.0
        lonely = GuardedSocket(req, lambda: None, timeout_s=1.0, what="weight sync")
        with pytest.raises(WeightSyncError, match="did not connect to receive for 1 s"):
            lonely.send(b"")
    finally:
        req.close(linger=0)


def test_orphaned_weight_buckets_are_found_and_removed_but_one_in_use_is_kept(tmp_path):
    """A killed sender leaves its shared-memory bucket behind; a segment some process still maps is
    in use and stays. (Real shared memory in /dev/shm, real /proc.)"""
    from multiprocessing import resource_tracker, shared_memory

    from verl_agentic.verl_plugin.weight_sync import orphaned_buckets, remove_orphaned_buckets

    in_use = shared_memory.SharedMemory(name=f"verl_weights_test_{os.getpid()}_live", create=True, size=4096)
    orphan = shared_memory.SharedMemory(name=f"verl_weights_test_{os.getpid()}_dead", create=True, size=4096)
    orphan.close()  # unmapped, not unlinked: what a killed sender leaves
    resource_tracker.unregister(orphan._name, "shared_memory")  # (this process will not unlink it at exit)
    try:
        found = orphaned_buckets()
        assert f"/dev/shm/{orphan.name}" in found and f"/dev/shm/{in_use.name}" not in found
        assert f"/dev/shm/{orphan.name}" in remove_orphaned_buckets()
        assert not os.path.exists(f"/dev/shm/{orphan.name}") and os.path.exists(f"/dev/shm/{in_use.name}")
    finally:
        in_use.close()
        in_use.unlink()
        if os.path.exists(f"/dev/shm/{orphan.name}"):
            os.unlink(f"/dev/shm/{orphan.name}")
