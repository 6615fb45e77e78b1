"""Reward-hacking and collapse monitors: consumers of each training step's batch summary.

Both trainers build the summary the same way (``summary.py``) and feed it to a ``MonitorSet``
(``base.py``) of the built-in monitors (``builtin.py``)::

    monitors = make_monitors(MonitorsConfig())
    for step ...:
        summary = merge(batch_summary(trajectories, rewards), from_metrics(step_metrics))
        for firing in monitors.observe(step, summary):
            print(firing.line())                 # one line when a monitor starts firing
        step_metrics.update(monitors.metrics())  # monitor/<name>, monitor/<name>/firing

They never change training, except through the stop rule the user asks for (``stop_on``).
"""

from verl_agentic.monitors.base import Firing, Monitor, MonitorsConfig, MonitorSet
from verl_agentic.monitors.builtin import BUILTIN
from verl_agentic.monitors.summary import (
    answer_key,
    batch_summary,
    from_metrics,
    heldout_summary,
    merge,
    numeric,
)


def make_monitors(config: MonitorsConfig | None = None) -> MonitorSet:
    """The built-in monitors with ``config``'s thresholds (an unknown name is a ``ConfigError``)."""
    config = config or MonitorsConfig()
    return MonitorSet([cls(config.thresholds.get(cls.name), config.baseline_steps) for cls in BUILTIN], config)


__all__ = ["BUILTIN", "Firing", "Monitor", "MonitorSet", "MonitorsConfig", "answer_key", "batch_summary",
           "from_metrics", "heldout_summary", "make_monitors", "merge", "numeric"]
