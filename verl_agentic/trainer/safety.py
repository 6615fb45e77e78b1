"""Crash safety: whatever stops a run (a signal, an exception, a killed process), the last step boundary
is on disk or gets written, and ``trainer.resume=true`` continues from it exactly.

A checkpoint is exact only between two steps. ``boundary`` is the position where the current step began
(its step number, data position, RNG states, KL coefficient); the weights and the optimizer are that
boundary's until the update begins, and belong to neither step from then until the step is recorded
(``dirty``). So::

    step_recorded(position)   the new boundary; the weights are its weights again
    step_begins()             trainer.save_step_boundary: the boundary's checkpoint written (transient:
                              it gives way to the next one), unless it is on disk already
    update_begins()           dirty until the next step_recorded
    on_failure(error)         the boundary's checkpoint: on disk already, or written now when the weights
                              are its weights (else: none, said so)

A stop takes effect at once wherever it comes (``PPOTrainer.request_stop``): the step in progress is
dropped and redone on resume. With the boundary on disk from the step's start, a stop writes nothing
and a killed process (the OOM killer, SIGKILL) loses only the step it was in.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import verl_agentic.trainer.checkpoint as ckpt


class CrashSafety:
    """``weights()``: what a checkpoint holds besides the boundary (model, value head, optimizer, LR
    schedule); ``root``: ``output.dir/checkpoints``."""

    def __init__(self, root: Path, weights: Callable[[], dict[str, Any]], max_checkpoints: int,
                 save_step_boundary: bool) -> None:
        self.root, self.weights = root, weights
        self.max_checkpoints, self.save_step_boundary = max_checkpoints, save_step_boundary
        self.boundary: dict[str, Any] = {}
        self.dirty = False
        self.on_disk: Optional[int] = None  # the step whose checkpoint is on disk, when known

    @property
    def step(self) -> int:
        return int(self.boundary["step"])

    def step_recorded(self, position: dict[str, Any]) -> None:
        self.boundary = position
        self.dirty = False

    def save(self, transient: bool = False) -> Path:
        """The checkpoint of the boundary; not written again when it is on disk already (``transient``:
        removed once a newer one exists; a transient one saved again as not transient is kept)."""
        if self.on_disk == self.step:
            folder = self.root / f"step_{self.step:06d}"
            if not transient:
                ckpt.keep(folder)
            return folder
        folder = ckpt.save_checkpoint(self.root, self.step, {**self.boundary, **self.weights()},
                                      self.max_checkpoints, transient=transient)
        self.on_disk = self.step
        return folder

    def step_begins(self) -> None:
        if self.save_step_boundary:
            self.save(transient=True)

    def update_begins(self) -> None:
        self.dirty = True  # until the step is recorded: no checkpoint can be exact meanwhile

    def on_failure(self, error: BaseException) -> None:
        """``fit`` was stopped or failed: leave the boundary's checkpoint, and say where it is."""
        why = "stopped" if isinstance(error, KeyboardInterrupt) else f"failed ({type(error).__name__}: {error})"
        latest = ckpt.latest_checkpoint(self.root)
        if self.dirty and self.on_disk != self.step:
            print(f"[verl-agentic] training {why} during step {self.step + 1}'s update: the weights are "
                  f"between two steps, no checkpoint written (trainer.save_step_boundary=false); the latest "
                  f"is {latest or 'none'}", file=sys.stderr)
            return
        try:
            folder = self.save()
        except Exception as e:  # noqa: BLE001 - e.g. the disk is full; the first error is the one to report
            print(f"[verl-agentic] training {why}; writing its checkpoint failed too ({e}); the latest is "
                  f"{latest or 'none'}", file=sys.stderr)
            return
        print(f"[verl-agentic] training {why} in step {self.step + 1}: checkpoint of step {self.step} written "
              f"to {folder}", file=sys.stderr)

    def load_latest(self) -> tuple[Optional[dict[str, Any]], Optional[Path]]:
        """The newest checkpoint's state and folder (None, None: there is none), after putting in order
        what an interrupted save left; it counts as on disk."""
        ckpt.tidy(self.root)
        folder = ckpt.latest_checkpoint(self.root)
        if folder is None:
            return None, None
        state = ckpt.load_checkpoint(folder)
        self.on_disk = int(state["step"])
        return state, folder
