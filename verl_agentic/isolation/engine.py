"""The engine: run untrusted Python in a fresh, contained interpreter (``run_python``).

See ``verl_agentic.isolation`` for what is and is not contained. How a run goes:

1. A work dir (a fresh temporary one, deleted afterwards, or the caller's ``workdir``, kept),
   a minimal environment (``PATH``, ``HOME``/``TMPDIR`` = the work dir, ``LANG=C.UTF-8``,
   BLAS/OpenMP pools of one thread: nothing of the caller's environment), and the argv
   ``python -E -s -B -u -X utf8 -c CODE`` (``-E`` ignores ``PYTHON*`` variables, ``-s`` the user
   site; the work dir is importable, so a ``helper.py`` written by one call can be imported by
   the next), prefixed, under ``isolation: bwrap``, by the bubblewrap command line of
   ``isolation.bwrap``.
2. ``subprocess.Popen`` with ``preexec_fn`` (``isolation.child``: pids cgroup, die with the
   caller, rlimits; for ``none`` also a network namespace and dropped capabilities), called on
   one long-lived spawner thread, so the event loop is never blocked by a fork or by cgroup
   file operations (see ``_spawner``), in a new session, with no file descriptors of the caller.
3. stdout and stderr are read as they come, each capped at ``max_output_bytes`` (past it the run
   is killed); exit is watched through a pidfd, so a background process holding the pipes
   cannot hang the call; at ``wall_timeout_s`` the run is killed.
4. Killing a run: SIGKILL to its process group (bwrap's, under bwrap) and to every process of
   its pids cgroup; under bwrap the processes inside also die with their PID namespace, whose
   init is bwrap's. The same kill runs after a normal exit: nothing outlives a call.

Under bwrap a signal that ends the code comes back as bwrap's exit status 128 + N; it is reported
as the signal (``exit_code = -N``), so a program that calls ``sys.exit(137)`` reads as SIGKILL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional, Union

import verl_agentic.isolation.bwrap as bwrap
from verl_agentic.isolation.cgroups import IS_ROOT, PidsCgroups
from verl_agentic.isolation.child import LIBC, make_preexec, probe_netns
from verl_agentic.isolation.limits import SandboxLimits, SandboxResult

logger = logging.getLogger(__name__)

# code longer than this (or with NUL bytes) goes through a file instead of ``-c`` (argv entries
# are capped at 128 KiB by the kernel)
_MAX_ARGV_CODE = 100_000
_KILL_WAIT_S = 3.0  # how long to wait for killed processes to disappear / pipes to close
NO_ISOLATION_WARNING = ("isolation: none: model-written code runs WITHOUT process isolation, as this process's "
                        "user, on this machine's filesystem: it can read, change and delete the run's files "
                        "(outputs, checkpoints, datasets), read secrets and kill processes. Use isolation: bwrap "
                        "(the default) for untrusted code.")


# --- what this machine supports ------------------------------------------------------------------
_support_lock = threading.Lock()
_support: Optional[dict] = None
_cgroups: Optional[PidsCgroups] = None


def sandbox_support() -> dict:
    """What isolation this machine gives (probed once per process; bwrap once per path)::

        {"bwrap": bool, "bwrap_path": str, "bwrap_reason": str, "network_namespace": bool,
         "network_reason": str, "pids_cgroup": bool, "cgroup_reason": str, "cgroup_base": str,
         "root": bool, "drop_capabilities": bool}
    """
    global _support, _cgroups
    with _support_lock:
        if _support is None:
            netns, why = probe_netns()
            _cgroups = PidsCgroups()
            _support = {"network_namespace": netns, "network_reason": why,
                        "pids_cgroup": _cgroups.base is not None, "cgroup_reason": _cgroups.reason,
                        "cgroup_base": str(_cgroups.base or ""),
                        "root": IS_ROOT, "drop_capabilities": IS_ROOT and LIBC is not None}
        out = dict(_support)
    path = bwrap.find_bwrap()
    ok, why = bwrap.probe(path)
    out.update(bwrap=ok, bwrap_path=path or "", bwrap_reason=why)
    return out


def check_isolation(limits: SandboxLimits, who: str) -> None:
    """At the start of a sandbox user (a tool, a service): ``IsolationUnavailable`` if bwrap is asked
    for and does not work here; a warning (every time) if the config turned isolation off."""
    if limits.isolation == "bwrap":
        bwrap.require_bwrap()
    else:
        logger.warning("%s: %s", who, NO_ISOLATION_WARNING)


_warned_none = False


def _warn_none_once() -> None:
    global _warned_none
    if not _warned_none:
        _warned_none = True
        logger.warning("run_python: %s", NO_ISOLATION_WARNING)


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


def write_files(workdir: Path, files: dict) -> None:
    """Write ``{relative path: text or bytes}`` below ``workdir``; ValueError for a path that escapes it."""
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
    """Run ``code`` in a fresh contained interpreter (see ``verl_agentic.isolation`` for what is contained).

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
    ``error_type="sandbox_error"``. Raises ``IsolationUnavailable`` (before anything runs) when
    ``limits.isolation`` is ``bwrap`` and bubblewrap does not work here. Cancelling the call kills the child's processes. The
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
            write_files(wd, files)
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

        isolated = limits.isolation == "bwrap"
        if isolated:  # the namespaces, the fresh root and dropping privileges are bwrap's
            readonly = [*bwrap.interpreter_paths(python), *limits.readonly_paths]
            if python_executable is None:
                readonly += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
            if private_dir is not None:
                readonly.append(private_dir)
            tmp_bytes = None if limits.tmp_mb is None else int(limits.tmp_mb * 2**20)
            argv = bwrap.bwrap_argv(bwrap.require_bwrap(), str(wd), readonly, network=limits.network,
                                    tmp_bytes=tmp_bytes) + argv
            netns, drop_caps, network_isolated = False, False, not limits.network
        else:
            _warn_none_once()
            netns = network_isolated = not limits.network and support["network_namespace"]
            drop_caps = support["drop_capabilities"]
        want_cgroup = limits.max_processes is not None and support["pids_cgroup"]
        process_limit = "none"
        if limits.max_processes is not None and not want_cgroup and not IS_ROOT and hasattr(resource, "RLIMIT_NPROC"):
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
                                  drop_caps)
        try:
            proc, cg, process_limit = await asyncio.wrap_future(spawn)
        except asyncio.CancelledError:
            if not spawn.cancel():  # starting right now: clean up once started, without waiting here
                spawn.add_done_callback(_cleanup_spawned)
            raise
        except Exception as e:  # noqa: BLE001 - reported, not raised: the caller's code did nothing wrong
            return SandboxResult("", f"sandbox could not start: {type(e).__name__}: {e}", None,
                                 duration_s=time.perf_counter() - t0, error_type="sandbox_error",
                                 network_isolated=network_isolated, process_limit=process_limit,
                                 isolation=limits.isolation)
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
        if isolated and exit_code is not None and 128 < exit_code <= 128 + 64:
            exit_code = 128 - exit_code  # bwrap's 128 + N for a signal N that ended the code
        stdout = out_buf.decode("utf-8", "replace")
        stderr = err_buf.decode("utf-8", "replace")
        killed_by, error_type = _classify(exit_code, timed_out, state["flooded"], stderr)
        return SandboxResult(stdout, stderr, exit_code, timed_out=timed_out, truncated=state["flooded"],
                             duration_s=duration, killed_by=killed_by, error_type=error_type,
                             network_isolated=network_isolated, process_limit=process_limit, pid=pgid,
                             isolation=limits.isolation)
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
    preexec = make_preexec(str(cg / "cgroup.procs") if cg is not None else None, netns,
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


