"""Run untrusted Python in a contained subprocess, and the ``python`` tool built on it.

Engine::

    from verl_agentic.tools.python_sandbox import SandboxLimits, run_python, run_python_sync

    res = await run_python("print(sum(range(10)))")              # -> SandboxResult
    res.stdout, res.exit_code, res.error_type                      # '45\\n', 0, None
    res = run_python_sync("while True: pass", limits=SandboxLimits(wall_timeout_s=2))
    res.timed_out, res.error_type                                  # True, 'timeout'

Every call starts a fresh interpreter (``sys.executable -E -s -B -u -X utf8 -c CODE``; ``-E``
ignores ``PYTHON*`` variables, ``-s`` the user site; the working directory is importable, so a
``helper.py`` written by one call can be imported by the next) with a minimal environment
(``PATH``, ``HOME``/``TMPDIR`` = the work dir, ``LANG=C.UTF-8``, BLAS/OpenMP pools of one
thread), in a fresh temporary work dir (deleted afterwards; pass ``workdir=`` to keep state
between calls), and with no file descriptors of the caller (``close_fds``).

What is contained, and how (checked by ``tests/test_python_sandbox.py`` on Linux as root):

* Wall time: ``wall_timeout_s``; on expiry the whole process group (the child gets its own
  session) and, when the cgroup below is in use, every process in its cgroup gets SIGKILL.
  Background processes never outlive a call: the same kill runs after a normal exit.
* CPU time: ``RLIMIT_CPU`` (SIGXCPU at ``cpu_time_s``, per process).
* Memory: ``RLIMIT_AS`` = ``memory_mb`` of address space per process (an allocation past it
  raises ``MemoryError``). It is per process, not per sandbox: with ``max_processes`` children
  the worst case is their product. Libraries reserving large address ranges (``import torch``)
  need a larger limit or ``memory_mb=None``.
* Files: ``RLIMIT_FSIZE`` = ``file_size_mb`` per written file (a longer write fails with
  ``OSError: [Errno 27] File too large``); no core dumps (``RLIMIT_CORE=0``).
* Processes: ``max_processes`` bounds the tasks (processes *and* threads) of one call.
  ``RLIMIT_NPROC`` counts every process of the *user*, and the kernel never applies it to uid 0
  (root is exempt whatever its capabilities), so as root the limit is a ``pids`` cgroup per
  call (``pids.max``; cgroup v1 or v2 where this process may create child cgroups), which also
  lets every process of the call be found and killed, even ones that left the process group
  with ``setsid``. Not root: ``RLIMIT_NPROC`` = (tasks this user already runs) + ``max_processes``,
  a best effort since the count is shared with the user's other processes. Root without a
  usable cgroup: no process limit (only the wall timeout and the group kill). The result says
  which one applied: ``process_limit`` = ``"cgroup"`` | ``"rlimit"`` | ``"none"``.
* Output: stdout and stderr are read as they come, each capped at ``max_output_bytes``; past the
  cap the process group is killed at once, the output is cut and ``truncated`` is set.
* Network: with ``network=False`` the child gets a new, empty network namespace
  (``unshare(CLONE_NEWNET)``, through ctypes on Python 3.11) with only its own loopback up: no
  route to any outside address, and ``127.0.0.1`` is the sandbox's own, not the host's. This
  needs CAP_SYS_ADMIN (root); where it is refused the call still runs, with network access,
  and ``network_isolated=False`` in the result.
* Privileges (as root): before ``exec`` the child drops every capability (bounding, ambient,
  effective, permitted, inheritable sets) and sets ``no_new_privs``, so it can neither lift its
  limits (hard limits are set too), leave its network namespace (``setns``), mount, load
  modules, ptrace the caller (which holds capabilities it lacks), nor regain privileges through
  setuid binaries.
* The caller dying: the child gets SIGKILL (``PR_SET_PDEATHSIG``); processes it started stay in
  their cgroup and are killed by the next process that uses the sandbox (stale cgroups of dead
  owners are swept on first use).

What is NOT isolated (be aware when running model-written code):

* The filesystem. The code runs as the calling user (root here: the interpreter lives under
  ``/root``, mode 0700, so dropping to an unprivileged uid would leave it unable to start
  Python). Without capabilities, uid 0 still owns root-owned files: it can read and write
  anything the owner bits allow, anywhere, including outside the work dir (only the per-file
  size limit applies). There is no mount namespace and no chroot.
* Processes. No PID namespace: the code sees the host's processes in ``/proc`` and, being the
  same uid, may signal them (including the caller). It could also move itself out of its
  cgroup by writing to the cgroup filesystem, which is mounted read-write.
* Local IPC. Unix-domain sockets bound to a filesystem path (a local daemon's socket) are still
  reachable: a network namespace does not cover them (abstract ones it does). ``/tmp`` and
  ``/dev/shm`` are the host's.
* Machine resources beyond the above: no cgroup memory or CPU share limit (the rlimits are per
  process), no I/O limit, no limit on disk space used by many small files.

How a child starts: ``subprocess.Popen`` with ``preexec_fn`` (fork; join the cgroup, new network
namespace, rlimits, drop capabilities; exec), called on one long-lived spawner thread, so the
event loop is never blocked by a fork or by cgroup file operations (see ``_spawner`` for why
one). CPython documents that ``preexec_fn`` is not safe in the presence of threads in general;
the function here only makes system calls through objects prepared beforehand (no imports, no
locks, no logging), the safe subset. Exit is watched through a pidfd, so a background process
holding the output pipes cannot hang the call.

Cost per call (``bench/sandbox_latency.py``, 2-core VM, over a plain ``subprocess.run`` of the
same interpreter, ~38 ms): ~6 ms for the mechanics (fork instead of vfork, temporary dir,
thread hand-offs, capability drop), ~5 ms for the network namespace, and, as root with cgroup
v1, ~13 ms for joining the pids cgroup when no other child joined one in the last few ms (the
kernel waits for an RCU grace period). ``network=True`` / ``max_processes=None`` trade the
isolation for that time.

The ``python`` tool (``PythonTool``, registered as ``python``) gives each episode its own work
dir, kept across the episode's calls (files written by one call are visible to the next) and
removed by ``release``. Config keys: the ``SandboxLimits`` fields (``wall_timeout_s``,
``memory_mb``, ...), ``max_output_chars`` (what the model sees, head and tail kept, default
4000), ``max_concurrency`` (sandboxes at once per tool, default 2 x CPUs), ``python_executable``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import dataclasses
import fcntl
import itertools
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.registry import register_tool_class

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_python_sync", "sandbox_support", "PythonTool",
           "format_sandbox_output"]

# --- Linux constants -----------------------------------------------------------------------------
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40

# code longer than this (or with NUL bytes) goes through a file instead of ``-c`` (argv entries
# are capped at 128 KiB by the kernel)
_MAX_ARGV_CODE = 100_000
_KILL_WAIT_S = 3.0  # how long to wait for killed processes to disappear / pipes to close


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _load_libc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()
_IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _cap_last() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 40


# --- limits and result -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. ``None`` switches a limit off (not ``wall_timeout_s``)."""

    wall_timeout_s: float = 10.0  # wall clock; the whole group is SIGKILLed past it
    cpu_time_s: Optional[int] = 10  # RLIMIT_CPU per process
    memory_mb: Optional[int] = 512  # RLIMIT_AS (address space) per process
    file_size_mb: Optional[int] = 16  # RLIMIT_FSIZE: largest file a process may write
    max_processes: Optional[int] = 64  # tasks (processes + threads): pids cgroup as root, else RLIMIT_NPROC
    max_output_bytes: int = 64_000  # per stream (stdout, stderr); past it: cut and killed
    network: bool = False  # False: private network namespace (no outside network) where possible

    def __post_init__(self):
        if not self.wall_timeout_s or self.wall_timeout_s <= 0:
            raise ConfigError(f"SandboxLimits.wall_timeout_s must be > 0, got {self.wall_timeout_s!r}")
        for name in ("cpu_time_s", "memory_mb", "file_size_mb", "max_processes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or v <= 0):
                raise ConfigError(f"SandboxLimits.{name} must be a positive number or None, got {v!r}")
        if self.max_output_bytes <= 0:
            raise ConfigError(f"SandboxLimits.max_output_bytes must be > 0, got {self.max_output_bytes!r}")

    @classmethod
    def from_dict(cls, d: dict) -> "SandboxLimits":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ConfigError(f"unknown sandbox limits {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)


@dataclass
class SandboxResult:
    """What a sandboxed run did.

    ``exit_code``: the process's exit status, negative for a signal (as ``subprocess``), None when
    it did not start. ``error_type``: None (exit 0) | ``timeout`` (wall) | ``output_limit`` |
    ``memory`` (MemoryError) | ``cpu_time`` (SIGXCPU) | ``file_size`` (a write past the file-size
    limit) | ``killed`` (another signal) | ``runtime_error`` (another non-zero exit) |
    ``sandbox_error`` (could not start it; the reason is in ``stderr``).
    """

    stdout: str
    stderr: str
    exit_code: Optional[int]
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    killed_by: Optional[str] = None  # signal name that ended the process, e.g. "SIGKILL"
    error_type: Optional[str] = None
    network_isolated: bool = False
    process_limit: str = "none"  # cgroup | rlimit | none
    pid: Optional[int] = None  # the child's pid (= its process group and session id)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error_type is None


# --- what this machine supports ------------------------------------------------------------------
class _PidsCgroups:
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
        if not _IS_ROOT:
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


_support_lock = threading.Lock()
_support: Optional[dict] = None
_cgroups: Optional[_PidsCgroups] = None


def _probe_netns() -> tuple[bool, str]:
    """Whether a child can get its own network namespace (tried once, in a real child)."""
    if _LIBC is None:
        return False, "not Linux / no libc"

    def pre():
        if _LIBC.unshare(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        _loopback_up()

    argv = ["/bin/true"] if os.path.exists("/bin/true") else [sys.executable, "-S", "-c", ""]
    try:
        subprocess.run(argv, preexec_fn=pre, check=True, timeout=30)
        return True, ""
    except Exception as e:  # SubprocessError("Exception occurred in preexec_fn.") or OSError
        return False, f"{type(e).__name__}: {e}"


def sandbox_support() -> dict:
    """What isolation this machine gives (probed once per process)::

        {"network_namespace": bool, "network_reason": str, "pids_cgroup": bool,
         "cgroup_reason": str, "cgroup_base": str, "root": bool, "drop_capabilities": bool}
    """
    global _support, _cgroups
    with _support_lock:
        if _support is None:
            netns, why = _probe_netns()
            _cgroups = _PidsCgroups()
            _support = {"network_namespace": netns, "network_reason": why,
                        "pids_cgroup": _cgroups.base is not None, "cgroup_reason": _cgroups.reason,
                        "cgroup_base": str(_cgroups.base or ""),
                        "root": _IS_ROOT, "drop_capabilities": _IS_ROOT and _LIBC is not None}
        return dict(_support)


# --- the child side (runs between fork and exec: system calls only) ---------------------------
def _loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING))
    finally:
        s.close()


def _make_preexec(cgroup_procs: Optional[str], netns: bool, rlimits: list, drop_caps: bool):
    libc = _LIBC
    cap_last = _cap_last() if drop_caps else 0
    cap_header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    cap_data = (_CapData * 2)()  # all zero: no capability in any set

    def preexec() -> None:
        if cgroup_procs is not None:  # first: nothing may fork before it is in its cgroup
            fd = os.open(cgroup_procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # die with the caller
        if netns:
            if libc.unshare(_CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
            _loopback_up()
        for res, value in rlimits:
            resource.setrlimit(res, value)
        if drop_caps:
            for cap in range(cap_last + 1):
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
            libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.capset(ctypes.byref(cap_header), cap_data) != 0:
                raise OSError(ctypes.get_errno(), "capset (dropping capabilities) failed")

    return preexec


# --- helpers of the parent side ----------------------------------------------------------------
def _proc_files(name: str):
    """``(pid, text)`` of ``/proc/<pid>/<name>`` for every process still there."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                yield int(d), Path(f"/proc/{d}/{name}").read_text()
            except OSError:
                continue


def _user_task_count(uid: int) -> int:
    """Tasks (threads) of ``uid``, what RLIMIT_NPROC compares against."""
    n = 0
    for _, text in _proc_files("status"):
        uid_line = threads = None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                uid_line = line.split()[1]
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
        if uid_line == str(uid):
            n += threads or 1
    return n


def _live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes whose process group is ``pgid`` (from /proc)."""
    out = []
    for pid, stat in _proc_files("stat"):
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            out.append(pid)
    return out


def _rlimits(limits: SandboxLimits, process_limit: str) -> list:
    out = [(resource.RLIMIT_CORE, (0, 0))]
    if limits.cpu_time_s is not None:
        c = int(max(1, round(limits.cpu_time_s)))
        out.append((resource.RLIMIT_CPU, (c, c + 1)))  # SIGXCPU at c, SIGKILL at c + 1
    if limits.memory_mb is not None:
        b = int(limits.memory_mb * 2**20)
        out.append((resource.RLIMIT_AS, (b, b)))
    if limits.file_size_mb is not None:
        b = int(limits.file_size_mb * 2**20)
        out.append((resource.RLIMIT_FSIZE, (b, b)))
    if process_limit == "rlimit":
        n = _user_task_count(os.getuid()) + int(limits.max_processes)
        out.append((resource.RLIMIT_NPROC, (n, n)))
    # never raise a limit the caller already has (a non-root child could not anyway)
    final = []
    for res, (soft, hard) in out:
        cur_soft, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        final.append((res, (soft, hard)))
    return final


def _write_files(workdir: Path, files: dict) -> None:
    root = workdir.resolve()
    for name, content in files.items():
        target = (root / name).resolve()
        if root not in target.parents:
            raise ValueError(f"files: {name!r} is not a relative path inside the work dir")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")


def _classify(exit_code: Optional[int], timed_out: bool, flooded: bool, stderr: str) -> tuple:
    killed_by = None
    if exit_code is not None and exit_code < 0:
        try:
            killed_by = signal.Signals(-exit_code).name
        except ValueError:
            killed_by = f"signal {-exit_code}"
    if timed_out:
        return killed_by, "timeout"
    if flooded:
        return killed_by, "output_limit"
    if exit_code == 0:
        return killed_by, None
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""  # the exception line of a traceback
    if killed_by == "SIGXCPU":
        return killed_by, "cpu_time"
    if killed_by == "SIGXFSZ" or "File too large" in last:
        return killed_by, "file_size"
    if last.startswith("MemoryError") or "Cannot allocate memory" in last or "cannot allocate memory" in last:
        return killed_by, "memory"
    if killed_by is not None:
        return killed_by, "killed"
    return killed_by, "runtime_error"


async def _pump(stream: asyncio.StreamReader, buf: bytearray, cap: int, on_flood) -> None:
    """Read ``stream`` to EOF into ``buf`` up to ``cap`` bytes; past it call ``on_flood`` and discard."""
    flooded = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        if flooded:
            continue
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            flooded = True
            on_flood()
        else:
            buf += chunk


def _kill_group(pgid: Optional[int]) -> bool:
    if pgid is None or pgid <= 1:  # never killpg(0 / 1 / -1): that is not a sandbox's group
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


# --- the engine ------------------------------------------------------------------------------------
async def run_python(code: str, *, stdin: str = "", limits: Optional[SandboxLimits] = None,
                     files: Optional[dict] = None, workdir: Union[str, Path, None] = None,
                     python_executable: Optional[str] = None, env: Optional[dict] = None) -> SandboxResult:
    """Run ``code`` in a fresh contained interpreter; see the module docstring for what is contained.

    Args:
        code: Python source, run as ``__main__`` (``-c``; long code through a temporary file).
        stdin: text fed to the program's stdin (EOF after it).
        limits: a ``SandboxLimits`` (defaults: 10 s wall, 10 s CPU, 512 MB, 16 MB files, 64 tasks,
            64 kB output per stream, no network).
        files: ``{relative path: text or bytes}`` written into the work dir first.
        workdir: run in this directory and keep it (state across calls); default: a fresh
            temporary directory, deleted afterwards.
        python_executable: the interpreter (default: ``sys.executable``).
        env: extra environment variables for the child.

    Never raises for a failure of the code itself; a sandbox that cannot start gives
    ``error_type="sandbox_error"``. Cancelling the call kills the child's processes. The
    fork/exec runs on a spawner thread, so the event loop is not blocked while a child starts.
    """
    limits = limits or SandboxLimits()
    support = sandbox_support()
    loop = asyncio.get_running_loop()

    own_dir = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="va_sandbox_")) if own_dir else Path(workdir)
    private_dir: Optional[str] = None  # the script (long code) and the stdin file
    cg: Optional[Path] = None
    proc: Optional[subprocess.Popen] = None
    exit_fd: Optional[int] = None
    stdin_file = None
    transports: list = []
    readers: list = []
    state = {"flooded": False}
    try:
        wd.mkdir(parents=True, exist_ok=True)
        if files:
            _write_files(wd, files)
        python = python_executable or sys.executable
        argv = [python, "-E", "-s", "-B", "-u", "-X", "utf8"]
        if len(code) <= _MAX_ARGV_CODE and "\x00" not in code:
            argv += ["-c", code]
        else:
            private_dir = tempfile.mkdtemp(prefix="va_sandbox_private_")
            script = Path(private_dir) / "main.py"
            script.write_bytes(code.encode("utf-8", "surrogateescape"))
            argv.append(str(script))
        if stdin:  # from a file: any size, and never a blocked writer
            stdin_file = tempfile.TemporaryFile(dir=private_dir)
            stdin_file.write(stdin.encode("utf-8"))
            stdin_file.seek(0)

        netns = not limits.network and support["network_namespace"]
        want_cgroup = limits.max_processes is not None and support["pids_cgroup"]
        process_limit = "none"
        if limits.max_processes is not None and not want_cgroup and not _IS_ROOT and hasattr(resource, "RLIMIT_NPROC"):
            process_limit = "rlimit"
        child_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(wd), "TMPDIR": str(wd),
                     "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1",
                     "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        child_env.update(env or {})
        popen_kwargs = dict(stdin=stdin_file if stdin_file is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(wd), env=child_env,
                            start_new_session=True, close_fds=True)

        t0 = time.perf_counter()
        # cgroupfs operations can wait on a kernel-wide cgroup lock held while another child
        # joins its cgroup (an RCU grace period): they run on the spawner thread, never on the loop
        spawn = _spawner().submit(_spawn, argv, popen_kwargs, limits, process_limit, want_cgroup, netns,
                                  support["drop_capabilities"])
        try:
            proc, cg, process_limit = await asyncio.wrap_future(spawn)
        except asyncio.CancelledError:
            if not spawn.cancel():  # starting right now: clean up once started, without waiting here
                spawn.add_done_callback(_cleanup_spawned)
            raise
        except Exception as e:  # noqa: BLE001 - reported, not raised: the caller's code did nothing wrong
            return SandboxResult("", f"sandbox could not start: {type(e).__name__}: {e}", None,
                                 duration_s=time.perf_counter() - t0, error_type="sandbox_error",
                                 network_isolated=netns, process_limit=process_limit)
        pgid = proc.pid
        exit_fd = _pidfd(proc.pid)  # we own the child: nobody else reaps it, the pid cannot be reused

        def on_flood() -> None:
            state["flooded"] = True
            _kill_group(pgid)

        out_buf, err_buf = bytearray(), bytearray()
        for pipe, buf in ((proc.stdout, out_buf), (proc.stderr, err_buf)):
            reader = asyncio.StreamReader(limit=2**20)
            transport, _ = await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), pipe)
            transports.append(transport)
            readers.append(loop.create_task(_pump(reader, buf, limits.max_output_bytes, on_flood)))

        timed_out = False
        if not await _wait_exit(proc, exit_fd, limits.wall_timeout_s):
            timed_out = not state["flooded"]
            _kill_group(pgid)
            await _wait_exit(proc, exit_fd, _KILL_WAIT_S)
        duration = time.perf_counter() - t0
        # nothing outlives the call: kill what is left of the group and the cgroup, wait until it
        # is gone, remove the cgroup (a background process would otherwise keep the pipes open)
        if await asyncio.wrap_future(_reaper().submit(_reap, proc, cg)):
            cg = None  # removed
        done, pending = await asyncio.wait(readers, timeout=_KILL_WAIT_S)
        for t in pending:  # only if a process escaped both the group and the cgroup
            t.cancel()
        exit_code = proc.poll()
        stdout = out_buf.decode("utf-8", "replace")
        stderr = err_buf.decode("utf-8", "replace")
        killed_by, error_type = _classify(exit_code, timed_out, state["flooded"], stderr)
        return SandboxResult(stdout, stderr, exit_code, timed_out=timed_out, truncated=state["flooded"],
                             duration_s=duration, killed_by=killed_by, error_type=error_type,
                             network_isolated=netns, process_limit=process_limit, pid=pgid)
    finally:
        # also on cancellation: no process, cgroup, pipe or temporary directory is left behind
        if proc is not None and proc.returncode is None:  # not reaped: its pid still holds the group id
            _kill_group(proc.pid)
            _background_cleanup(proc, cg)
        elif cg is not None:
            _background_cleanup(None, cg)
        for t in readers:
            if not t.done():
                t.cancel()
        for tr in transports:
            tr.close()  # removes the fd from the loop now, closes the pipe a moment later
        if proc is not None:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        if exit_fd is not None:
            os.close(exit_fd)
        if stdin_file is not None:
            stdin_file.close()
        if own_dir:
            shutil.rmtree(wd, ignore_errors=True)
        if private_dir is not None:
            shutil.rmtree(private_dir, ignore_errors=True)


_pools: dict = {}


def _pool(name: str, workers: int) -> concurrent.futures.ThreadPoolExecutor:
    with _support_lock:
        if name not in _pools:
            _pools[name] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=f"sandbox-{name}")
        return _pools[name]


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    """The one long-lived thread that forks the children.

    One, because joining a cgroup (v1) holds a kernel-wide lock that every fork waits for, and
    ``fork`` with a ``preexec_fn`` runs holding the GIL: a second spawner forking while the first
    one's child joins its cgroup would stall every thread of this process, event loop included,
    for an RCU grace period. Long-lived, because PR_SET_PDEATHSIG fires when the forking
    *thread* exits.
    """
    return _pool("spawn", 1)


def _reaper() -> concurrent.futures.ThreadPoolExecutor:
    return _pool("reap", 2)


def _spawn(argv: list, popen_kwargs: dict, limits: SandboxLimits, process_limit: str, want_cgroup: bool,
           netns: bool, drop_caps: bool) -> tuple:
    """(On a spawner thread.) Make the run's cgroup, start the child in it: (Popen, cgroup, process_limit)."""
    cg = _cgroups.create(limits.max_processes) if want_cgroup else None
    if cg is not None:
        process_limit = "cgroup"
    preexec = _make_preexec(str(cg / "cgroup.procs") if cg is not None else None, netns,
                            _rlimits(limits, process_limit), drop_caps)
    try:
        return subprocess.Popen(argv, preexec_fn=preexec, **popen_kwargs), cg, process_limit
    except BaseException:
        if cg is not None:
            _cgroups.remove(cg)
        raise


def _reap(proc: Optional[subprocess.Popen], cg: Optional[Path], timeout: float = _KILL_WAIT_S) -> bool:
    """(Blocking.) SIGKILL what is left of the child's process group and cgroup until none is
    alive, reap the child, remove ``cg``. True when all is gone in ``timeout``."""
    deadline = time.monotonic() + timeout
    pgid = proc.pid if proc is not None else None
    _kill_group(pgid)  # first: the exited child is a zombie still, so its pid (= group id) is held
    if proc is not None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
    while True:
        in_cgroup = _cgroups.kill_all(cg) if cg is not None else 0
        # after the reap the group id is free unless members remain: usually ESRCH at once
        in_group = _kill_group(pgid) and bool(_live_group_members(pgid))
        if not in_cgroup and not in_group and (cg is None or _cgroups.remove(cg)):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


def _cleanup_spawned(fut: concurrent.futures.Future) -> None:
    """Done-callback of a spawn whose caller was cancelled meanwhile: kill and clean up."""
    if fut.cancelled() or fut.exception() is not None:
        return
    proc, cg, _ = fut.result()
    _kill_group(proc.pid)
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    _background_cleanup(proc, cg)


def _background_cleanup(proc: Optional[subprocess.Popen], cg: Optional[Path]) -> None:
    """Finish killing, reaping and removing in a daemon thread (the cancelled path)."""
    threading.Thread(target=_reap, args=(proc, cg, 30.0), name="sandbox-cleanup", daemon=True).start()


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (Python < 3.9, kernel < 5.3, not Linux)
        return None


async def _wait_exit(proc: subprocess.Popen, pidfd: Optional[int], timeout: float) -> bool:
    """Wait until ``proc`` has exited (not for its pipes to close); False on timeout."""
    if proc.poll() is not None:
        return True
    if pidfd is None:  # poll
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.add_reader(pidfd, lambda: fut.done() or fut.set_result(None))
    try:
        await asyncio.wait_for(fut, timeout)
        return True  # exited, not reaped yet: its pid (= the group id) cannot be reused meanwhile
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(pidfd)


def run_python_sync(code: str, **kwargs: Any) -> SandboxResult:
    """``run_python`` for synchronous callers (in a worker thread when a loop already runs here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_python(code, **kwargs))
    box: dict = {}

    def target():
        try:
            box["r"] = asyncio.run(run_python(code, **kwargs))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["e"] = e

    th = threading.Thread(target=target, name="run_python_sync")
    th.start()
    th.join()
    if "e" in box:
        raise box["e"]
    return box["r"]


# --- the tool --------------------------------------------------------------------------------------
def _clip(text: str, max_chars: int, keep: str = "both") -> str:
    if len(text) <= max_chars:
        return text
    cut = len(text) - max_chars
    if keep == "tail":
        return f"[... {cut} characters omitted ...]\n" + text[-max_chars:]
    head = max_chars * 2 // 3
    return text[:head] + f"\n[... {cut} characters omitted ...]\n" + text[len(text) - (max_chars - head):]


def format_sandbox_output(res: SandboxResult, limits: SandboxLimits, max_chars: int = 4000) -> str:
    """A concise message for the model: stdout, stderr (tail kept), and a status line if not ok."""
    parts = []
    err = res.stderr.strip("\n")
    err_part = _clip(err, max_chars // 2, keep="tail") if err else ""
    out = res.stdout.rstrip("\n")
    if out:
        parts.append(_clip(out, max(200, max_chars - len(err_part))))
    if err_part:
        parts.append("[stderr]\n" + err_part)
    if res.error_type == "timeout":
        parts.append(f"[timed out after {limits.wall_timeout_s:g} s: the program was killed]")
    elif res.error_type == "output_limit":
        parts.append(f"[output exceeded {limits.max_output_bytes} bytes: truncated, the program was killed]")
    elif res.error_type == "sandbox_error":
        parts.append("[the sandbox failed to start the program]")
    elif res.error_type == "cpu_time":
        parts.append(f"[CPU time limit of {limits.cpu_time_s} s exceeded: the program was killed]")
    elif res.killed_by:
        parts.append(f"[killed by {res.killed_by}]")
    elif res.exit_code not in (0, None):
        parts.append(f"[exit code {res.exit_code}]")
    return "\n".join(parts) if parts else "(no output)"


_TOOL_KEYS = {"max_output_chars", "max_concurrency", "python_executable", "type"}


@dataclass
class _Episode:
    workdir: Path
    lock: asyncio.Lock


@register_tool_class("python")
class PythonTool(BaseTool):
    """Runs Python code in the sandbox; one work dir per episode, kept across its calls.

    Config (all optional): ``SandboxLimits`` fields (``wall_timeout_s``, ``cpu_time_s``,
    ``memory_mb``, ``file_size_mb``, ``max_processes``, ``max_output_bytes``, ``network``),
    ``max_output_chars`` (default 4000), ``max_concurrency`` (default 2 x CPUs),
    ``python_executable``. ``create(files={...})`` seeds the episode's work dir.
    """

    DEFAULT_SCHEMA = {"type": "function", "function": {
        "name": "python",
        "description": ("Run Python 3 code and return what it prints (stdout, then stderr). Each call is a "
                        "fresh process: variables do not persist, but files written in the current directory "
                        "do. Print the values you need. No network access; time and memory are limited."),
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"]}}}

    def __init__(self, config: Optional[dict] = None, tool_schema: Optional[dict] = None):
        super().__init__(config, tool_schema)
        limit_names = {f.name for f in dataclasses.fields(SandboxLimits)}
        unknown = set(self.config) - limit_names - _TOOL_KEYS
        if unknown:
            raise ConfigError(f"python tool: unknown config keys {sorted(unknown)}; known: "
                              f"{sorted(limit_names | _TOOL_KEYS - {'type'})}")
        self.limits = SandboxLimits.from_dict({k: v for k, v in self.config.items() if k in limit_names})
        self.max_output_chars = int(self.config.get("max_output_chars", 4000))
        self.max_concurrency = int(self.config.get("max_concurrency") or 2 * (os.cpu_count() or 2))
        self.python_executable = self.config.get("python_executable")
        self._episodes: dict[str, _Episode] = {}
        self._semaphores: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = \
            weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def workdir(self, instance_id: str) -> Path:
        """The episode's work dir (for inspection and tests)."""
        return self._episode(instance_id).workdir

    def _episode(self, instance_id: str) -> _Episode:
        try:
            return self._episodes[instance_id]
        except KeyError:
            raise KeyError(f"python tool: unknown instance_id {instance_id!r}: call create() first "
                           f"(or it was released)") from None

    async def create(self, instance_id: Optional[str] = None, files: Optional[dict] = None, **kwargs: Any) -> str:
        instance_id = await super().create(instance_id, **kwargs)
        wd = Path(tempfile.mkdtemp(prefix="va_python_tool_"))
        if files:
            _write_files(wd, files)
        self._episodes[instance_id] = _Episode(wd, asyncio.Lock())
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs: Any) -> ToolResult:
        ep = self._episode(instance_id)
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str):
            return ToolResult("Error: python() needs a 'code' argument: a string of Python source.", status="error")
        async with ep.lock, self._semaphore():  # one call at a time per episode (shared dir)
            res = await run_python(code, limits=self.limits, workdir=ep.workdir,
                                   python_executable=self.python_executable)
        status = "timeout" if res.timed_out else ("ok" if res.ok else "error")
        metrics = {"duration_s": res.duration_s, "exit_code": res.exit_code, "truncated": res.truncated,
                   "timed_out": res.timed_out, "error_type": res.error_type}
        return ToolResult(format_sandbox_output(res, self.limits, self.max_output_chars), 0.0, metrics, status)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        ep = self._episodes.pop(instance_id, None)
        if ep is not None:
            shutil.rmtree(ep.workdir, ignore_errors=True)
        await super().release(instance_id, **kwargs)
