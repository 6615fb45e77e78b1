"""Trainer checkpoints: everything needed to continue a run exactly.

A checkpoint is a folder ``output.dir/checkpoints/step_XXXXXX/`` holding ``state.pt`` (model,
value head, optimizer, LR schedule, KL controller, RNG states, data position, step) and is
written to a temporary name first, then renamed, so an interrupted save never leaves a
half checkpoint that ``resume`` would pick up. ``latest_checkpoint`` finds the newest one.
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

_STEP_DIR = re.compile(r"^step_(\d{6,})$")


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_dirs(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the complete checkpoints under ``root``, oldest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for d in base.iterdir():
        m = _STEP_DIR.match(d.name)
        if m and (d / "state.pt").is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike[str]) -> Optional[Path]:
    found = checkpoint_dirs(root)
    return found[-1][1] if found else None


def save_checkpoint(root: str | os.PathLike[str], step: int, state: dict[str, Any], max_to_keep: int = 2) -> Path:
    """Write ``state`` as the checkpoint of ``step``; keep only the newest ``max_to_keep``. A save that
    fails (a full disk) or is interrupted removes its partial folder and leaves the others as they were."""
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"step_{step:06d}"
    tmp = base / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        # a file object: a full disk raises the OSError of the write (a path gives only a RuntimeError);
        # torch's zip writer may raise a RuntimeError while closing after it, which keeps it as __context__
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        cause: Optional[BaseException] = e
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__context__
        if isinstance(cause, OSError):
            raise OSError(cause.errno, f"cannot write the checkpoint {final}: {cause.strerror}") from e
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if max_to_keep > 0:
        for _, old in checkpoint_dirs(base)[:-max_to_keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(folder: str | os.PathLike[str]) -> dict[str, Any]:
    # RNG states and optimizer state hold numpy/python objects: not a weights-only file.
    return torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False)
