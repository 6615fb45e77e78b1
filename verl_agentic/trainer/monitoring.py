"""The monitors in the trainer (``trainer.monitors``): each step's batch summary in, warnings and
``monitor/*`` metrics out, and the stop rule (``stop_on``) for ``fit``.

The monitors themselves are ``verl_agentic.monitors``; this is how the recipe feeds them. They only
read: a failure of their own code is reported once and turns them off, and training goes on.
"""

from __future__ import annotations

import sys
from typing import Optional

from verl_agentic.monitors import (
    Firing,
    MonitorSet,
    MonitorsConfig,
    batch_summary,
    from_metrics,
    heldout_summary,
    make_monitors,
    merge,
    numeric,
)


class StepMonitors:
    """``active``: the monitors (None when ``trainer.monitors.enabled=false``, or after they failed)."""

    def __init__(self, config: MonitorsConfig, enabled: bool) -> None:
        self.active: Optional[MonitorSet] = make_monitors(config) if enabled else None

    @property
    def stop(self) -> Optional[Firing]:
        """The firing that the stop rule ends training on (None: go on)."""
        return self.active.stop if self.active is not None else None

    def observe(self, step: int, metrics: dict[str, float], trajs: list[dict], rewards: Optional[list] = None,
                heldout: Optional[list[dict]] = None) -> None:
        """Feed step ``step``'s batch summary (its episodes, the validation's ``heldout`` episodes if it
        ran, and what ``metrics`` add: entropy, KL, held-out accuracy) to the monitors; the summary and
        their values go into ``metrics``, a monitor that starts firing prints one line."""
        if self.active is None:
            return
        try:
            summary = merge(batch_summary(trajs, rewards) if trajs else {}, heldout_summary(heldout or []))
            metrics.update(numeric(summary))
            for f in self.active.observe(step, merge(summary, from_metrics(metrics))):
                print(f"[verl-agentic] WARNING {f.line()}", file=sys.stderr)
            metrics.update(self.active.metrics())
        except Exception as e:  # noqa: BLE001 - monitors only read; training goes on without them
            print(f"[verl-agentic] WARNING the monitors failed at step {step} and are off for this run: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
            self.active = None

    def replay(self, rows: list[dict]) -> None:
        """A resumed run: the monitors' history from the logged metrics of the steps kept (each row a
        ``metrics.jsonl`` line); a stop rule that fired before the checkpoint does not stop it again."""
        if self.active is None:
            return
        for row in rows:
            self.active.observe(row["step"], from_metrics(row))
        self.active.stop = None
