"""Where a result comes from: the commit of the checkout, and whether it was clean.

A runner that writes committed results (examples/learning_run/seeds.py, the comparisons in bench/)
calls :func:`source_state` first: on a tree with modified or untracked source files it stops with one
line naming them, unless ``allow_dirty`` (then the files are recorded with the result, marking it).
Files under ``outputs/`` and the results the runner itself writes are not source and do not count.
:func:`run_recorded` runs one command of a series and writes its ``run_info.json`` beside its outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
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


def run_recorded(cmd: list[str], out: Path, state: dict, cwd: Path = REPO, **fields) -> dict:
    """Run ``cmd`` (in ``cwd``, this environment) and write ``out/run_info.json``: ``fields``, the source
    ``state``, the command, its exit status, the wall clock and the peak resident memory of the command's
    process and the children it waited for. A failed command is recorded, not raised: a series goes on."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)  # this command's own resource use
    proc.returncode = os.waitstatus_to_exitcode(status)
    info = {**fields, **state, "command": " ".join(cmd), "exit_status": proc.returncode,
            "wall_s": round(time.time() - start, 1),
            # Linux: kB; it counts the pages the fork inherited from the runner, a small process
            "max_rss_gb": round(usage.ru_maxrss / 2**20, 2)}
    (out / "run_info.json").write_text(json.dumps(info, indent=1))
    return info
