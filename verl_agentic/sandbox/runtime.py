"""What a sandbox does to its work directory: confined paths, file sets, changes, commands, hidden tests.

No HTTP here. The sandbox service (``server.py``) runs these on its sandboxes' work dirs, and the
``swedev`` scorer (``verl_agentic.tasks.swedev.scorer``) runs the same hidden-test code on a
fresh directory built from a trajectory's submission, so the test an episode ends with and the
test a reward manager re-runs are the same code.

Commands run in the isolation engine (``verl_agentic.isolation.run_python``; by default under
bubblewrap: own user, PID, mount and network namespaces, a read-only root of ``/usr`` and the
interpreter, the work dir, i.e. the repository checkout, the one writable host path, at its
host path; rlimits, a pids cgroup as root, a wall timeout that kills everything the command
started, capped output). A command is a ``/bin/sh -c`` line: the sandboxed interpreter
``exec``s the shell, so the shell and everything it starts inherit that isolation. ``python`` on the command's ``PATH`` is this
interpreter (the same one the hidden tests use).

Hidden tests (``HiddenTests``, a row's ``reward_model.ground_truth``)::

    {"test_files": [{"path": "test_hidden.py", "content": "..."}], "test_command": "python test_hidden.py"}

The files are written into the work dir just before the command runs and removed afterwards
(the model never sees them). They pass when the command exits 0 and, if a test file contains
``PASS_MARKER``, when a line of the command's stdout equals the random token that replaced the
marker for this run: a solution that ends the process early with ``sys.exit(0)`` fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Optional

from verl_agentic.isolation import SandboxLimits, SandboxResult, run_python, run_python_sync

FileSet = dict  # relative POSIX path -> text content

PASS_MARKER = "__VA_PASS_MARKER__"
SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
MAX_SNAPSHOT_FILES = 10_000


class PathError(ValueError):
    """A path the sandbox refuses: ``type`` is ``bad_path`` or ``path_outside_sandbox``."""

    def __init__(self, type: str, message: str):
        super().__init__(message)
        self.type = type
        self.message = message


# --- paths and file sets -----------------------------------------------------------------------
def check_relative(path: Any) -> PurePosixPath:
    """A relative path that stays inside its root by construction (no ``..``, not absolute)."""
    if not isinstance(path, str) or not path.strip():
        raise PathError("bad_path", f"path must be a non-empty string, got {path!r:.80}")
    if "\x00" in path:
        raise PathError("bad_path", "path contains a NUL byte")
    p = PurePosixPath(path)
    if p.is_absolute() or path.startswith("~"):
        raise PathError("path_outside_sandbox", f"{path!r} is absolute: paths are relative to the repository root")
    if ".." in p.parts:
        raise PathError("path_outside_sandbox", f"{path!r} contains '..': paths must stay inside the repository")
    return p


def resolve_inside(root: Path, path: str) -> Path:
    """``root / path`` with symlinks resolved; ``PathError`` unless it is ``root`` or below it.

    Resolving catches a symlink (made by a command in the sandbox) that points outside. The
    service holds the sandbox's lock while it uses the result, and no process of the sandbox
    outlives its command, so nothing can swap a directory for a link in between.
    """
    rel = check_relative(path)
    base = root.resolve()
    target = (base / rel).resolve()
    if target != base and base not in target.parents:
        raise PathError("path_outside_sandbox", f"{path!r} resolves outside the repository (through a symlink)")
    return target


def file_set(value: Any, where: str = "files") -> FileSet:
    """``{path: text}`` from that dict or from a row's list ``[{"path", "content"}]``; ValueError naming the entry."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for i, entry in enumerate(value):
            if not isinstance(entry, dict) or set(entry) != {"path", "content"}:
                raise ValueError(f"{where}[{i}] must be an object with exactly 'path' and 'content'")
            items.append((entry["path"], entry["content"]))
    else:
        raise ValueError(f"{where} must be a list of {{path, content}} objects or a {{path: content}} object, "
                         f"got {type(value).__name__}")
    out: FileSet = {}
    for path, content in items:
        try:
            norm = str(check_relative(path))
        except PathError as e:
            raise ValueError(f"{where}: {e.message}") from None
        if not isinstance(content, str):
            raise ValueError(f"{where}: content of {path!r} must be a string, got {type(content).__name__}")
        if norm in out:
            raise ValueError(f"{where}: {path!r} is given twice")
        out[norm] = content
    return out


def file_list(files: FileSet) -> list[dict]:
    """The row form of a file set: ``[{"path", "content"}]`` sorted by path (parquet-friendly)."""
    return [{"path": p, "content": files[p]} for p in sorted(files)]


def files_digest(files: FileSet) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def files_bytes(files: FileSet) -> int:
    return sum(len(p.encode()) + len(c.encode()) for p, c in files.items())


def write_files(root: Path, files: FileSet) -> None:
    """Write text files below ``root`` (parents created); ``PathError`` for a path that escapes."""
    for path, content in files.items():
        target = resolve_inside(root, path)
        if target == root.resolve():
            raise PathError("bad_path", f"{path!r} is the repository root, not a file")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            raise PathError("bad_path", f"{path!r} is a directory")
        target.write_text(content, encoding="utf-8")


def snapshot(root: Path, max_file_bytes: int) -> tuple[FileSet, list[str]]:
    """The text files below ``root`` and the paths left out (symlinks, non-UTF-8, too large, too many).

    Cache directories (``SKIP_DIRS``) are not part of a repository's state and are ignored.
    """
    files: FileSet = {}
    skipped: list[str] = []
    base = root.resolve()
    for dirpath, dirnames, filenames in os.walk(base):
        links = [d for d in dirnames if (Path(dirpath) / d).is_symlink()]  # never followed
        skipped += [(Path(dirpath) / d).relative_to(base).as_posix() for d in links]
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and d not in links)
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(base).as_posix()
            if full.is_symlink() or not full.is_file():
                skipped.append(rel)
                continue
            if len(files) >= MAX_SNAPSHOT_FILES or full.stat().st_size > max_file_bytes:
                skipped.append(rel)
                continue
            try:
                files[rel] = full.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                skipped.append(rel)
    return files, skipped


@dataclass
class Changes:
    """A submission: files added or modified (their final text), deleted paths, and paths left out."""

    files: FileSet = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def between(cls, original: FileSet, current: FileSet, skipped: Optional[list[str]] = None) -> "Changes":
        return cls(files={p: c for p, c in sorted(current.items()) if original.get(p) != c},
                   deleted=sorted(p for p in original if p not in current and p not in (skipped or [])),
                   skipped=sorted(skipped or []))

    def apply(self, base: FileSet) -> FileSet:
        out = {p: c for p, c in base.items() if p not in self.deleted}
        out.update(self.files)
        return out

    def as_dict(self) -> dict:
        return {"files": file_list(self.files), "deleted": list(self.deleted), "skipped": list(self.skipped)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "changes") -> "Changes":
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be an object with 'files' and 'deleted', got {type(d).__name__}")
        deleted = d.get("deleted") or []
        if not isinstance(deleted, list) or not all(isinstance(p, str) for p in deleted):
            raise ValueError(f"{where}.deleted must be a list of paths")
        return cls(file_set(d.get("files") or [], f"{where}.files"), [str(check_relative(p)) for p in deleted],
                   list(d.get("skipped") or []))


# --- commands ----------------------------------------------------------------------------------
def command_code(command: str) -> str:
    """The Python source that replaces the sandboxed interpreter with ``/bin/sh -c command``."""
    return f"import os\nos.execv('/bin/sh', ['sh', '-c', {command!r}])\n"


def command_env() -> dict:
    """Environment additions for commands: this interpreter first on PATH, no bytecode files."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


async def run_command(workdir: Path, command: str, limits: SandboxLimits) -> SandboxResult:
    """Run a shell command in ``workdir`` under the Python sandbox's isolation (see the module docstring)."""
    return await run_python(command_code(command), limits=limits, workdir=workdir, env=command_env())


def result_dict(res: SandboxResult) -> dict:
    """A ``SandboxResult`` as JSON (the service's answer to a command)."""
    return asdict(res)


def result_from_dict(d: dict) -> SandboxResult:
    names = SandboxResult.__dataclass_fields__
    return SandboxResult(**{k: v for k, v in d.items() if k in names})


# --- hidden tests ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HiddenTests:
    """Test files written just before ``command`` runs, removed after it (see the module docstring)."""

    files: FileSet
    command: str

    @classmethod
    def from_ground_truth(cls, gt: Any, where: str = "reward_model.ground_truth") -> "HiddenTests":
        """From ``{"test_files": [...], "test_command": str}`` (or its JSON text); ValueError naming the field."""
        if isinstance(gt, str):
            try:
                gt = json.loads(gt)
            except ValueError:
                raise ValueError(f"{where} must be an object with 'test_files' and 'test_command' "
                                 f"(or its JSON text), got the string {gt[:60]!r}") from None
        if not isinstance(gt, dict) or "test_files" not in gt or "test_command" not in gt:
            raise ValueError(f"{where} must be an object with 'test_files' and 'test_command', got {str(gt)[:100]!r}")
        command = gt["test_command"]
        if not isinstance(command, str) or not command.strip():
            raise ValueError(f"{where}.test_command must be a non-empty string")
        return cls(file_set(gt["test_files"], f"{where}.test_files"), command)

    def as_dict(self) -> dict:
        return {"test_files": file_list(self.files), "test_command": self.command}


@dataclass
class HiddenTestResult:
    """Whether hidden tests passed, and how the run went."""

    passed: bool
    exit_code: Optional[int]
    error_type: Optional[str]  # SandboxResult.error_type: timeout | runtime_error | ... | sandbox_error
    timed_out: bool
    marker_ok: Optional[bool]  # None when the tests use no PASS_MARKER
    duration_s: float
    output: str  # the end of stdout + stderr, the marker replaced

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HiddenTestResult":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


_OUTPUT_TAIL = 4000


def _prepare(tests: HiddenTests) -> tuple[FileSet, Optional[str]]:
    uses_marker = any(PASS_MARKER in c for c in tests.files.values())
    marker = secrets.token_hex(16) if uses_marker else None
    return {p: c.replace(PASS_MARKER, marker) if marker else c for p, c in tests.files.items()}, marker


def _remove(workdir: Path, files: FileSet) -> None:
    for path in files:
        try:
            resolve_inside(workdir, path).unlink()
        except (OSError, PathError):
            pass


def _outcome(res: SandboxResult, marker: Optional[str]) -> HiddenTestResult:
    marker_ok = None if marker is None else marker in res.stdout.splitlines()
    output = res.stdout + ("\n[stderr]\n" + res.stderr if res.stderr else "")
    if marker:
        output = output.replace(marker, "<pass marker>")
    return HiddenTestResult(passed=res.exit_code == 0 and res.error_type is None and marker_ok is not False,
                       exit_code=res.exit_code, error_type=res.error_type, timed_out=res.timed_out,
                       marker_ok=marker_ok, duration_s=res.duration_s, output=output[-_OUTPUT_TAIL:])


async def run_hidden_tests(workdir: Path, tests: HiddenTests, limits: SandboxLimits) -> HiddenTestResult:
    """Write the test files into ``workdir``, run the command, remove the files again."""
    files, marker = _prepare(tests)
    write_files(workdir, files)
    try:
        res = await run_command(workdir, tests.command, limits)
    finally:
        _remove(workdir, files)
    return _outcome(res, marker)


def score_submission(repo: FileSet, changes: Changes, tests: HiddenTests, limits: SandboxLimits) -> HiddenTestResult:
    """(Blocking.) Build ``repo`` + ``changes`` in a fresh directory and run the hidden tests there."""
    workdir = Path(tempfile.mkdtemp(prefix="va_swedev_score_"))
    try:
        write_files(workdir, changes.apply(repo))
        files, marker = _prepare(tests)
        write_files(workdir, files)
        res = run_python_sync(command_code(tests.command), limits=limits, workdir=workdir, env=command_env())
        return _outcome(res, marker)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def limits_with_timeout(limits: SandboxLimits, timeout_s: float) -> SandboxLimits:
    """``limits`` with the wall timeout of a test run (and a CPU limit no lower than it)."""
    cpu = limits.cpu_time_s if limits.cpu_time_s is None else max(limits.cpu_time_s, int(timeout_s) + 1)
    return replace(limits, wall_timeout_s=timeout_s, cpu_time_s=cpu)

