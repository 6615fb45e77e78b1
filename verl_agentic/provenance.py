"""Where a result comes from: the commit of the checkout, and whether it was clean.

A runner that writes committed results (examples/learning_run/seeds.py, the comparisons in bench/)
calls :func:`source_state` first: on a tree with modified or untracked source files it stops with one
line naming them, unless ``allow_dirty`` (then the files are recorded with the result, marking it).
Files under ``outputs/`` and the results the runner itself writes are not source and do not count.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parent.parent


class DirtyTree(RuntimeError):
    """The checkout has changes a result would not be reproducible from."""


def source_state(allow_dirty: bool = False, ignore: Iterable[str] = ("outputs/",), repo: Path = REPO) -> dict:
    """``{"commit": sha, "dirty": [paths]}`` of ``repo``; raises ``DirtyTree`` naming the paths when the
    tree has changes outside ``ignore`` (path prefixes) and ``allow_dirty`` is false."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        status = git("status", "--porcelain", "--untracked-files=all")
    except (OSError, subprocess.CalledProcessError) as e:
        raise DirtyTree(f"{repo}: not a git checkout ({e}); results need the commit they came from") from None
    dirty = [line[3:] for line in status.splitlines() if line[3:] and not line[3:].startswith(tuple(ignore))]
    if dirty and not allow_dirty:
        shown = ", ".join(dirty[:8]) + (f" and {len(dirty) - 8} more" if len(dirty) > 8 else "")
        raise DirtyTree(f"the checkout has changes ({shown}): commit them first, or pass --allow-dirty to mark "
                        f"the results as made from a modified tree")
    return {"commit": commit, "dirty": dirty}
