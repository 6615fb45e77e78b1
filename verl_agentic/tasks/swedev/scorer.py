"""``swedev``: 1.0 when a swedev episode's submission passes its instance's hidden tests, else 0.0.

The submission is what the episode changed in its sandbox (``extra_info.swedev_submission``,
written by the task's ``end``), the repository is ``extra_info.swedev.files`` and the hidden
tests are the row's ``ground_truth``. The scorer rebuilds repository + submission in a fresh
directory and runs the tests there with the code the sandbox service runs at the end of an
episode (``verl_agentic.sandbox.runtime``), in the isolation engine (``verl_agentic.isolation``); so the score
equals the episode's reward, and every reward manager (naive, prime, swedev against the sandbox
service or the reward server) gives the same one. ``solution_str`` is not used: the solution is
the files, not the text.

kwargs: ``timeout_s`` (the tests' wall limit, default 30), ``memory_mb`` (per process, default 512),
``isolation`` (``bwrap``, the default: without bubblewrap every item fails with a scorer error that says
how to install it; ``none``: explicit, unsafe).
Extra: ``passed``, ``exit_code``, ``tests_error`` (``timeout``, ``runtime_error``, ...), ``files_changed``.

A trajectory without a submission (its episode ended before ``end`` could read the sandbox, e.g.
the sandbox service restarted) raises: a ``scorer_error``, never a silent 0.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

from verl_agentic.isolation import SandboxLimits
from verl_agentic.reward.scorers import register_scorer
from verl_agentic.sandbox.runtime import Changes, HiddenTests, file_set, score_submission

SUBMISSION_KEY = "swedev_submission"  # extra_info key of the episode's changes
INSTANCE_KEY = "swedev"  # extra_info key of the instance (instance_id, files, test_command)


@register_scorer("swedev")
def swedev_score(solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None, *,
                 timeout_s: float = 30.0, memory_mb: Optional[int] = 512, isolation: str = "bwrap") -> dict:
    extra_info = extra_info or {}
    instance = extra_info.get(INSTANCE_KEY)
    if not isinstance(instance, dict) or "files" not in instance:
        raise ValueError(f"extra_info.{INSTANCE_KEY}.files is missing: not a swedev row")
    if extra_info.get(SUBMISSION_KEY) is None:
        raise ValueError(f"extra_info.{SUBMISSION_KEY} is missing: the episode of {instance.get('instance_id')!r} "
                         "ended before its sandbox's changes were read (see the trajectory's error)")
    repo = file_set(instance["files"], f"extra_info.{INSTANCE_KEY}.files")
    changes = Changes.from_dict(extra_info[SUBMISSION_KEY], f"extra_info.{SUBMISSION_KEY}")
    tests = HiddenTests.from_ground_truth(ground_truth, "ground_truth")
    _reap_children_normally()
    limits = SandboxLimits(wall_timeout_s=timeout_s, memory_mb=memory_mb, cpu_time_s=int(timeout_s) + 1,
                           isolation=isolation)
    outcome = score_submission(repo, changes, tests, limits)
    if outcome.error_type == "sandbox_error":  # the tests never ran: not the submission's fault
        raise RuntimeError(f"the sandbox could not start the hidden tests: {outcome.output[-300:]}")
    return {"score": float(outcome.passed), "passed": outcome.passed, "exit_code": outcome.exit_code,
            "tests_error": outcome.error_type, "files_changed": len(changes.files) + len(changes.deleted)}


def _reap_children_normally() -> None:
    """Undo an inherited ``SIGCHLD = SIG_IGN`` (prime's worker processes have it).

    With SIGCHLD ignored the kernel reaps children itself and ``waitpid`` fails, so ``subprocess``
    reports exit status 0 for every child: every hidden test would "pass".
    """
    if signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN:
        return
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("SIGCHLD is ignored in this process and only its main thread may change that: "
                           "exit codes of the hidden tests cannot be read")
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
