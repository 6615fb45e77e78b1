"""Trainer checkpoints (``verl_agentic/trainer/checkpoint.py``): a kill at any point of a save leaves a
loadable checkpoint.

A real process (forked from this one) saves step 1's checkpoint over an existing one (the same step
written again, as after a resume that stops at once) and is killed with SIGKILL in front of each
file-system operation of the save in turn: the write of ``state.pt``, each ``fsync``, each rename and each
removal. A wrapper in that process (test code, not shipped) makes each point observable: it writes a mark
file and waits there to be killed.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import traceback
from pathlib import Path

import pytest
import torch

from verl_agentic.trainer import checkpoint as ckpt

OLD, NEW = torch.zeros(50_000), torch.ones(50_000)


def _save_in_a_child(root: Path, marks: Path, stop_at: int) -> int:
    """Fork a process that writes step 1 (``old``), then writes it again (``new``) with its file-system
    operations counted; in front of operation ``stop_at`` it writes ``marks`` and waits. Returns its pid;
    a run to the end (``stop_at=0``) writes the operations' names to ``marks``."""
    pid = os.fork()
    if pid:
        return pid
    try:
        ops: list[str] = []

        def gated(name, real):
            def op(*args, **kwargs):
                ops.append(name)
                if len(ops) == stop_at:
                    marks.write_text(name)
                    time.sleep(120)
                return real(*args, **kwargs)
            return op

        ckpt.save_checkpoint(root, 1, {"step": 1, "version": "old", "w": OLD})
        os.rename, os.fsync = gated("rename", os.rename), gated("fsync", os.fsync)
        shutil.rmtree, torch.save = gated("rmtree", shutil.rmtree), gated("save", torch.save)
        ckpt.save_checkpoint(root, 1, {"step": 1, "version": "new", "w": NEW})
        marks.write_text(" ".join(ops))
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        os._exit(1)


def test_a_kill_at_any_point_of_a_save_leaves_a_loadable_checkpoint(tmp_path):
    whole = _save_in_a_child(tmp_path / "whole", tmp_path / "whole.ops", 0)
    assert os.waitpid(whole, 0)[1] == 0
    ops = (tmp_path / "whole.ops").read_text().split()
    assert ops.count("save") == 1 and ops.count("rename") >= 2 and ops.count("fsync") >= 3, ops
    for i, op in enumerate(ops, start=1):
        root, marks = tmp_path / f"kill{i}", tmp_path / f"kill{i}.marks"
        pid = _save_in_a_child(root, marks, i)
        deadline = time.monotonic() + 60
        while not marks.exists():
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), f"the save ended before operation {i} ({op})"
            assert time.monotonic() < deadline, f"the save never reached operation {i} ({op})"
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        folder = ckpt.latest_checkpoint(root)
        assert folder is not None, f"killed before operation {i} ({op}): no checkpoint: {sorted(os.listdir(root))}"
        state = ckpt.load_checkpoint(folder)
        assert state["step"] == 1 and state["version"] in ("old", "new"), (i, op)
        assert torch.equal(state["w"], NEW if state["version"] == "new" else OLD), (i, op)
        # the next save puts things in order: no leftovers, step 1 as it was loaded, then step 2
        ckpt.save_checkpoint(root, 2, {"step": 2})
        assert sorted(os.listdir(root)) == ["step_000001", "step_000002"], (i, op)
        assert ckpt.load_checkpoint(root / "step_000001")["version"] == state["version"]


def test_transient_checkpoints_give_way_to_newer_ones_and_do_not_count_against_the_kept(tmp_path):
    for step in (10, 20):
        ckpt.save_checkpoint(tmp_path, step, {"step": step}, max_to_keep=2)
    ckpt.save_checkpoint(tmp_path, 21, {"step": 21}, max_to_keep=2, transient=True)
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path)] == [10, 20, 21]
    ckpt.save_checkpoint(tmp_path, 22, {"step": 22}, max_to_keep=2, transient=True)
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path)] == [10, 20, 22]  # 21 gave way, 10 and 20 kept
    ckpt.keep(tmp_path / "step_000022")  # made an ordinary one: it counts now
    ckpt.save_checkpoint(tmp_path, 30, {"step": 30}, max_to_keep=2)
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path)] == [22, 30]
    assert sorted(os.listdir(tmp_path)) == ["step_000022", "step_000030"]


def test_a_save_that_fails_leaves_the_earlier_checkpoints(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1, {"step": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle this")

    with pytest.raises(RuntimeError, match="cannot pickle this"):
        ckpt.save_checkpoint(tmp_path, 1, {"step": 1, "bad": Unpicklable()})
    assert sorted(os.listdir(tmp_path)) == ["step_000001"]
    assert ckpt.load_checkpoint(tmp_path / "step_000001") == {"step": 1}


def test_a_stop_while_a_checkpoint_is_written_stays_a_stop(tmp_path, monkeypatch):
    """A signal handler raises ``KeyboardInterrupt`` inside one of torch's writes (as SIGTERM did in
    ``bench/stop_latency.py``); torch's zip writer then raises a RuntimeError of its own while closing. The
    save must end as the stop it is (``main_ppo``: exit code 143 and the continue command, not a traceback),
    with no partial folder."""
    real_save = torch.save

    class StoppedFile:
        """The file torch writes to; a stop comes during its third write."""

        def __init__(self, f) -> None:
            self.f, self.writes = f, 0

        def write(self, data) -> int:
            self.writes += 1
            if self.writes == 3:
                raise KeyboardInterrupt("stop requested")
            return self.f.write(data)

        def flush(self) -> None:
            self.f.flush()

    ckpt.save_checkpoint(tmp_path, 1, {"step": 1})
    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, StoppedFile(f)))
    with pytest.raises(KeyboardInterrupt, match="stop requested"):
        ckpt.save_checkpoint(tmp_path, 2, {"step": 2, "w": torch.zeros(100_000)})
    assert sorted(os.listdir(tmp_path)) == ["step_000001"]
