"""JSON lines, read and written one way everywhere (datasets, corpora, trajectories, metrics).

Blank lines are skipped; a line that is not JSON, or not a JSON object, is an error (``ConfigError``
or the subclass the caller names) that says the file and the line::

    data/train.jsonl: line 7 is not valid JSON (Expecting ',' delimiter)
    runs/metrics.jsonl: line 2: expected a JSON object (a step's metrics), got list
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterable, Iterator, Optional

from verl_agentic.interfaces import ConfigError


def iter_json_lines(lines: Iterable[str], where: str, *, what: str = "",
                    error: type[ConfigError] = ConfigError) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of ``lines`` (an open file); ``where`` names
    the file in errors, ``what`` what each line should be."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: line {n} is not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise error(f"{where}: line {n}: expected a JSON object{f' ({what})' if what else ''}, "
                        f"got {type(obj).__name__}")
        yield n, obj


def read_json_lines(path: str | Path, *, what: str = "", limit: Optional[int] = None,
                    error: type[ConfigError] = ConfigError) -> list[dict]:
    """The objects of a ``.jsonl`` file (the first ``limit`` of them, if given)."""
    with open(path, encoding="utf-8") as f:
        return [obj for _, obj in itertools.islice(iter_json_lines(f, str(path), what=what, error=error), limit)]


def write_json_lines(path: str | Path, records: Iterable[dict]) -> int:
    """Write ``records`` one JSON object a line (UTF-8, not ASCII-escaped); returns how many."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


__all__ = ["iter_json_lines", "read_json_lines", "write_json_lines"]
