"""A window on the trainer's policy update for the fault tests, loaded into ``main_ppo`` with
``imports=[va_update_watch]`` (test code: nothing of it ships).

Every forward pass of a causal LM that builds a graph (the update's: the rollout and the old-logprob passes
run under ``inference_mode`` / ``no_grad``) appends a line to the file ``$VA_UPDATE_MARKS`` and then sleeps
``$VA_UPDATE_SLEEP_S`` seconds, so a test sees when an update is under way and has time to signal into it.
"""

import os
import time

import torch

MARKS = os.environ.get("VA_UPDATE_MARKS")
SLEEP_S = float(os.environ.get("VA_UPDATE_SLEEP_S", "0"))


def _watch(module, _inputs):
    if MARKS and torch.is_grad_enabled() and type(module).__name__.endswith("ForCausalLM"):
        with open(MARKS, "a") as f:
            f.write("update forward\n")
        time.sleep(SLEEP_S)


torch.nn.modules.module.register_module_forward_pre_hook(_watch)
