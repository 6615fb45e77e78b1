"""``prime``: scores in a pool of worker processes, with per-sample timeouts that hold.

How it survives bad scorers (each is tested):

- **Hang**: every worker publishes the task it is running, and since when, in shared memory.
  At ``timeout_s`` a SIGALRM interrupts the scorer inside its worker (Python loops, sleeps,
  waits): the sample gets ``timeout`` and the worker goes on. A scorer stuck where the signal
  cannot reach (C code holding the GIL) is killed ``max(1 s, timeout_s / 4)`` later with its
  whole process group, and replaced. Either way a hung scorer never holds a slot after that.
- **Stragglers**: a sample running for 20x the typical sample time (at least 100 ms; with
  ``straggler_s`` fixed), or for 10x / 10 ms when its worker is asleep rather than computing
  (``/proc/PID/stat``; how a hung scorer usually looks), makes its worker a straggler: the work
  queued behind it goes to other workers and a warm standby (or a new worker) takes its place,
  so one slow sample does not stall the batch while it waits for its timeout. Up to
  ``max(128, 16 x num_workers)`` stragglers get a replacement; a sleeping one costs a few MB and
  no CPU. A recovered straggler becomes a standby (up to ``max(64, 8 x num_workers)``).
- **CPUs**: ``num_workers`` CPU slots (default: all CPUs), with ``overcommit`` more processes kept
  busy (default: as many again), so a sample that hangs asleep does not idle a CPU before it is
  caught. CPU-bound work loses nothing to the extra processes.
- **Memory**: each worker runs under an address-space limit (``memory_limit_mb``); a scorer
  that allocates too much gets a ``MemoryError`` -> ``scorer_error``. A worker killed from
  outside (OOM killer, segfault) gives ``worker_died`` for the sample it was running.
- **Bad values**: NaN, strings, None -> ``invalid_score`` (the same code path as ``naive``).

Work is sent in chunks (results come back in chunks too) so the parent's per-sample cost is
small; at most 2 chunks per worker are in its pipe, and ``score_items`` keeps a bounded window
of submitted samples (counted by completions, in any order), so memory stays bounded for any
batch size and a hung sample holds one slot of the window, not the submission.

Workers are forked from a template process: a fresh interpreter (started with ``subprocess``,
so no inherited torch threads and no re-import of the caller's ``__main__`` script, with the
caller's ``sys.path``) that imports the scorers and what they preload once, then freezes its
heap for the GC; a replacement worker starts in milliseconds, warm. Each worker is its own
session / process group. Scorers must therefore be importable: list their modules in
``reward.scorer_modules`` (or expose them through the ``verl_agentic.scorers`` entry points).

``ScorerPool.submit`` / ``submit_many`` (Futures of ``RewardResult``s) are also used by the
reward server, which shares one pool between concurrent requests.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import mmap
import multiprocessing.connection as mpc
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from verl_agentic.reward.base import (
    RewardConfig,
    RewardItem,
    RewardManager,
    RewardResult,
    ScoreError,
    register_reward_manager,
)
from verl_agentic.reward.progress import progress_bar

_IDLE = -1.0
_FLUSH_S = 0.02  # a worker sends its finished results at least this often
_STARTUP_TIMEOUT_S = 120.0
_FIRST_TASK_GRACE_S = 1.0
_MIN_STRAGGLER_S = 0.1  # a sample running this long (at least) frees its queue for other workers...
_MIN_QUICK_S = 0.01  # ... or this long if its worker is asleep (waiting, not computing)
_MAX_FAILED_STARTS = 3


class _SharedState:
    """Three doubles in a shared memfd: the task a worker is running (-1: none), since when
    (monotonic), and the revocation epoch (the parent bumps it when it takes back the worker's
    queued chunks; the worker drops chunks sent under an older epoch)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._mm = mmap.mmap(fd, 24)

    @classmethod
    def create(cls) -> "_SharedState":
        fd = os.memfd_create("verl-agentic-scorer", 0)
        os.ftruncate(fd, 24)
        st = cls(fd)
        st.set(_IDLE, 0.0)
        st.set_epoch(0)
        return st

    def set(self, task_id: float, started: float) -> None:
        self._mm[:16] = struct.pack("dd", task_id, started)

    def get(self) -> tuple[float, float]:
        return struct.unpack("dd", self._mm[:16])

    def set_epoch(self, epoch: int) -> None:
        self._mm[16:24] = struct.pack("d", epoch)

    def epoch(self) -> int:
        return int(struct.unpack("d", self._mm[16:24])[0])

    def close(self) -> None:
        self._mm.close()
        os.close(self.fd)


def _zygote_main(sock_fd: int, memory_limit_mb: int, timeout_s: float, scorer_modules: list) -> None:
    """The template process: imports the scorers (and what they preload) once, then forks a warm
    worker per request. Requests carry the worker's connection and shared-state fds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped automatically
    sock = socket.socket(fileno=sock_fd)
    try:
        # in the forked template process, inside the try that reports a failed start to the parent
        from verl_agentic.reward.scorers import SCORERS, import_scorer_modules, preload_modules

        import_scorer_modules(scorer_modules)
        # the built-in scorers come through entry points, found on a registry's first lookup: look
        # them up here, once, or every forked worker would import them inside its first item's timeout
        SCORERS.load_entry_points()
        preload_modules()
        import gc

        gc.collect()
        gc.freeze()  # workers never scan (or copy-on-write-touch) the preloaded objects in GC
    except BaseException:  # reported: the pool fails its start with this traceback
        sock.sendall(b"F" + traceback.format_exc().encode()[:60000])
        return
    sock.sendall(b"R")
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(sock, 16, 2)
        except OSError:
            return
        if len(fds) != 2:
            return  # the pool closed its end
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                sock.close()
                os.setsid()  # its own process group: a kill takes the scorer's children too
                _worker_main(fds[0], fds[1], memory_limit_mb, timeout_s)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        sock.sendall(struct.pack("q", pid))


class _SoftTimeout(BaseException):
    """Raised inside a scorer by SIGALRM at its timeout (a BaseException: ``except Exception`` in a
    scorer does not swallow it)."""


def _alarm(signum, frame):
    raise _SoftTimeout


def _worker_main(conn_fd: int, state_fd: int, memory_limit_mb: int, timeout_s: float) -> None:
    """Worker process: score the chunks it receives, publishing the running task in shared memory.

    With a timeout, each call runs under an interval timer whose SIGALRM interrupts Python code
    (loops, sleeps) at the deadline, so the worker survives and goes on; code that does not return
    to the interpreter (a C loop holding the GIL, e.g. catastrophic regex backtracking) is killed
    by the parent a little later."""
    conn = mpc.Connection(conn_fd)
    signal.signal(signal.SIGALRM, _alarm)
    # The template ignores SIGCHLD (its workers reap themselves); a scorer's own subprocesses must
    # be waited for normally, else subprocess reports exit status 0 for every child.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    state = _SharedState(state_fd)
    try:
        if memory_limit_mb > 0:
            import resource

            limit = memory_limit_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        # in the worker process, inside the try that reports a failed start
        from verl_agentic.reward.naive import score_one
    except BaseException:  # reported: the pool fails this worker's start with this traceback
        conn.send(("fatal", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if msg is None:
            return
        results, last_flush = [], time.monotonic()
        epoch, tasks = msg
        for task_id, item, override, kwargs in tasks:
            if state.epoch() != epoch:
                break  # the parent took these back and gave them to another worker
            started = time.monotonic()
            state.set(task_id, started)
            try:
                if timeout_s > 0:
                    signal.setitimer(signal.ITIMER_REAL, timeout_s)
                result = score_one(item, override, kwargs)
            except _SoftTimeout:
                result = RewardResult(None, {}, ScoreError(
                    "timeout", f"scorer ran past reward.timeout_s={timeout_s:g} s and was interrupted").as_error())
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            now = time.monotonic()
            state.set(_IDLE, now)
            results.append((task_id, result, now - started))
            if now - last_flush > _FLUSH_S:
                conn.send(("results", results))
                results, last_flush = [], now
        if results:
            conn.send(("results", results))


def _sleeping(pid: int) -> bool:
    """Whether the process is asleep (S/D in /proc), i.e. waiting rather than computing or runnable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"S", b"D")
    except (OSError, IndexError):
        return False


class _StartError(Exception):
    pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise _StartError("the scorer template process exited")
        buf += chunk
    return buf


@dataclass
class _Task:
    id: int
    item: RewardItem
    override: Optional[str]
    kwargs: dict
    future: Future


@dataclass
class _Worker:
    pid: int
    conn: mpc.Connection
    state: _SharedState
    sentinel: Any  # a pidfd (readable when the process exits) or, without pidfd support, the connection
    spawned_at: float
    ready: bool = False
    straggler: bool = False
    retiring: bool = False
    standby: bool = False  # idle, warm, kept for the next straggler (no fork needed)
    epoch: int = 0
    exited: bool = False
    done: int = 0  # tasks finished; a worker's first task may pay one-off imports, so it is not judged a straggler
    outstanding: collections.OrderedDict = field(default_factory=collections.OrderedDict)  # task id -> _Task

    def running(self) -> tuple[Optional[int], float]:
        task_id, started = self.state.get()
        return (None, 0.0) if task_id == _IDLE else (int(task_id), started)

    def alive(self) -> bool:
        if isinstance(self.sentinel, int):  # pidfd: readable once the process has exited
            return not mpc.wait([self.sentinel], timeout=0)
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False


class ScorerPool:
    """Worker processes scoring ``RewardItem``s; ``submit`` returns a Future of a ``RewardResult``."""

    def __init__(self, num_workers: int, *, timeout_s: Optional[float] = 30.0, memory_limit_mb: Optional[int] = 4096,
                 scorer_modules: Sequence[str] = (), straggler_s: Optional[float] = None, max_spares: Optional[int] = None,
                 overcommit: Optional[int] = None):
        self.num_workers = max(1, int(num_workers))
        # Active processes kept busy: a few more than the CPUs asked for, so a sample that hangs
        # (sleeping, not computing) does not idle a CPU while the straggler check catches up.
        self.target_active = self.num_workers + (self.num_workers if overcommit is None else max(0, overcommit))
        self.timeout_s = timeout_s
        self.memory_limit_mb = memory_limit_mb
        self.scorer_modules = list(scorer_modules)
        self.straggler_s = straggler_s
        self.max_spares = max(128, 16 * self.num_workers) if max_spares is None else max_spares
        self.max_standby = max(64, 8 * self.num_workers)
        self.kill_grace_s = 1.0 if timeout_s is None else max(1.0, 0.25 * timeout_s)
        self._lock = threading.RLock()
        self._pending: collections.deque[_Task] = collections.deque()
        self._workers: list[_Worker] = []
        self._ids = itertools.count()
        self._wake_r, self._wake_w = mpc.Pipe(duplex=False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._typical_s = 0.005  # EWMA of sample time, for the straggler threshold
        self._failed_starts = 0
        self._zygote: Optional[tuple[subprocess.Popen, socket.socket]] = None
        self._crash: Optional[str] = None
        self.counters = collections.Counter()

    # -- public ---------------------------------------------------------------------------
    def submit(self, item: RewardItem, override: Optional[str] = None, kwargs: Optional[dict] = None) -> Future:
        """Queue one item; the Future resolves to its ``RewardResult`` (failures included, never an exception)."""
        return self.submit_many([item], override, kwargs)[0]

    def submit_many(self, items: Sequence[RewardItem], override: Optional[str] = None,
                    kwargs: Optional[dict] = None) -> list[Future]:
        """Queue several items at once (one wake-up of the dispatcher)."""
        futures = [Future() for _ in items]
        with self._lock:
            if self._closed:
                raise RuntimeError("ScorerPool is closed")
            if self._thread is not None and not self._thread.is_alive():
                raise RuntimeError(f"ScorerPool's dispatcher stopped: {self._crash or 'unknown reason'}")
            self._pending.extend(_Task(next(self._ids), item, override, kwargs or {}, fut)
                                 for item, fut in zip(items, futures))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="verl-agentic-scorer-pool", daemon=True)
                self._thread.start()
        self._wake()
        return futures

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for w in list(self._workers):
            for t in list(w.outstanding.values()):
                self._finish(t, "worker_died", "the scorer pool was closed")
            self._kill(w)
        if self._zygote is not None:
            self._zygote[1].close()  # the template sees EOF and exits
            try:
                self._zygote[0].wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._zygote[0].kill()
            self._zygote = None
        self._selector.close()
        for t in self._pending:
            self._finish(t, "worker_died", "the scorer pool was closed")
        self._pending.clear()

    # -- dispatcher thread ----------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send_bytes(b"x")
        except OSError:
            pass

    def _quick_after(self, w: _Worker) -> float:
        """A sample this old whose worker is asleep (not computing) is a straggler already."""
        if w.done == 0:
            return self._straggler_after(w)
        return max(_MIN_QUICK_S, 10 * self._typical_s)

    def _straggler_after(self, w: _Worker) -> float:
        s = self.straggler_s if self.straggler_s is not None else max(_MIN_STRAGGLER_S, 20 * self._typical_s)
        if w.done == 0:
            s = max(s, _FIRST_TASK_GRACE_S)
        return min(s, self.timeout_s / 2) if self.timeout_s else s

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                self._maintain()
                self._dispatch()
                # one persistent selector: the cost per wake-up does not grow with idle stragglers
                readable: list[_Worker] = []
                for key, _ in self._selector.select(timeout=self._next_deadline()):
                    kind, w = key.data
                    if kind == "wake":
                        while self._wake_r.poll():
                            self._wake_r.recv_bytes()
                    elif kind == "conn":
                        readable.append(w)
                    else:  # its pidfd: the process exited
                        w.exited = True
                for w in readable:
                    if w in self._workers:
                        self._drain(w)
                self._check_workers()
        except BaseException as e:  # a bug here must not leave futures hanging forever
            msg = self._crash = f"scorer pool dispatcher crashed: {type(e).__name__}: {e}"
            for t in self._all_open_tasks():
                if not t.future.done():
                    t.future.set_result(RewardResult(None, {}, ScoreError("worker_died", msg).as_error()))
            raise

    def _all_open_tasks(self) -> list[_Task]:
        tasks = list(self._pending)
        for w in self._workers:
            tasks.extend(w.outstanding.values())
        return tasks

    def _active(self) -> list[_Worker]:
        return [w for w in self._workers if not (w.straggler or w.retiring or w.standby)]

    def _maintain(self) -> None:
        """Keep num_workers non-straggling workers, plus spares for stragglers (capped)."""
        with self._lock:
            has_work = bool(self._pending)
        if not has_work and not self._workers:
            return
        stragglers = sum(1 for w in self._workers if w.straggler and not w.retiring)
        standby = sorted((w for w in self._workers if w.standby), key=lambda w: w.done)  # warmest last
        while len(self._active()) < self.target_active:
            if standby:
                standby.pop().standby = False  # warm and ready: no fork
            elif stragglers > self.max_spares and len(self._workers) >= self.num_workers + self.max_spares:
                return  # too many stragglers at once: wait for their timeouts
            elif not self._spawn():
                return

    def _ensure_zygote(self) -> socket.socket:
        if self._zygote is not None and self._zygote[0].poll() is None:
            return self._zygote[1]
        if self._zygote is not None:
            self._zygote[1].close()
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        cmd = [sys.executable, "-c", "import sys; from verl_agentic.reward.prime import _zygote_main; "
               "_zygote_main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])",
               str(child_sock.fileno()), str(int(self.memory_limit_mb or 0)), str(self.timeout_s or 0),
               *self.scorer_modules]
        proc = subprocess.Popen(cmd, pass_fds=(child_sock.fileno(),), env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL)
        child_sock.close()
        parent_sock.settimeout(_STARTUP_TIMEOUT_S)
        first = parent_sock.recv(65536)
        if first[:1] != b"R":
            proc.kill()
            parent_sock.close()
            raise _StartError(f"the scorer template process failed to start:\n{first[1:].decode(errors='replace')}")
        self._zygote = (proc, parent_sock)
        self.counters["templates_started"] += 1
        return parent_sock

    def _spawn(self) -> bool:
        """Fork a worker from the warm template process, talking over a socketpair and publishing
        its running task in a shared memfd (fresh interpreters, not forks of this process: no
        inherited threads, no re-import of the caller's __main__)."""
        try:
            zygote = self._ensure_zygote()
            parent_sock, child_sock = socket.socketpair()
            state = _SharedState.create()
            socket.send_fds(zygote, [b"w"], [child_sock.fileno(), state.fd])
            pid = struct.unpack("q", _recv_exact(zygote, 8))[0]
        except (_StartError, OSError) as e:
            self._fail_start(str(e))
            return False
        child_sock.close()
        conn = mpc.Connection(parent_sock.detach())
        try:
            sentinel = os.pidfd_open(pid)
        except (AttributeError, OSError):
            sentinel = conn
        w = _Worker(pid, conn, state, sentinel, time.monotonic())
        self._workers.append(w)
        self._selector.register(conn, selectors.EVENT_READ, ("conn", w))
        if sentinel is not conn:
            self._selector.register(sentinel, selectors.EVENT_READ, ("exit", w))
        self.counters["workers_started"] += 1
        return True

    def _chunk_size(self) -> int:
        with self._lock:
            pending = len(self._pending)
        return max(1, min(64, pending // (4 * max(1, len(self._active())))))

    def _dispatch(self) -> None:
        for w in self._active():
            if not w.ready:
                continue
            while len(w.outstanding) < 2 * self._chunk_size():
                with self._lock:
                    n = min(self._chunk_size(), len(self._pending))
                    chunk = [self._pending.popleft() for _ in range(n)]
                chunk = [t for t in chunk if not t.future.done()]
                if not chunk:
                    break
                for t in chunk:
                    w.outstanding[t.id] = t
                try:
                    w.conn.send((w.epoch, [(t.id, t.item, t.override, t.kwargs) for t in chunk]))
                except (OSError, ValueError):  # it died; _check_workers requeues
                    break

    def _drain(self, w: _Worker) -> None:
        try:
            while w.conn.poll():
                kind, payload = w.conn.recv()
                if kind == "ready":
                    w.ready = True
                    self._failed_starts = 0
                elif kind == "fatal":
                    self._fail_start(f"a scorer worker failed to start:\n{payload}")
                    self._kill(w)
                    return
                elif kind == "results":
                    for task_id, result, seconds in payload:
                        if result.error is None:  # timeouts and crashes say nothing about typical cost
                            self._typical_s = 0.95 * self._typical_s + 0.05 * min(seconds, 10 * self._typical_s)
                        w.done += 1
                        task = w.outstanding.pop(task_id, None)
                        if task is not None and not task.future.done():
                            task.future.set_result(result)
                            self.counters["scored"] += 1
                    if w.straggler and w.running()[0] is None and not w.outstanding:
                        w.straggler = False  # it recovered: back to work, on standby, or retired
                        if len(self._active()) > self.target_active:
                            if sum(x.standby for x in self._workers) < self.max_standby:
                                w.standby = True
                            else:
                                w.retiring = True
                                w.conn.send(None)
        except (EOFError, OSError):
            w.exited = w.exited or not w.alive()  # without a pidfd, EOF is how a death shows

    def _requeue(self, w: _Worker, skip: Optional[int] = None) -> None:
        """Put ``w``'s unfinished tasks (but ``skip``, the one it is running) back at the queue's front."""
        keep = w.outstanding.get(skip) if skip is not None else None
        back = [t for tid, t in w.outstanding.items() if tid != skip and not t.future.done()]
        w.outstanding.clear()
        w.epoch += 1  # the worker drops what is still queued in its pipe
        try:
            w.state.set_epoch(w.epoch)
        except ValueError:  # its shared state is already released
            pass
        if keep is not None:
            w.outstanding[skip] = keep
        with self._lock:
            self._pending.extendleft(reversed(back))
        self.counters["requeued"] += len(back)

    def _finish(self, task: Optional[_Task], type: str, message: str) -> None:
        if task is not None and not task.future.done():
            task.future.set_result(RewardResult(None, {}, ScoreError(type, message).as_error()))
            self.counters[type] += 1

    def _check_workers(self) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            running, started = w.running()
            if w.exited:
                self._drain(w)
                if w.retiring:
                    pass
                elif not w.ready:
                    self._fail_start("a scorer worker exited before it was ready")
                elif running is not None:  # it died inside a scorer call: that sample is the one to blame
                    self._finish(w.outstanding.get(running), "worker_died",
                                 "the scorer worker process died while scoring this sample "
                                 "(killed from outside, e.g. by the OOM killer, or crashed)")
                self._requeue(w)
                self._release(w)
                continue
            if not w.ready:
                if now - w.spawned_at > _STARTUP_TIMEOUT_S:
                    self._kill(w)
                    self._fail_start(f"a scorer worker did not start within {_STARTUP_TIMEOUT_S:.0f} s")
                continue
            if running is None:
                continue
            elapsed = now - started
            if self.timeout_s is not None and elapsed > self.timeout_s + self.kill_grace_s:
                self._drain(w)  # keep what it finished before the hang
                self._kill(w)
                self._finish(w.outstanding.get(running), "timeout",
                             f"scorer ran past reward.timeout_s={self.timeout_s:g} s and did not respond to the "
                             "interrupt; its worker process was killed")
                self._requeue(w, skip=running)
                self.counters["workers_killed"] += 1
            elif not w.straggler and (elapsed > self._straggler_after(w)
                                      or (elapsed > self._quick_after(w) and _sleeping(w.pid))):
                w.straggler = True
                self.counters["stragglers"] += 1
                self._requeue(w, skip=running)

    def _fail_start(self, message: str) -> None:
        self._failed_starts += 1
        if self._failed_starts >= _MAX_FAILED_STARTS:
            with self._lock:
                tasks, self._pending = list(self._pending), collections.deque()
            for t in tasks:
                self._finish(t, "worker_died", message)

    def _next_deadline(self) -> float:
        now, soonest = time.monotonic(), 1.0
        for w in self._workers:
            running, started = w.running()
            if running is not None:
                limits = [self._quick_after(w), self._straggler_after(w)] if not w.straggler else []
                limits = [lim for lim in limits if started + lim > now] or limits[-1:]
                if self.timeout_s is not None:
                    limits.append(self.timeout_s + self.kill_grace_s)
                for lim in limits:
                    soonest = min(soonest, max(0.0, started + lim - now) + 0.001)
            elif w.outstanding:
                soonest = min(soonest, 0.05)  # a chunk is queued but not started yet: look again soon
        return soonest

    def _kill(self, w: _Worker) -> None:
        try:
            os.killpg(w.pid, signal.SIGKILL)  # the group: the scorer's own children die too
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 5
        while w.alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        self._release(w)

    def _release(self, w: _Worker) -> None:
        if w in self._workers:
            self._workers.remove(w)
        for obj in {id(w.conn): w.conn, id(w.sentinel): w.sentinel}.values():
            try:
                self._selector.unregister(obj)
            except (KeyError, ValueError, OSError):
                pass
        for closer in (w.conn.close, w.state.close) + ((lambda: os.close(w.sentinel)),) * isinstance(w.sentinel, int):
            try:
                closer()
            except OSError:
                pass


@register_reward_manager("prime")
class PrimeRewardManager(RewardManager):
    """Process-pool manager; see the module docstring. ``stats()`` adds the pool's counters."""

    def __init__(self, config: Optional[RewardConfig] = None, **pool_kwargs: Any):
        super().__init__(config)
        cfg = self.config
        self.pool = ScorerPool(cfg.workers, timeout_s=cfg.timeout_s, memory_limit_mb=cfg.memory_limit_mb,
                               scorer_modules=cfg.scorer_modules, straggler_s=cfg.straggler_s,
                               overcommit=cfg.overcommit, **pool_kwargs)

    def submit(self, item: RewardItem) -> Future:
        return self.pool.submit(item, self.config.scorer, self.config.scorer_kwargs)

    def _score_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Submit in blocks, keeping at most ``window`` samples queued or in flight (bounded memory).

        The window counts completions in any order: a hung sample holds one slot until its
        timeout, never the whole submission."""
        block = 256
        window = max(4 * block, 128 * self.pool.num_workers)
        futures: list[Future] = []
        finished = threading.Condition()
        completed = 0

        def on_done(_f: Future) -> None:
            nonlocal completed
            with finished:
                completed += 1
                finished.notify()

        with progress_bar(len(items), "prime scoring", self.config.progress) as bar:
            shown = 0
            for start in range(0, len(items), block):
                with finished:
                    finished.wait_for(lambda: len(futures) - completed < window)
                    bar.update(completed - shown)
                    shown = completed
                new = self.pool.submit_many(items[start:start + block], self.config.scorer, self.config.scorer_kwargs)
                for f in new:
                    f.add_done_callback(on_done)
                futures += new
            results = [f.result() for f in futures]
            bar.update(len(items) - shown)
            return results

    async def ascore_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        return await asyncio.to_thread(self.score_items, items)

    def stats(self) -> dict:
        return {**super().stats(), **{f"pool/{k}": v for k, v in self.pool.counters.items()}}

    def close(self) -> None:
        self.pool.close()
