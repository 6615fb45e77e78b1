"""Scorers that misbehave for real, for the reward-manager fault tests.

``faulty`` dispatches on ``extra_info["fault"]`` so one batch can mix good and bad samples;
without a fault it scores like ``gsm8k``. Importable by worker processes and the reward
server (``reward.scorer_modules=[va_faulty_scorers]`` with ``tests/`` on ``sys.path``).
"""

import os
import random
import subprocess
import signal
import time

from verl_agentic.reward.scorers import register_scorer
from verl_agentic.tasks.gsm8k.scorer import gsm8k_score


@register_scorer("faulty")
def faulty_score(solution_str, ground_truth, extra_info=None, **kwargs):
    extra_info = extra_info or {}
    fault = extra_info.get("fault")
    if fault == "raise":
        raise RuntimeError("scorer exploded on purpose")
    if fault == "hang":  # sleeps forever (Python code: interruptible)
        while True:
            time.sleep(3600)
    if fault == "spin":  # burns CPU forever
        while True:
            pass
    if fault == "c_hang":  # a C loop that holds the GIL and never checks for signals (hours)
        sum(range(10**13))
    if fault == "child_then_c_hang":  # starts a child process, then hangs in C
        child = subprocess.Popen(["sleep", "300"])
        with open(extra_info["pid_file"], "w") as f:
            f.write(str(child.pid))
        sum(range(10**13))
    if fault == "nan":
        return float("nan")
    if fault == "string":
        return "1.0"
    if fault == "none":
        return None
    if fault == "dict_without_score":
        return {"acc": 1.0}
    if fault == "huge_memory":  # grows until the address-space limit (or the machine) says no
        blocks = []
        while True:
            blocks.append(bytearray(256 * 2**20))
    if fault == "die":  # the worker process dies without a word
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "random":  # nondeterministic: managers cannot agree on it
        return random.random()
    if fault == "sleep":
        time.sleep(float(extra_info.get("sleep_s", 0.1)))
    return gsm8k_score(solution_str, ground_truth, extra_info, **kwargs)


@register_scorer("fixed_cpu_cost")
def fixed_cpu_cost_score(solution_str, ground_truth, extra_info=None, *, cost_ms=5.0, **kwargs):
    """gsm8k plus a deliberate busy loop of ``cost_ms`` of CPU time."""
    end = time.process_time() + cost_ms / 1000.0
    while time.process_time() < end:
        pass
    return gsm8k_score(solution_str, ground_truth, extra_info, **kwargs)
