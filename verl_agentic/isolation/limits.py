"""The vocabulary of a sandboxed run: its limits (config) and its result."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from verl_agentic.interfaces import ConfigError, check_keys

ISOLATION_MODES = ("bwrap", "none")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. ``None`` switches a limit off (not ``wall_timeout_s``)."""

    wall_timeout_s: float = 10.0  # wall clock; the whole group is SIGKILLed past it
    cpu_time_s: Optional[int] = 10  # RLIMIT_CPU per process
    memory_mb: Optional[int] = 512  # RLIMIT_AS (address space) per process
    file_size_mb: Optional[int] = 16  # RLIMIT_FSIZE: largest file a process may write
    max_processes: Optional[int] = 64  # tasks (processes + threads): pids cgroup as root, else RLIMIT_NPROC
    max_output_bytes: int = 64_000  # per stream (stdout, stderr); past it: cut and killed
    network: bool = False  # False: private network namespace (no outside network)
    # bwrap: namespaces, a read-only root of only what the interpreter needs, the work dir the one
    # writable host path (see verl_agentic.isolation). none: the code runs as the caller, on the
    # caller's filesystem (unsafe for model-written code; a warning says so on every start)
    isolation: str = "bwrap"
    readonly_paths: tuple = ()  # bwrap: more host paths the code may read (e.g. a site-packages dir)
    tmp_mb: Optional[int] = 64  # bwrap: size of the private /tmp and of /dev/shm (each, in memory)

    def __post_init__(self):
        if not self.wall_timeout_s or self.wall_timeout_s <= 0:
            raise ConfigError(f"SandboxLimits.wall_timeout_s must be > 0, got {self.wall_timeout_s!r}")
        for name in ("cpu_time_s", "memory_mb", "file_size_mb", "max_processes", "tmp_mb"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or v <= 0):
                raise ConfigError(f"SandboxLimits.{name} must be a positive number or None, got {v!r}")
        if self.max_output_bytes <= 0:
            raise ConfigError(f"SandboxLimits.max_output_bytes must be > 0, got {self.max_output_bytes!r}")
        if self.isolation not in ISOLATION_MODES:
            raise ConfigError(f"SandboxLimits.isolation must be one of {list(ISOLATION_MODES)}, "
                              f"got {self.isolation!r}")
        paths = self.readonly_paths
        if isinstance(paths, str) or not all(isinstance(p, str) and p.startswith("/") for p in paths):
            raise ConfigError(f"SandboxLimits.readonly_paths must be a list of absolute paths, got {paths!r}")
        object.__setattr__(self, "readonly_paths", tuple(paths))  # from a config list

    @classmethod
    def from_dict(cls, d: dict) -> "SandboxLimits":
        check_keys(d, [f.name for f in dataclasses.fields(cls)], "sandbox limits")
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
    pid: Optional[int] = None  # the started process's pid (= its process group and session id): bwrap's
    isolation: str = "none"  # bwrap | none: what the run actually got

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error_type is None
