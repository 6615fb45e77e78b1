"""Shared-memory segments in /dev/shm that their processes left behind, found and removed safely.

Two kinds appear around verl's vLLM rollout:

- ``verl_weights_*``: verl's weight-sync buckets (``BucketedWeightSender``), unlinked by the sender's
  cleanup; a sender killed first (SIGKILL, out of memory) leaves its bucket behind;
- ``psm_*``: Python ``SharedMemory`` segments, e.g. vLLM's engine message queues, which vLLM never
  unlinks itself when Ray kills the engine (160-250 MB each).

:func:`orphans` lists the segments of a prefix that are this user's and that no live process holds (maps or
has open): a segment in use is held by the process using it. The /proc scan reads every process it may
read; another user's processes are not readable, but they cannot open this user's segments either
(``SharedMemory`` creates them with mode 0600), so nothing they use is taken for an orphan.
:func:`remove_orphans` removes them and never fails on a shared host: another user's segment is not
touched, and one this user may not remove (a directory it cannot write) is left where it is, logged.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, Optional

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
WEIGHT_BUCKETS = "verl_weights_"  # verl's weight-sync buckets
PYTHON_SEGMENTS = "psm_"  # multiprocessing.shared_memory's names (vLLM's message queues)


def own_segments(prefix: str, shm_dir: str = SHM_DIR) -> set[str]:
    """Names of the segments in ``shm_dir`` that start with ``prefix`` and belong to this user."""
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:  # no such folder, or not ours to read: nothing of ours to find there
        return set()
    uid = os.getuid()
    out = set()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid == uid:
                out.add(entry.name)
        except FileNotFoundError:  # removed meanwhile
            continue
    return out


def held(names: Iterable[str], shm_dir: str = SHM_DIR) -> set[str]:
    """The ``names`` (in ``shm_dir``) that a live process maps or has open, as far as /proc shows."""
    names = set(names)
    if not names:
        return set()
    folder = os.path.realpath(shm_dir)
    paths = {os.path.join(folder, n): n for n in names}
    found: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.rstrip("\n").split(maxsplit=5)[5:]  # the mapped file, if any
                    if path:
                        name = paths.get(path[0].removesuffix(" (deleted)"))
                        if name is not None:
                            found.add(name)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                name = paths.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
                if name is not None:
                    found.add(name)
        except OSError:  # the process ended meanwhile, or is another user's (see the module docstring)
            continue
    return found


def orphans(prefix: str, shm_dir: str = SHM_DIR, among: Optional[Iterable[str]] = None) -> list[str]:
    """This user's segments starting with ``prefix`` (only those in ``among``, when given) that no live
    process holds, as paths, sorted."""
    names = own_segments(prefix, shm_dir)
    if among is not None:
        names &= set(among)
    return sorted(os.path.join(shm_dir, n) for n in names - held(names, shm_dir))


def remove_orphans(prefix: str, shm_dir: str = SHM_DIR, among: Optional[Iterable[str]] = None) -> list[str]:
    """Remove :func:`orphans`; returns the paths removed. Never raises for a segment it may not remove:
    that one stays, with a log line (a shared host's /dev/shm is not ours to clear)."""
    removed = []
    for path in orphans(prefix, shm_dir, among):
        try:
            os.unlink(path)
        except FileNotFoundError:  # its owner removed it meanwhile
            continue
        except PermissionError as e:
            logger.info("left %s in place: not ours to remove (%s)", path, e.strerror)
            continue
        removed.append(path)
    return removed


def remove_left_by_killed_runs(shm_dir: str = SHM_DIR) -> list[str]:
    """What a killed verl run on this CPU leaves: weight buckets and Python segments (vLLM's) that are
    this user's and that nothing holds. Returns the paths removed."""
    return [*remove_orphans(WEIGHT_BUCKETS, shm_dir), *remove_orphans(PYTHON_SEGMENTS, shm_dir)]


def main() -> int:
    for path in remove_left_by_killed_runs():
        print(f"removed {path} (shared memory left by a killed run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["held", "orphans", "own_segments", "remove_left_by_killed_runs", "remove_orphans"]
