"""The sandbox service: SWE-style repository sandboxes over HTTP, plus the reward protocol.

Run it (loopback by default; the API has no authentication, keep it off public interfaces)::

    python -m verl_agentic.sandbox.server --port 8100 --max-sandboxes 64 --idle-timeout-s 900

It prints ``sandbox server listening on http://HOST:PORT`` when ready (``--port 0``: a free port,
printed). Point the ``swedev`` task at it (``task.swedev.url=http://HOST:PORT``) and, to score
its trajectories, the reward client too (``reward.manager=remote reward.url=http://HOST:PORT``).

A sandbox is a work directory built from an instance's files; commands run in it under the
isolation engine (``verl_agentic.isolation``; ``--isolation bwrap``, the default, needs bubblewrap
and the service refuses to start without it; requests cannot change it). Instance ids map to
sandboxes as in SWE-style runtimes: creating with ``files`` registers (or updates) the instance's files,
creating with only ``instance_id`` starts from the registered ones, and a ``key`` makes create
idempotent (the same key returns the same live sandbox, so a retried request cannot leak one).
One operation at a time runs per sandbox, in arrival order.

Endpoints (JSON in, JSON out)::

    GET    /health                          status, boot id, live sandboxes, limits, isolation, stats
    POST   /sandboxes                       {instance_id, files?, key?, limits?} -> 201 {sandbox_id, ...}
                                            (200 with "created": false for a live key)
    GET    /sandboxes[?instance_id=ID]      the live sandboxes
    GET    /sandboxes/{id}                  one sandbox
    DELETE /sandboxes/{id}                  destroy it (kills a running command)
    POST   /sandboxes/{id}/exec             {command, timeout_s?} -> the SandboxResult fields
    POST   /sandboxes/{id}/test             {test_files, test_command, timeout_s?} -> HiddenTestResult fields
    GET    /sandboxes/{id}/files?path=P     a file's text, or a directory's entries
    PUT    /sandboxes/{id}/files            {path, content}
    GET    /sandboxes/{id}/changes          {files, deleted, skipped} against the files it was created from
    POST   /score, GET /scorers             the reward protocol of ``verl_agentic.reward.server``

Errors are ``{"error": {"type", "message", "retryable", ...}}`` (``serving.ServiceError``) with a status: 400 ``bad_request`` /
``bad_path`` / ``path_outside_sandbox`` (a path that is absolute, has ``..`` or resolves outside
through a symlink), 404 ``unknown_sandbox`` / ``sandbox_reaped`` (idle timeout) /
``sandbox_lost`` (an id of an earlier run of the service: it restarted) / ``unknown_instance`` /
``file_not_found``, 409 ``key_conflict`` / ``sandbox_destroyed`` (destroyed while the command
ran), 413 ``request_too_large``, 429 ``too_many_sandboxes`` (the ``--max-sandboxes`` cap; the
answer says how many are live), 500 ``internal_error``, 503 ``shutting_down``.

Lifetime: a sandbox unused for ``--idle-timeout-s`` is destroyed by a reaper; on SIGTERM /
SIGINT the service stops accepting requests, kills running commands and removes every work
directory before it exits. Work directories live under one directory per service process
(``va_sandboxd-<pid>-<boot>`` in the temp dir); a restarted service removes those of dead
processes, so a crashed (SIGKILLed) service leaves nothing behind after its next start. Commands
started by a SIGKILLed service die with it (PR_SET_PDEATHSIG).

Scoring (``POST /score``, the protocol of ``verl_agentic.reward.server``, so the ``swedev``
reward client talks to this service as it is): every item goes through ``run_scorer`` in a pool
of ``--score-workers`` threads; the ``swedev`` scorer runs the hidden tests in a fresh sandboxed
directory built from the trajectory's submission. A scorer past ``--score-timeout-s`` gives a
``timeout`` result (a thread cannot be killed: the swedev scorer's own test timeout is what
bounds it; use ``python -m verl_agentic.reward.server`` for CPU-bound scorers that may hang).

In-process (tests)::

    async with serve(ServiceConfig(max_sandboxes=4)) as url:
        ...
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import itertools
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Optional, Sequence

from aiohttp import web

from verl_agentic.interfaces import ConfigError
from verl_agentic.isolation import ISOLATION_MODES, SandboxLimits, check_isolation, sandbox_support
from verl_agentic.reward.base import RewardResult, ScoreError
from verl_agentic.reward.naive import score_one
from verl_agentic.reward.scorers import SCORERS
from verl_agentic.reward.server import SCORE_REQUEST_KEYS, parse_score_request
from verl_agentic.sandbox import runtime
from verl_agentic.sandbox.runtime import Changes, FileSet, HiddenTests, PathError
from verl_agentic.serving import ServiceError, error_middleware, read_json_object, run_service, serve_app

ROOT_PREFIX = "va_sandboxd-"
_GONE_MEMORY = 10_000  # ids of destroyed sandboxes remembered, for precise 404 messages
_FIXED_LIMITS = ("isolation", "readonly_paths")  # SandboxLimits a request may not change


@dataclass
class ServiceConfig:
    """Settings of the sandbox service (the CLI flags)."""

    max_sandboxes: int = 64  # live sandboxes; one more is a 429
    idle_timeout_s: float = 900.0  # a sandbox unused this long is destroyed
    limits: SandboxLimits = field(default_factory=lambda: SandboxLimits(wall_timeout_s=30.0))  # per command
    max_timeout_s: float = 600.0  # the longest command a request may ask for
    max_concurrent_runs: int = 0  # commands running at once over all sandboxes (0 = 2 x CPUs)
    max_repo_mb: float = 64.0  # files of one create request
    max_read_mb: float = 1.0  # a read returns at most this much (truncated beyond)
    max_request_mb: float = 64.0  # any request body
    max_instances_mb: float = 512.0  # registered instance files kept for create-by-id (oldest dropped)
    allow_network: bool = False  # whether a sandbox may ask for limits.network=true
    workdir_parent: Optional[str] = None  # where the service's directory goes (default: the temp dir)
    score_workers: int = 0  # threads scoring POST /score items (0 = max_concurrent_runs)
    score_timeout_s: float = 120.0  # per scored item
    reap_interval_s: Optional[float] = None  # default: idle_timeout_s / 4, at most 5 s

    def validate(self) -> None:
        if not isinstance(self.max_sandboxes, int) or self.max_sandboxes < 1:
            raise ConfigError(f"sandbox service: max_sandboxes must be an integer >= 1, got {self.max_sandboxes!r}")
        for name in ("idle_timeout_s", "max_timeout_s", "max_repo_mb", "max_read_mb", "max_request_mb",
                     "max_instances_mb", "score_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"sandbox service: {name} must be > 0, got {getattr(self, name)!r}")
        if self.limits.wall_timeout_s > self.max_timeout_s:
            raise ConfigError(f"sandbox service: the default command timeout ({self.limits.wall_timeout_s} s) is "
                              f"above max_timeout_s ({self.max_timeout_s} s)")
        if self.limits.network and not self.allow_network:
            raise ConfigError("sandbox service: limits.network=true needs allow_network")

    @property
    def runs(self) -> int:
        return self.max_concurrent_runs if self.max_concurrent_runs > 0 else 2 * (os.cpu_count() or 1)


@dataclass
class Sandbox:
    id: str
    instance_id: str
    key: Optional[str]
    workdir: Path
    original: FileSet  # the files it was created from (what /changes compares against)
    limits: SandboxLimits
    created_at: float  # wall clock
    last_used: float  # monotonic
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    busy: int = 0  # operations in progress or waiting (the reaper leaves busy sandboxes alone)
    runs: int = 0
    running: set = field(default_factory=set)  # command tasks, cancelled by destroy

    def info(self) -> dict:
        return {"sandbox_id": self.id, "instance_id": self.instance_id, "key": self.key,
                "workdir": str(self.workdir), "created_at": self.created_at,
                "idle_s": round(time.monotonic() - self.last_used, 3), "busy": self.busy > 0, "runs": self.runs,
                "limits": asdict(self.limits)}


class SandboxService:
    """The sandboxes of one service process; the HTTP handlers below call into it."""

    def __init__(self, config: ServiceConfig):
        config.validate()
        self.config = config
        self.boot_id = uuid.uuid4().hex[:12]
        self.started_at = time.time()
        self.root: Optional[Path] = None
        self.sandboxes: dict[str, Sandbox] = {}
        self.by_key: dict[str, str] = {}
        self.instances: "collections.OrderedDict[str, FileSet]" = collections.OrderedDict()
        self.gone: "collections.OrderedDict[str, str]" = collections.OrderedDict()  # id -> why it is gone
        self.stats: collections.Counter = collections.Counter()
        self.closing = False
        self.support: dict = {}
        self._ids = itertools.count(1)
        self._runs = asyncio.Semaphore(config.runs)
        self._reaper: Optional[asyncio.Task] = None

    # -- lifetime -------------------------------------------------------------------------------
    async def start(self) -> None:
        # refuse to start without the isolation asked for (warn when it is turned off), off the event loop
        await asyncio.to_thread(check_isolation, self.config.limits, "sandbox service")
        parent = Path(self.config.workdir_parent or tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.stats["stale_dirs_removed"] = await asyncio.to_thread(remove_stale_roots, parent)
        self.root = parent / f"{ROOT_PREFIX}{os.getpid()}-{self.boot_id}"
        self.root.mkdir()
        self.support = await asyncio.to_thread(sandbox_support)  # probe once, off the event loop
        self._reaper = asyncio.create_task(self._reap_forever())

    async def close(self) -> None:
        """Kill running commands, destroy every sandbox, remove the service's directory."""
        self.closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*(self.destroy(sb, "the service shut down") for sb in list(self.sandboxes.values())))
        # A cancelled run_python kills the command's process group at once but leaves the rest of its pids
        # cgroup (processes that left the group with setsid) to a "sandbox-cleanup" daemon thread; this
        # process is about to exit, which would stop such a thread half way.
        for thread in [t for t in threading.enumerate() if t.name == "sandbox-cleanup"]:
            await asyncio.to_thread(thread.join, 10)
        if self.root is not None:
            await asyncio.to_thread(shutil.rmtree, self.root, True)

    async def _reap_forever(self) -> None:
        cfg = self.config
        interval = cfg.reap_interval_s or min(cfg.idle_timeout_s / 4, 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            idle = [sb for sb in self.sandboxes.values() if not sb.busy and now - sb.last_used > cfg.idle_timeout_s]
            for sb in idle:
                self.stats["reaped_idle"] += 1
                await self.destroy(sb, f"reaped after {cfg.idle_timeout_s:g} s idle (--idle-timeout-s)")

    # -- sandboxes ------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> Sandbox:
        sb = self.sandboxes.get(sandbox_id)
        if sb is not None:
            return sb
        why = self.gone.get(sandbox_id)
        if why is not None:
            kind = "sandbox_reaped" if why.startswith("reaped") else "unknown_sandbox"
            raise ServiceError(404, kind, f"sandbox {sandbox_id!r} is gone: {why}")
        if sandbox_id.startswith("sb-") and sandbox_id.split("-")[1:2] != [self.boot_id]:
            raise ServiceError(404, "sandbox_lost", f"sandbox {sandbox_id!r} belongs to an earlier run of this "
                               f"service, which restarted (now boot {self.boot_id}, started "
                               f"{time.strftime('%H:%M:%S', time.localtime(self.started_at))}): its sandboxes are gone")
        raise ServiceError(404, "unknown_sandbox", f"no sandbox {sandbox_id!r}")

    def _limits(self, overrides: Any) -> SandboxLimits:
        if overrides is None:
            return self.config.limits
        if not isinstance(overrides, dict):
            raise ServiceError(400, "bad_request", f"'limits' must be an object, got {type(overrides).__name__}")
        for name in _FIXED_LIMITS:  # a request may tighten limits, never weaken the isolation
            if name in overrides and overrides[name] != getattr(self.config.limits, name):
                raise ServiceError(400, "bad_request", f"limits.{name} is set by the service "
                                   f"({getattr(self.config.limits, name)!r}; --isolation), not by a request")
        try:
            limits = SandboxLimits.from_dict({**asdict(self.config.limits), **overrides})
        except (ConfigError, TypeError) as e:
            raise ServiceError(400, "bad_request", f"limits: {e}") from None
        if limits.wall_timeout_s > self.config.max_timeout_s:
            raise ServiceError(400, "bad_request", f"limits.wall_timeout_s={limits.wall_timeout_s} is above this "
                               f"service's max_timeout_s={self.config.max_timeout_s}")
        if limits.network and not self.config.allow_network:
            raise ServiceError(400, "bad_request", "limits.network=true: this service does not allow network "
                               "access (start it with --allow-network)")
        return limits

    def _register(self, instance_id: str, files: FileSet) -> FileSet:
        """Remember an instance's files (latest wins); the oldest are dropped past ``max_instances_mb``."""
        self.instances.pop(instance_id, None)
        self.instances[instance_id] = files
        budget = self.config.max_instances_mb * 2**20
        total = sum(runtime.files_bytes(f) for f in self.instances.values())
        while total > budget and len(self.instances) > 1:
            _, dropped = self.instances.popitem(last=False)
            total -= runtime.files_bytes(dropped)
        return files

    async def create(self, instance_id: Any, files: Any = None, key: Any = None,
                     limits: Any = None) -> tuple[Sandbox, bool]:
        if self.closing:
            raise ServiceError(503, "shutting_down", "the sandbox service is shutting down")
        if not isinstance(instance_id, str) or not instance_id:
            raise ServiceError(400, "bad_request", "'instance_id' must be a non-empty string")
        if key is not None and not isinstance(key, str):
            raise ServiceError(400, "bad_request", "'key' must be a string or null")
        if key is not None and key in self.by_key:
            sb = self.sandboxes[self.by_key[key]]
            if sb.instance_id != instance_id:
                raise ServiceError(409, "key_conflict", f"key {key!r} belongs to sandbox {sb.id} of instance "
                                   f"{sb.instance_id!r}, not {instance_id!r}")
            return sb, False
        if files is not None:
            try:
                fs = runtime.file_set(files, "files")
            except ValueError as e:
                raise ServiceError(400, "bad_request", str(e)) from None
            size = runtime.files_bytes(fs)
            if size > self.config.max_repo_mb * 2**20:
                raise ServiceError(413, "request_too_large", f"the files are {size} bytes, over this service's "
                                   f"max_repo_mb={self.config.max_repo_mb:g}")
        elif instance_id in self.instances:
            fs = self.instances[instance_id]
            self.instances.move_to_end(instance_id)
        else:
            raise ServiceError(404, "unknown_instance", f"instance {instance_id!r} has no registered files: create "
                               "its first sandbox with 'files'")
        sandbox_limits = self._limits(limits)
        if len(self.sandboxes) >= self.config.max_sandboxes:
            self.stats["rejected_at_cap"] += 1
            raise ServiceError(429, "too_many_sandboxes", f"{len(self.sandboxes)} of {self.config.max_sandboxes} "
                               "sandboxes are live (--max-sandboxes): destroy some or retry later",
                               live=len(self.sandboxes), max_sandboxes=self.config.max_sandboxes)
        if files is not None:
            self._register(instance_id, fs)
        sid = f"sb-{self.boot_id}-{next(self._ids)}"
        workdir = self.root / sid
        now = time.monotonic()
        sb = Sandbox(sid, instance_id, key, workdir, fs, sandbox_limits, time.time(), now)
        self.sandboxes[sid] = sb  # counted against the cap before the files are written
        if key is not None:
            self.by_key[key] = sid
        try:
            async with sb.lock:  # a request for it that arrives meanwhile (a retried create) waits for the files
                await asyncio.to_thread(_make_workdir, workdir, fs)
        except BaseException as e:
            self._forget(sb, "its creation failed")
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            if isinstance(e, PathError):
                raise ServiceError(400, e.type, f"files: {e.message}") from None
            raise
        self.stats["created"] += 1
        return sb, True

    def _forget(self, sb: Sandbox, why: str) -> None:
        self.sandboxes.pop(sb.id, None)
        if sb.key is not None and self.by_key.get(sb.key) == sb.id:
            del self.by_key[sb.key]
        self.gone[sb.id] = why
        while len(self.gone) > _GONE_MEMORY:
            self.gone.popitem(last=False)

    async def destroy(self, sb: Sandbox, why: str = "destroyed") -> None:
        """Cancel its running command (which kills its processes), then remove its directory."""
        if sb.id not in self.sandboxes:
            return
        self._forget(sb, why)
        for task in list(sb.running):
            task.cancel()
        async with sb.lock:  # the cancelled command (or a file operation) has let go of the directory
            await asyncio.to_thread(shutil.rmtree, sb.workdir, True)
        self.stats["destroyed"] += 1

    @contextlib.asynccontextmanager
    async def use(self, sandbox_id: str) -> AsyncIterator[Sandbox]:
        """One operation on a sandbox: in arrival order, never while another runs, never reaped meanwhile."""
        sb = self.get(sandbox_id)
        sb.busy += 1
        try:
            async with sb.lock:
                if sb.id not in self.sandboxes:  # destroyed while this request waited
                    self.get(sb.id)
                yield sb
        finally:
            sb.busy -= 1
            sb.last_used = time.monotonic()

    async def _run(self, sb: Sandbox, coro) -> Any:
        """Run a command coroutine as a task ``destroy`` can cancel; 409 when that happened."""
        async with self._runs:
            if sb.id not in self.sandboxes:  # destroyed while this command waited for a run slot
                coro.close()
                raise ServiceError(409, "sandbox_destroyed", f"sandbox {sb.id} was destroyed before its command "
                                   f"started: {self.gone.get(sb.id, 'destroyed')}")
            task = asyncio.ensure_future(coro)
            sb.running.add(task)
            try:
                return await task
            except asyncio.CancelledError:
                if task.cancelled() and not asyncio.current_task().cancelling():
                    raise ServiceError(409, "sandbox_destroyed", f"sandbox {sb.id} was destroyed while its command "
                                       f"ran: {self.gone.get(sb.id, 'destroyed')}") from None
                raise
            finally:
                sb.running.discard(task)
                sb.runs += 1

    def _timeout(self, sb: Sandbox, value: Any) -> SandboxLimits:
        if value is None:
            return sb.limits
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= self.config.max_timeout_s:
            raise ServiceError(400, "bad_request", f"'timeout_s' must be a number in (0, {self.config.max_timeout_s:g}]"
                               f", got {value!r}")
        return runtime.limits_with_timeout(sb.limits, float(value))

    async def exec(self, sandbox_id: str, command: Any, timeout_s: Any = None) -> dict:
        if not isinstance(command, str) or not command.strip():
            raise ServiceError(400, "bad_request", "'command' must be a non-empty string")
        async with self.use(sandbox_id) as sb:
            limits = self._timeout(sb, timeout_s)
            res = await self._run(sb, runtime.run_command(sb.workdir, command, limits))
        self.stats["commands"] += 1
        self.stats["command_timeouts"] += res.timed_out
        return runtime.result_dict(res)

    async def test(self, sandbox_id: str, body: dict) -> dict:
        try:
            tests = HiddenTests.from_ground_truth({k: body.get(k) for k in ("test_files", "test_command")}, "request")
        except ValueError as e:
            raise ServiceError(400, "bad_request", str(e)) from None
        async with self.use(sandbox_id) as sb:
            limits = self._timeout(sb, body.get("timeout_s"))
            try:
                outcome = await self._run(sb, runtime.run_hidden_tests(sb.workdir, tests, limits))
            except PathError as e:
                raise ServiceError(400, e.type, f"test_files: {e.message}") from None
        self.stats["tests"] += 1
        self.stats["tests_passed"] += outcome.passed
        return outcome.as_dict()

    async def read(self, sandbox_id: str, path: Any) -> dict:
        async with self.use(sandbox_id) as sb:
            return await asyncio.to_thread(_read, sb.workdir, path or ".", int(self.config.max_read_mb * 2**20))

    async def write(self, sandbox_id: str, path: Any, content: Any) -> dict:
        if not isinstance(path, str) or not isinstance(content, str):
            raise ServiceError(400, "bad_request", "'path' and 'content' must be strings")
        async with self.use(sandbox_id) as sb:
            limit = sb.limits.file_size_mb
            if limit is not None and len(content.encode()) > limit * 2**20:
                raise ServiceError(413, "request_too_large", f"content is over the sandbox's file size limit "
                                   f"({limit} MB)")
            try:
                await asyncio.to_thread(runtime.write_files, sb.workdir, {path: content})
            except PathError as e:
                raise ServiceError(400, e.type, e.message) from None
        return {"path": path, "bytes": len(content.encode())}

    async def changes(self, sandbox_id: str) -> dict:
        async with self.use(sandbox_id) as sb:
            current, skipped = await asyncio.to_thread(runtime.snapshot, sb.workdir,
                                                       int(self.config.max_read_mb * 2**20))
            return Changes.between(sb.original, current, skipped).as_dict()

    def health(self) -> dict:
        cfg = self.config
        return {"status": "closing" if self.closing else "ok", "service": "verl_agentic.sandbox",
                "boot_id": self.boot_id, "pid": os.getpid(), "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 3), "sandboxes": len(self.sandboxes),
                "max_sandboxes": cfg.max_sandboxes, "idle_timeout_s": cfg.idle_timeout_s,
                "limits": asdict(cfg.limits), "max_timeout_s": cfg.max_timeout_s, "max_concurrent_runs": cfg.runs,
                "instances": len(self.instances), "workdir_root": str(self.root), "isolation": self.support,
                "stats": dict(self.stats)}


def _make_workdir(workdir: Path, files: FileSet) -> None:
    workdir.mkdir()
    runtime.write_files(workdir, files)


def _read(workdir: Path, path: Any, max_bytes: int) -> dict:
    try:
        target = runtime.resolve_inside(workdir, path)
    except PathError as e:
        raise ServiceError(400, e.type, e.message) from None
    if target.is_dir():
        entries = []
        for child in sorted(target.iterdir(), key=lambda c: c.name):
            if child.name in runtime.SKIP_DIRS:
                continue
            kind = "symlink" if child.is_symlink() else "directory" if child.is_dir() else "file"
            entries.append({"name": child.name, "type": kind,
                            "size": child.lstat().st_size if kind == "file" else None})
        return {"path": path, "type": "directory", "entries": entries}
    if not target.exists():
        raise ServiceError(404, "file_not_found", f"{path!r} does not exist")
    if not target.is_file():
        raise ServiceError(400, "bad_path", f"{path!r} is not a regular file")
    with open(target, "rb") as f:
        data = f.read(max_bytes + 1)
    truncated = len(data) > max_bytes
    data = data[:max_bytes]
    try:
        text, binary = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, binary = data.decode("utf-8", "replace"), True
    return {"path": path, "type": "file", "content": text, "size": target.stat().st_size,
            "truncated": truncated, "binary": binary}


def remove_stale_roots(parent: Path) -> int:
    """Remove the work directories of service processes that are gone; returns how many."""
    removed = 0
    for d in parent.glob(f"{ROOT_PREFIX}*"):
        try:
            pid = int(d.name[len(ROOT_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed


# --- HTTP ----------------------------------------------------------------------------------------
_SERVICE = web.AppKey("service", SandboxService)


async def _health(request: web.Request) -> web.Response:
    # the reward client reads timeout_s / workers / max_request_bytes from here (see POST /score)
    return web.json_response({**request.app[_SERVICE].health(), **request.app[_SCORING].health()})


async def _create(request: web.Request) -> web.Response:
    body = await read_json_object(request, ("instance_id", "files", "key", "limits"))
    service = request.app[_SERVICE]
    sb, created = await service.create(body.get("instance_id"), body.get("files"), body.get("key"), body.get("limits"))
    return web.json_response({**sb.info(), "created": created}, status=201 if created else 200)


async def _list(request: web.Request) -> web.Response:
    wanted = request.query.get("instance_id")
    boxes = [sb.info() for sb in request.app[_SERVICE].sandboxes.values()
             if wanted is None or sb.instance_id == wanted]
    return web.json_response({"sandboxes": boxes})


async def _get(request: web.Request) -> web.Response:
    return web.json_response(request.app[_SERVICE].get(request.match_info["sid"]).info())


async def _delete(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    sb = service.get(request.match_info["sid"])
    await service.destroy(sb)
    return web.json_response({"sandbox_id": sb.id, "destroyed": True})


async def _exec(request: web.Request) -> web.Response:
    body = await read_json_object(request, ("command", "timeout_s"))
    result = await request.app[_SERVICE].exec(request.match_info["sid"], body.get("command"), body.get("timeout_s"))
    return web.json_response(result)


async def _test(request: web.Request) -> web.Response:
    body = await read_json_object(request, ("test_files", "test_command", "timeout_s"))
    return web.json_response(await request.app[_SERVICE].test(request.match_info["sid"], body))


async def _read_file(request: web.Request) -> web.Response:
    return web.json_response(await request.app[_SERVICE].read(request.match_info["sid"], request.query.get("path")))


async def _write_file(request: web.Request) -> web.Response:
    body = await read_json_object(request, ("path", "content"))
    result = await request.app[_SERVICE].write(request.match_info["sid"], body.get("path"), body.get("content"))
    return web.json_response(result)


async def _changes(request: web.Request) -> web.Response:
    return web.json_response(await request.app[_SERVICE].changes(request.match_info["sid"]))


class _DaemonPool:
    """Daemon threads running submitted calls: a scorer that hangs cannot keep the process from exiting
    (``ThreadPoolExecutor`` joins its threads at exit). A hung call keeps its thread."""

    def __init__(self, workers: int, name: str):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers = workers
        for i in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
                future.set_exception(e)

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, fn, args))
        return future

    def close(self) -> None:
        for _ in range(self._workers):
            self._jobs.put(None)


class Scoring:
    """``POST /score``: the reward server's protocol, each item through ``run_scorer`` on daemon threads."""

    def __init__(self, config: ServiceConfig):
        self.workers = config.score_workers if config.score_workers > 0 else config.runs
        self.timeout_s = config.score_timeout_s
        self.max_request_bytes = int(config.max_request_mb * 2**20)
        self.pool = _DaemonPool(self.workers, "sandbox-score")
        self.counts: collections.Counter = collections.Counter()

    def health(self) -> dict:
        return {"manager": "sandbox", "workers": self.workers, "timeout_s": self.timeout_s,
                "max_request_bytes": self.max_request_bytes, "scorers": SCORERS.names(),
                "score_stats": dict(self.counts)}

    async def score(self, item: Any, scorer_kwargs: dict) -> Any:
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(self.pool.submit(score_one, item, None, scorer_kwargs)),
                                            self.timeout_s)
        except asyncio.TimeoutError:
            result = RewardResult(None, {}, ScoreError("timeout", f"scorer ran past the sandbox service's "
                                                       f"--score-timeout-s={self.timeout_s:g} s").as_error())
        self.counts["items"] += 1
        self.counts[f"error/{result.error.type}" if result.error else "ok"] += 1
        return result

    def close(self) -> None:
        self.pool.close()


_SCORING = web.AppKey("scoring", Scoring)


async def _score(request: web.Request) -> web.Response:
    items, kwargs = parse_score_request(await read_json_object(request, SCORE_REQUEST_KEYS))
    scoring = request.app[_SCORING]
    results = await asyncio.gather(*(scoring.score(item, kwargs or {}) for item in items))
    return web.json_response({"results": [r.as_dict() for r in results]})


async def _scorers(request: web.Request) -> web.Response:
    return web.json_response({"scorers": SCORERS.names()})


def make_app(config: Optional[ServiceConfig] = None) -> web.Application:
    """The aiohttp application; the service starts with it and cleans up on shutdown."""
    config = config or ServiceConfig()
    service = SandboxService(config)
    scoring = Scoring(config)
    app = web.Application(client_max_size=int(config.max_request_mb * 2**20), middlewares=[error_middleware()])
    app[_SERVICE] = service
    app[_SCORING] = scoring

    async def start(app: web.Application) -> None:
        await service.start()

    async def stop(app: web.Application) -> None:  # on_shutdown: before waiting for in-flight requests
        await service.close()
        scoring.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
    r = app.router
    r.add_get("/health", _health)
    r.add_post("/sandboxes", _create)
    r.add_get("/sandboxes", _list)
    r.add_get("/sandboxes/{sid}", _get)
    r.add_delete("/sandboxes/{sid}", _delete)
    r.add_post("/sandboxes/{sid}/exec", _exec)
    r.add_post("/sandboxes/{sid}/test", _test)
    r.add_get("/sandboxes/{sid}/files", _read_file)
    r.add_put("/sandboxes/{sid}/files", _write_file)
    r.add_get("/sandboxes/{sid}/changes", _changes)
    r.add_post("/score", _score)
    r.add_get("/scorers", _scorers)
    return app


@contextlib.asynccontextmanager
async def serve(config: Optional[ServiceConfig] = None, host: str = "127.0.0.1", port: int = 0, *,
                quiet: bool = True) -> AsyncIterator[str]:
    """Serve in this event loop; yields ``http://host:port`` (the real port when ``port=0``)."""
    async with serve_app(make_app(config), host, port, shutdown_timeout=5.0, quiet=quiet) as url:
        yield url


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    d = ServiceConfig()
    p = argparse.ArgumentParser(prog="python -m verl_agentic.sandbox.server", description=(
        "Repository sandboxes over HTTP for the swedev task, and the reward protocol for reward.manager=remote."))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100, help="0 = a free port (printed)")
    p.add_argument("--max-sandboxes", type=int, default=d.max_sandboxes, help="live sandboxes; more is a 429")
    p.add_argument("--idle-timeout-s", type=float, default=d.idle_timeout_s, help="destroy sandboxes idle this long")
    p.add_argument("--wall-timeout-s", type=float, default=d.limits.wall_timeout_s, help="default per command")
    p.add_argument("--max-timeout-s", type=float, default=d.max_timeout_s, help="longest command a request may ask")
    p.add_argument("--memory-mb", type=int, default=d.limits.memory_mb, help="address space per process; 0 = none")
    p.add_argument("--cpu-time-s", type=int, default=d.limits.cpu_time_s, help="CPU seconds per process; 0 = none")
    p.add_argument("--max-processes", type=int, default=d.limits.max_processes, help="tasks per command; 0 = none")
    p.add_argument("--file-size-mb", type=int, default=d.limits.file_size_mb, help="largest file; 0 = none")
    p.add_argument("--max-concurrent-runs", type=int, default=0, help="commands at once (0 = 2 x CPUs)")
    p.add_argument("--allow-network", action="store_true", help="let a sandbox ask for limits.network=true")
    p.add_argument("--isolation", choices=ISOLATION_MODES, default=d.limits.isolation,
                   help="bwrap (needs bubblewrap) | none (unsafe: commands see the host's files and processes)")
    p.add_argument("--workdir-parent", default=None, help="where the work directories go (default: temp dir)")
    p.add_argument("--score-workers", type=int, default=0, help="threads scoring POST /score items")
    p.add_argument("--score-timeout-s", type=float, default=d.score_timeout_s, help="per scored item")
    p.add_argument("--quiet", action="store_true", help="no access log")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ServiceConfig:
    def opt(v):  # 0 switches a limit off
        return v if v and v > 0 else None

    limits = SandboxLimits(wall_timeout_s=args.wall_timeout_s, cpu_time_s=opt(args.cpu_time_s),
                           memory_mb=opt(args.memory_mb), file_size_mb=opt(args.file_size_mb),
                           max_processes=opt(args.max_processes), isolation=args.isolation)
    return ServiceConfig(max_sandboxes=args.max_sandboxes, idle_timeout_s=args.idle_timeout_s, limits=limits,
                         max_timeout_s=args.max_timeout_s, max_concurrent_runs=args.max_concurrent_runs,
                         allow_network=args.allow_network, workdir_parent=args.workdir_parent,
                         score_workers=args.score_workers, score_timeout_s=args.score_timeout_s)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)

    def start():
        config = config_from_args(args)
        config.validate()
        return serve(config, args.host, args.port, quiet=args.quiet)

    return run_service("sandbox server", start, lambda: "sandbox server stopped: all sandboxes destroyed")


if __name__ == "__main__":
    sys.exit(main())
