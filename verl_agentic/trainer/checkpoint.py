"""Trainer checkpoints: everything needed to continue a run exactly.

A checkpoint is a folder ``output.dir/checkpoints/step_XXXXXX/`` holding ``state.pt`` (model,
value head, optimizer, LR schedule, KL controller, RNG states, data position, step);
``latest_checkpoint`` finds the newest one. Writing one is atomic and durable::

    1. .tmp_step_N/state.pt written, the file and the folder fsynced
    2. an existing step_N (the same step written again) renamed aside to .old_step_N
    3. .tmp_step_N renamed to step_N, checkpoints/ fsynced
    4. .old_step_N removed, older checkpoints pruned (each renamed to .trash_* first, then removed)

A kill at any point leaves step N's checkpoint loadable, or (before 3) the earlier ones as they were:
between 2 and 3 ``.old_step_N`` is step N's complete checkpoint, and ``checkpoint_dirs`` reads it as
step N's while no ``step_N`` exists (the next save puts it back, and removes ``.tmp_*`` and ``.trash_*``
leftovers). A partial ``.tmp_*`` is never read. After ``save_checkpoint`` returns, the checkpoint survives
a power loss on file systems that honour ``fsync`` for files and folders (ext4, xfs).

A *transient* checkpoint (the trainer's crash-safety copy of the last step boundary, written as each step
begins) is removed once a newer checkpoint exists, and does not count in ``max_to_keep``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

_STEP_DIR = re.compile(r"^(\.old_)?step_(\d{6,})$")
TRANSIENT = "transient"  # a marker file in a transient checkpoint's folder


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_dirs(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the complete checkpoints under ``root``, oldest first: each ``step_N`` with its
    ``state.pt``, and an ``.old_step_N`` (a replace interrupted between its two renames) where no ``step_N``
    is complete."""
    base = Path(root)
    if not base.is_dir():
        return []
    found: dict[int, Path] = {}
    for d in sorted(base.iterdir(), key=lambda p: p.name.startswith(".old_")):  # step_N first
        m = _STEP_DIR.match(d.name)
        if m and (d / "state.pt").is_file():
            found.setdefault(int(m.group(2)), d)
    return sorted(found.items())


def latest_checkpoint(root: str | os.PathLike[str]) -> Optional[Path]:
    found = checkpoint_dirs(root)
    return found[-1][1] if found else None


def save_checkpoint(root: str | os.PathLike[str], step: int, state: dict[str, Any], max_to_keep: int = 2,
                    transient: bool = False) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (the steps in the module docstring); keep the newest
    ``max_to_keep`` checkpoints that are not transient. A save that fails (a full disk) or is interrupted
    removes its partial folder and leaves the others as they were."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    tidy(base)
    final = base / f"step_{step:06d}"
    tmp = base / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_state(tmp, state, final)
        if transient:
            (tmp / TRANSIENT).touch()
        _fsync(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = base / f".old_{final.name}"
    if final.exists():
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    os.rename(tmp, final)
    _fsync(base)
    shutil.rmtree(aside, ignore_errors=True)
    _prune(base, max_to_keep)
    return final


def keep(folder: str | os.PathLike[str]) -> None:
    """Make a transient checkpoint an ordinary one (it stays when newer ones are written)."""
    Path(folder, TRANSIENT).unlink(missing_ok=True)


def load_checkpoint(folder: str | os.PathLike[str]) -> dict[str, Any]:
    # RNG states and optimizer state hold numpy/python objects: not a weights-only file.
    return torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False)


def _write_state(tmp: Path, state: dict[str, Any], final: Path) -> None:
    try:
        # a file object: a full disk raises the OSError of the write (a path gives only a RuntimeError);
        # torch's zip writer may raise a RuntimeError while closing after it, which keeps it as __context__
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        # torch's zip writer, closing after a failed write, raises a RuntimeError of its own: what stopped the
        # write is in the chain. A stop (a signal handler's KeyboardInterrupt) stays a stop; a failed write
        # is an OSError naming the checkpoint
        cause: Optional[BaseException] = e
        while cause is not None and not isinstance(cause, (OSError, KeyboardInterrupt)):
            cause = cause.__context__
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt(*cause.args) from e
        if isinstance(cause, OSError):
            raise OSError(cause.errno, f"cannot write the checkpoint {final}: {cause.strerror}") from e
        raise


def _fsync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tidy(root: str | os.PathLike[str]) -> None:
    """What an interrupted save or prune left: ``.tmp_*`` and ``.trash_*`` removed, an ``.old_step_N``
    whose ``step_N`` is missing put back, one whose ``step_N`` exists removed."""
    base = Path(root)
    if not base.is_dir():
        return
    for d in base.iterdir():
        if d.name.startswith((".tmp_", ".trash_")):
            shutil.rmtree(d, ignore_errors=True)
        elif d.name.startswith(".old_step_"):
            final = base / d.name[len(".old_"):]
            if (final / "state.pt").is_file():
                shutil.rmtree(d, ignore_errors=True)
            else:
                shutil.rmtree(final, ignore_errors=True)
                os.rename(d, final)


def _prune(base: Path, max_to_keep: int) -> None:
    found = checkpoint_dirs(base)
    transient = [d for _, d in found[:-1] if (d / TRANSIENT).exists()]
    kept = [d for _, d in found if not (d / TRANSIENT).exists()]
    old = transient + (kept[:-max_to_keep] if max_to_keep > 0 else [])
    for d in old:
        trash = base / f".trash_{d.name}"
        os.rename(d, trash)
        shutil.rmtree(trash, ignore_errors=True)
