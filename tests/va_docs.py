"""The code blocks of a Markdown page that tests run, so the page and the tests cannot drift apart.

A fenced block right after ``<!-- file: NAME -->`` is a file to write (``NAME``); one right after
``<!-- run: LABEL -->`` is a command (``LABEL`` names it). ``README.md`` and ``docs/migrating.md`` mark theirs.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

_BLOCK = re.compile(r"<!-- (file|run): ([^>]+?) -->\s*\n```[^\n]*\n(.*?)\n```", re.S)


def marked_blocks(page: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(files: name -> text, commands: label -> text) of ``page``."""
    files, runs = {}, {}
    for kind, name, body in _BLOCK.findall(page.read_text()):
        (files if kind == "file" else runs)[name.strip()] = body + "\n"
    return files, runs


def command_argv(command: str) -> list[str]:
    """A ``python ...`` command of a page (continuation lines joined, comments dropped) as argv with this
    interpreter in place of ``python``."""
    lines = [line.split(" #", 1)[0].rstrip() for line in command.splitlines()]
    argv = shlex.split(" ".join(line.rstrip("\\").strip() for line in lines if line.strip()))
    assert argv[0] == "python", f"not a python command: {command!r}"
    return [sys.executable, *argv[1:]]


def write_files(files: dict[str, str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
