"""A monitor: a name, a statistic over the run's step summaries, a threshold, a message.

``MonitorSet`` feeds each step's summary (``monitors.summary``) to every monitor and reports:

- ``monitor/<name>``: the statistic at this step (absent when the run cannot give it);
- ``monitor/<name>/firing``: 1.0 while the statistic is past its threshold, else 0.0;
- a :class:`Firing` (and its one-line warning) when a monitor starts firing; a monitor that stays
  past its threshold does not warn again until it has come back.

Monitors only read. Training changes only when the user asks for the stop rule
(``stop_on``: the monitor names whose firing ends training after that step, or ``[all]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError


@dataclass(frozen=True)
class MonitorsConfig:
    """``trainer.monitors`` in main_ppo, ``+agentic.monitors`` in verl's trainer."""

    enabled: bool = True
    thresholds: dict = field(default_factory=dict)  # {monitor name: threshold or None (the default)}
    stop_on: list = field(default_factory=list)  # monitor names (or "all") whose firing stops training
    baseline_steps: int = 3  # the steps a relative statistic (entropy, length) is compared with

    def __post_init__(self) -> None:
        if self.baseline_steps < 1:
            raise ConfigError(f"monitors.baseline_steps must be >= 1, got {self.baseline_steps}")
        # null means the default, as leaving the name out does: the YAML's nulls build the API's default
        object.__setattr__(self, "thresholds", {k: v for k, v in self.thresholds.items() if v is not None})
        for name, value in self.thresholds.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(f"monitors.thresholds.{name} must be a number, got {value!r}")


@dataclass
class Firing:
    monitor: str
    step: int
    value: float
    threshold: float
    message: str

    def line(self) -> str:
        """The one-line warning."""
        return f"monitor {self.monitor} fired at step {self.step}: {self.message}"


class Monitor:
    """Subclasses set ``name``, ``threshold``, ``direction`` (``"above"``: fires at value >= threshold;
    ``"below"``: value <= threshold) and implement ``statistic`` and ``message``."""

    name: str = ""
    threshold: float = 0.0
    direction: str = "above"
    what: str = ""  # one line for the docs and the inspector

    def __init__(self, threshold: Optional[float] = None, baseline_steps: int = 3):
        if threshold is not None:
            self.threshold = float(threshold)
        self.baseline_steps = baseline_steps

    def statistic(self, history: list[dict]) -> Optional[float]:
        """The statistic at the last step of ``history`` (the summaries so far, oldest first), or
        None when this step does not give it."""
        raise NotImplementedError

    def message(self, value: float, summary: dict) -> str:
        raise NotImplementedError

    def past(self, value: float) -> bool:
        return value >= self.threshold if self.direction == "above" else value <= self.threshold

    # helpers for statistics relative to the run's start
    def baseline(self, history: list[dict], key: str) -> Optional[float]:
        """The mean of ``key`` over its first ``baseline_steps`` values in the run; None until there
        are that many and at least one more after them (a step is never compared with itself)."""
        values = [h[key] for h in history if h.get(key) is not None]
        if len(values) <= self.baseline_steps:
            return None
        return sum(values[:self.baseline_steps]) / self.baseline_steps

    def relative_to_start(self, history: list[dict], key: str) -> Optional[float]:
        """``key`` at the last step over its :meth:`baseline` (None without either, or a baseline <= 0)."""
        base, now = self.baseline(history, key), history[-1].get(key)
        return None if base is None or now is None or base <= 0 else now / base


class MonitorSet:
    """The monitors of one run, fed one step summary at a time (see the module docstring)."""

    def __init__(self, monitors: list[Monitor], config: Optional[MonitorsConfig] = None):
        self.config = config or MonitorsConfig()
        self.monitors = monitors
        names = [m.name for m in monitors]
        for key in list(self.config.thresholds) + [n for n in self.config.stop_on if n != "all"]:
            if key not in names:
                raise ConfigError(f"monitors: unknown monitor {key!r}; known: {names}")
        self.history: list[dict] = []
        self.values: dict[str, Optional[float]] = {}
        self.firing: dict[str, bool] = {m.name: False for m in monitors}
        self.first_fired: dict[str, int] = {}
        self.seen: set[str] = set()  # monitors that had a statistic at some step
        self.stop: Optional[Firing] = None

    def observe(self, step: int, summary: dict) -> list[Firing]:
        """Add step ``step``'s summary; the monitors that started firing at it."""
        self.history.append({**summary, "step": step})
        fired: list[Firing] = []
        self.values = {}
        for m in self.monitors:
            value = m.statistic(self.history)
            self.values[m.name] = value
            if value is None:
                continue  # no verdict this step: a monitor that was firing keeps its state
            self.seen.add(m.name)
            now = m.past(value)
            if now and not self.firing[m.name]:
                f = Firing(m.name, step, value, m.threshold, m.message(value, self.history[-1]))
                fired.append(f)
                self.first_fired.setdefault(m.name, step)
                if self.stop is None and ("all" in self.config.stop_on or m.name in self.config.stop_on):
                    self.stop = f
            self.firing[m.name] = now
        return fired

    def metrics(self) -> dict[str, float]:
        """``monitor/<name>`` and ``monitor/<name>/firing`` of the last observed step."""
        out: dict[str, float] = {}
        for name, value in self.values.items():
            if value is None:
                continue
            out[f"monitor/{name}"] = float(value)
            out[f"monitor/{name}/firing"] = float(self.firing[name])
        return out

    def thresholds(self) -> dict[str, Any]:
        return {m.name: {"threshold": m.threshold, "direction": m.direction, "what": m.what} for m in self.monitors}
