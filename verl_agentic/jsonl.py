"""JSON lines, read and written one way everywhere (datasets, corpora, trajectories, metrics).

Blank lines are skipped; a line that is not JSON, or not a JSON object, is an error (``ConfigError``
or the subclass the caller names) that says the file and the line::

    data/train.jsonl: line 7 is not valid JSON (Expecting ',' delimiter)
    runs/metrics.jsonl: line 2: expected a JSON object (a step's metrics), got list

Files that grow while a run goes (a rollout's ``trajectories.jsonl``, verl's per-step dumps that several
processes append to) are written by ``JsonLinesAppender`` / ``append_json_line``: each line whole, under
an exclusive ``flock`` of the file, unbuffered. Every live writer holds the lock while it writes, so a
file that does not end on a newline when a writer takes the lock was torn by a process that died in
the middle of a write (Linux may stop a large write at a page boundary when the process is killed):
the writer cuts that torn tail off before it appends, and logs it with the file and the bytes dropped,
so the next line never joins a fragment. ``read_complete_json_lines`` does the same for a resume.
A write that fails (a full disk) is cut back off too, so the file still ends on a whole line, and
raises ``AppendError`` naming the file. Readers of dumps (``skip_torn=True``: the inspector, replay,
reward comparison) report a damaged line with its file and line number and go on.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from verl_agentic.interfaces import ConfigError

logger = logging.getLogger(__name__)


class AppendError(OSError):
    """A line could not be appended (no space left, file too large, ...); the file keeps its earlier
    lines whole. ``errno`` is the failed write's."""


def iter_json_lines(lines: Iterable[str], where: str, *, what: str = "",
                    error: type[ConfigError] = ConfigError,
                    on_bad: Optional[Callable[[int, str, str], None]] = None) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of ``lines`` (an open file); ``where`` names
    the file in errors, ``what`` what each line should be. ``on_bad(line number, line, reason)``,
    when given, receives the lines that are not JSON objects instead of an error being raised."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            reason = f"{where}: line {n} is not valid JSON ({e.msg})"
        else:
            if isinstance(obj, dict):
                yield n, obj
                continue
            reason = f"{where}: line {n}: expected a JSON object{f' ({what})' if what else ''}, got {type(obj).__name__}"
        if on_bad is None:
            raise error(reason)
        on_bad(n, line.rstrip("\n"), reason)


def read_json_lines(path: str | Path, *, what: str = "", limit: Optional[int] = None,
                    error: type[ConfigError] = ConfigError, skip_torn: bool = False) -> list[dict]:
    """The objects of a ``.jsonl`` file (the first ``limit`` of them, if given). ``skip_torn``: a line
    that is not valid JSON (left by a writer that died mid-line) is logged with the file and line
    number and skipped, instead of being an error; a valid line that is not an object still is one."""
    on_bad = None
    if skip_torn:
        def on_bad(n: int, line: str, reason: str) -> None:
            if "is not valid JSON" not in reason:
                raise error(reason)
            logger.warning("%s: skipped (%d characters; a torn line: its writer died in the middle of it)",
                           reason, len(line))
    with open(path, encoding="utf-8", errors="replace" if skip_torn else "strict") as f:
        rows = iter_json_lines(f, str(path), what=what, error=error, on_bad=on_bad)
        return [obj for _, obj in itertools.islice(rows, limit)]


def _cut_torn_tail(fd: int, path: Path) -> int:
    """With the file's lock held: cut a last line that has no newline (no live writer leaves one) and
    return how many bytes were dropped."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return 0
    end, keep = size, 0
    while end > 0:  # the last newline, reading backwards in blocks
        start = max(0, end - 65536)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            keep = start + found + 1
            break
        end = start
    os.ftruncate(fd, keep)
    logger.warning("%s: dropped a torn last line (%d bytes, no newline: a writer died in the middle of it) "
                   "before appending", path, size - keep)
    return size - keep


def read_complete_json_lines(path: str | Path, *, what: str = "",
                             error: type[ConfigError] = ConfigError) -> tuple[list[dict], int]:
    """The objects of a file written by ``JsonLinesAppender`` (none if it does not exist), and how many
    bytes of a torn last line (no newline: the writer was killed during a write) were cut off the file
    (under the writers' lock, so a live writer's line is never cut). A bad line anywhere else is the
    usual error: that is damage, not an interrupted write."""
    p = Path(path)
    if not p.exists():
        return [], 0
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        torn = _cut_torn_tail(fd, p)
        size = os.fstat(fd).st_size
        data = os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)  # releases the lock
    text = data.decode("utf-8", errors="replace")
    return [obj for _, obj in iter_json_lines(text.splitlines(), str(p), what=what, error=error)], torn


def write_json_lines(path: str | Path, records: Iterable[dict], *, atomic: bool = False) -> int:
    """Write ``records`` one JSON object a line (UTF-8, not ASCII-escaped); returns how many.
    ``atomic``: write a temporary file beside it and rename it over ``path`` only once complete, so
    ``path`` holds the old content or the new one, never a part."""
    target = Path(path)
    out = target.with_name(f".{target.name}.tmp") if atomic else target
    n = 0
    try:
        with open(out, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
                n += 1
        if atomic:
            os.replace(out, target)
    except BaseException as e:
        if atomic:
            out.unlink(missing_ok=True)
        if isinstance(e, OSError) and not e.filename:  # a failed write names no file: say which
            raise OSError(e.errno, f"cannot write {target}: {e.strerror}") from e
        raise
    return n


class JsonLinesAppender:
    """Appends JSON objects to ``path`` as whole lines, each on disk (in the OS's cache) when
    ``append`` returns; any number of appenders, in any processes, may share the file. See the module
    docstring for what a kill or a full disk leaves. ``torn_bytes``: what this appender cut off."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: Optional[int] = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self.torn_bytes = 0

    def append(self, record: dict) -> None:
        self.append_bytes((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))

    def append_bytes(self, line: bytes) -> None:
        """Append one line (it ends with its newline) under the file's lock."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the appender is closed")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self.torn_bytes += _cut_torn_tail(self._fd, self.path)
            size = os.fstat(self._fd).st_size
            data = memoryview(line)
            try:
                while data:
                    data = data[os.write(self._fd, data):]
            except OSError as e:
                try:
                    os.ftruncate(self._fd, size)  # the part written; cutting it needs no space
                except OSError:
                    logger.warning("%s: could not cut back a failed write; the next append drops it", self.path)
                raise AppendError(e.errno, f"cannot append to {self.path}: {e.strerror}; its earlier lines "
                                           f"are intact") from e
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "JsonLinesAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_json_line(path: str | Path, record: dict) -> None:
    """Append one object to ``path`` as a whole line (open, lock, append, close): for files that many
    short-lived writers share, such as verl's per-step dumps."""
    with JsonLinesAppender(path) as out:
        out.append(record)


__all__ = ["AppendError", "JsonLinesAppender", "append_json_line", "iter_json_lines", "read_complete_json_lines", "read_json_lines",
           "write_json_lines"]
