"""JSON lines, read and written one way everywhere (datasets, corpora, trajectories, metrics).

Blank lines are skipped; a line that is not JSON, or not a JSON object, is an error (``ConfigError``
or the subclass the caller names) that says the file and the line::

    data/train.jsonl: line 7 is not valid JSON (Expecting ',' delimiter)
    runs/metrics.jsonl: line 2: expected a JSON object (a step's metrics), got list

Files that grow while a run goes (a rollout's ``trajectories.jsonl``) are written by
``JsonLinesAppender``, one whole line per ``os.write``, unbuffered: a process killed at any point
leaves at most a torn last line, which ``read_complete_json_lines`` drops (and cuts off the file).
A write that fails (a full disk) is cut back off too, so the file still ends on a whole line, and
raises ``AppendError`` naming the file.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from verl_agentic.interfaces import ConfigError


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
                    error: type[ConfigError] = ConfigError) -> list[dict]:
    """The objects of a ``.jsonl`` file (the first ``limit`` of them, if given)."""
    with open(path, encoding="utf-8") as f:
        return [obj for _, obj in itertools.islice(iter_json_lines(f, str(path), what=what, error=error), limit)]


def read_complete_json_lines(path: str | Path, *, what: str = "",
                             error: type[ConfigError] = ConfigError) -> tuple[list[dict], int]:
    """The objects of a file written by ``JsonLinesAppender`` (none if it does not exist), and how many
    bytes of a torn last line (no newline: the writer was killed during a write) were cut off the file.
    A bad line anywhere else is the usual error: that is damage, not an interrupted write."""
    p = Path(path)
    if not p.exists():
        return [], 0
    data = p.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(p, "r+b") as f:
            f.truncate(keep)
    text = data[:keep].decode("utf-8", errors="replace")
    return [obj for _, obj in iter_json_lines(text.splitlines(), str(p), what=what, error=error)], len(data) - keep


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
    ``append`` returns. See the module docstring for what a kill or a full disk leaves."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict) -> None:
        data = memoryview((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        size = os.fstat(self._fd).st_size
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as e:
            try:
                os.ftruncate(self._fd, size)  # the part written; cutting it needs no space
            except OSError:
                pass
            raise AppendError(e.errno, f"cannot append to {self.path}: {e.strerror}; its earlier lines are intact") from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "JsonLinesAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AppendError", "JsonLinesAppender", "iter_json_lines", "read_complete_json_lines", "read_json_lines",
           "write_json_lines"]
