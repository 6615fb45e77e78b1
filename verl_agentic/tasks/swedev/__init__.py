"""swedev: the model edits a repository in a sandbox until hidden tests pass (SWE-style). The whole task
is this folder; the sandbox service it talks to is ``verl_agentic.sandbox`` (``python -m
verl_agentic.sandbox.server``), shared with the reward server:

=========== ================================================================================
``data``    rows: HumanEval problems or generic instances -> instance + hidden tests; the prompt
``tools``   the model's tools on its sandbox: view / write / edit files, run a command, run the tests
``task``    the episode: ``SwedevConfig`` (``task.swedev.*``), start / obs / end, registered as ``swedev``
``scorer``  the ``swedev`` scorer: the episode's submission against the hidden tests, rebuilt anywhere
=========== ================================================================================

Importing the package registers all of it; ``pyproject.toml`` names it in the entry-point groups
``verl_agentic.tasks`` and ``verl_agentic.scorers``.
"""

from verl_agentic.tasks.swedev.data import (
    HUMANEVAL_SOURCE,
    Instance,
    instance_from_row,
    swedev_preprocess,
    swedev_prompt,
)
from verl_agentic.tasks.swedev.scorer import INSTANCE_KEY, SUBMISSION_KEY, swedev_score
from verl_agentic.tasks.swedev.task import SWEDEV, SwedevConfig, SwedevState, swedev_end, swedev_obs, swedev_start
from verl_agentic.tasks.swedev.tools import SANDBOX_TOOLS, SandboxSession

__all__ = [
    "HUMANEVAL_SOURCE", "INSTANCE_KEY", "Instance", "SANDBOX_TOOLS", "SUBMISSION_KEY", "SWEDEV", "SandboxSession",
    "SwedevConfig", "SwedevState", "instance_from_row", "swedev_end", "swedev_obs", "swedev_preprocess",
    "swedev_prompt", "swedev_score", "swedev_start",
]
