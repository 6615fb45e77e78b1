"""Per-run ``pids`` cgroups: a process limit that also holds for root, and a list of every process
of a run (to kill them all, even ones that left the process group).

``RLIMIT_NPROC`` counts every process of the *user*, and the kernel never applies it to uid 0 (nor,
here, to a user namespace whose uid maps to 0), so as root the limit of a run is ``pids.max`` of a
cgroup made for it under ``<our cgroup>/verl_agentic_sandbox`` (cgroup v1 or v2, where this process
may create child cgroups). The sandbox never sees the cgroup filesystem (it is not mounted inside).
"""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path
from typing import Optional

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


class PidsCgroups:
    """Per-run ``pids`` cgroups under ``<our cgroup>/verl_agentic_sandbox`` (v1 or v2)."""

    def __init__(self):
        self.base: Optional[Path] = None
        self.reason = ""
        self._counter = itertools.count()
        try:
            self.base = self._setup()
        except OSError as e:
            self.reason = f"{type(e).__name__}: {e}"
        if self.base is not None:
            self._sweep_stale()

    @staticmethod
    def _setup() -> Optional[Path]:
        if not IS_ROOT:
            raise PermissionError("not root")
        own = {}  # controller -> our path in it ("" key: cgroup v2)
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                own[c] = path
        v1 = v2 = None
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fstype, _, opts = (post.split(" ") + ["", "", ""])[:3]
            mnt = pre.split(" ")[4]
            if fstype == "cgroup" and "pids" in opts.split(","):
                v1 = Path(mnt)
            elif fstype == "cgroup2":
                v2 = Path(mnt)
        if v1 is not None and "pids" in own:
            base = v1 / own["pids"].lstrip("/") / "verl_agentic_sandbox"
            base.mkdir(exist_ok=True)
            return base
        if v2 is not None and "" in own:
            parent = v2 / own[""].lstrip("/")
            if "pids" not in (parent / "cgroup.controllers").read_text().split():
                raise OSError("the pids controller is not available in our cgroup v2")
            base = parent / "verl_agentic_sandbox"
            base.mkdir(exist_ok=True)
            # v2 only lets a cgroup with no processes of its own delegate controllers
            (parent / "cgroup.subtree_control").write_text("+pids")
            (base / "cgroup.subtree_control").write_text("+pids")
            return base
        raise OSError("no pids cgroup hierarchy mounted")

    def _sweep_stale(self) -> None:
        """Remove run cgroups left by dead processes (killing what is still inside)."""
        for d in self.base.glob("run-*"):
            try:
                owner = int(d.name.split("-")[1])
            except (IndexError, ValueError):
                continue
            if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
                self.kill_all(d)
                self.remove(d)

    def create(self, max_tasks: int) -> Optional[Path]:
        if self.base is None:
            return None
        d = self.base / f"run-{os.getpid()}-{next(self._counter)}"
        try:
            d.mkdir()
            (d / "pids.max").write_text(str(int(max_tasks)))
        except OSError as e:
            self.reason = f"{type(e).__name__}: {e}"
            self.remove(d)
            return None
        return d

    @staticmethod
    def pids(d: Path) -> list[int]:
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self, d: Path) -> int:
        """SIGKILL everything in ``d`` once; returns how many were signalled."""
        pids = self.pids(d)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return len(pids)

    @staticmethod
    def remove(d: Path) -> bool:
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


