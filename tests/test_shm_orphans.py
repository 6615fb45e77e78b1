"""Shared memory left by killed processes (verl_agentic/shm.py), with real segments in /dev/shm and a real /proc:
a segment a dead process left is removed, one a live process holds is not, and on a shared host another
user's segment, or one this user may not remove, stays without an error. The test run's own clean-up after
each module (tests/conftest.py) goes through the same code."""

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from va_testing import REPO, SHM, remove_orphan_shm, shm_segments
from verl_agentic.shm import held, own_segments, remove_left_by_killed_runs, remove_orphans

LEAVE_ONE = """
import sys
from multiprocessing import resource_tracker, shared_memory
shm = shared_memory.SharedMemory(name=sys.argv[1] if len(sys.argv) > 1 else None, create=True, size=1 << 20)
resource_tracker.unregister(shm._name, "shared_memory")  # as vLLM's engine does: nobody unlinks it
print(shm.name)
"""
NOBODY = 65534


def _leave(name: str = None) -> str:
    """A segment made by a process that then exits without unlinking it (what Ray's kill leaves)."""
    return subprocess.run([sys.executable, "-c", LEAVE_ONE, *([name] if name else [])], capture_output=True,
                          text=True, check=True).stdout.strip()


def test_orphans_go_and_held_segments_stay():
    before = shm_segments()
    orphan = _leave()
    held_one = shared_memory.SharedMemory(create=True, size=1 << 20)  # this process maps it
    try:
        assert (SHM / orphan).exists() and {orphan, held_one.name} <= shm_segments()
        assert held({orphan, held_one.name}) == {held_one.name}
        assert remove_orphan_shm(before) == [orphan]
        assert not (SHM / orphan).exists() and (SHM / held_one.name).exists()
    finally:
        held_one.close()
        held_one.unlink()


def test_a_segment_held_only_by_an_open_descriptor_is_in_use(tmp_path):
    """A process that has the segment open but not (yet) mapped holds it too."""
    path = tmp_path / f"psm_{uuid.uuid4().hex[:8]}"
    path.write_bytes(b"x")
    with open(path, "rb"):
        assert held({path.name}, str(tmp_path)) == {path.name}
        assert remove_orphans("psm_", str(tmp_path)) == []
    assert remove_orphans("psm_", str(tmp_path)) == [str(path)]


def test_the_package_removes_what_killed_runs_left_and_only_that():
    """``python -m verl_agentic.shm`` (the CPU launch script runs it; the CPU vLLM replica calls the same
    before it starts its engine): verl's weight buckets and vLLM's ``psm_*`` segments of dead processes go;
    a held segment, another user's orphan and a segment of another name stay."""
    tag = uuid.uuid4().hex[:8]
    bucket, psm, other_name = _leave(f"verl_weights_{tag}"), _leave(f"psm_{tag}"), _leave(f"va_other_{tag}")
    theirs = _leave(f"psm_{tag}_theirs")
    if os.getuid() == 0:  # another user's (as root, give it away)
        os.chown(SHM / theirs, NOBODY, NOBODY)
    live = shared_memory.SharedMemory(name=f"psm_{tag}_live", create=True, size=4096)
    try:
        out = subprocess.run([sys.executable, "-m", "verl_agentic.shm"], capture_output=True, text=True, cwd=REPO,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"removed /dev/shm/{bucket}" in out.stdout and f"removed /dev/shm/{psm}" in out.stdout
        assert not (SHM / bucket).exists() and not (SHM / psm).exists()
        assert (SHM / live.name).exists() and (SHM / other_name).exists()
        if os.getuid() == 0:
            assert (SHM / theirs).exists() and theirs not in own_segments("psm_")
        assert remove_left_by_killed_runs() == ([] if os.getuid() == 0 else [f"/dev/shm/{theirs}"])
    finally:
        live.close()
        live.unlink()
        for name in (other_name, theirs):
            (SHM / name).unlink(missing_ok=True)


SHARED_HOST = """
import json, sys
sys.path.insert(0, sys.argv[1])
from verl_agentic.verl_plugin.weight_sync import remove_orphaned_buckets
from verl_agentic.shm import remove_orphans
print(json.dumps([remove_orphaned_buckets(), remove_orphans("psm_", sys.argv[2])]))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as a second user (setpriv)")
def test_on_a_shared_host_another_users_segments_and_ones_it_may_not_remove_stay():
    """Run as another user (nobody, through setpriv): root's orphaned weight bucket in /dev/shm is not
    nobody's to remove (the sticky /dev/shm refuses it: the PermissionError that aborted the CPU launch
    script under ``set -e``), and nobody's own orphan in a folder nobody cannot write stays too; both
    without an error."""
    tag = uuid.uuid4().hex[:8]
    roots = _leave(f"verl_weights_{tag}")
    top = Path(tempfile.mkdtemp(prefix="va-shm-"))  # pytest's tmp_path is root's alone (0700)
    os.chmod(top, 0o755)
    locked = top / "locked"
    locked.mkdir()
    stuck = locked / f"psm_{tag}"
    stuck.write_bytes(b"x")
    os.chown(stuck, NOBODY, NOBODY)
    os.chmod(locked, 0o555)
    try:
        out = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable,
                              "-c", SHARED_HOST, str(REPO), str(locked)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.strip().splitlines()[-1] == "[[], []]"
        assert (SHM / roots).exists() and stuck.exists()
    finally:
        (SHM / roots).unlink(missing_ok=True)
        os.chmod(locked, 0o755)
        shutil.rmtree(top)
