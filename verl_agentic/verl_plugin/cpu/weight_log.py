"""The record of each weight push into a CPU rollout (the ``hf`` rollout and vLLM's), one shape for both.

Every push is logged (``logger.info``) and, when ``VERL_AGENTIC_WEIGHT_PUSH_LOG`` names a file,
appended to it as a JSON line (``DEVICE=cpu scripts/run_gsm8k_multiturn.sh`` sets it to
``$OUT/weight_pushes.jsonl``): the push's index in this rollout process, how many tensors arrived and
how many the model lacked, a fingerprint of the weights and the largest change from the previous
push, so a run can show that every update reached the rollout, and a resumed run that it started
from the weights the interrupted one had pushed last.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable

import torch

from verl_agentic.jsonl import append_json_line

logger = logging.getLogger(__name__)

PUSH_LOG_ENV = "VERL_AGENTIC_WEIGHT_PUSH_LOG"


def weight_fingerprint(named: Iterable[tuple[str, torch.Tensor]]) -> float:
    """A number that changes when the weights change: per tensor the sum and the sum of squares of its
    values in float64, added up in name order. (A position-weighted sum, which would also see a
    permutation, cost 8 s a push for SmolLM2 on 2 cores; this costs 0.8 s, and a training update
    changes nearly every value.)"""
    total = 0.0
    for _, w in sorted(named, key=lambda item: item[0]):
        w = w.detach().reshape(-1).to(torch.float64)
        total += float(w.sum()) + float(torch.dot(w, w))
    return total


def log_push(record: dict[str, Any], who: str) -> None:
    logger.info("%s: weight push %s: %s", who, record.get("push"), record)
    path = os.environ.get(PUSH_LOG_ENV)
    if path:
        append_json_line(path, record)  # whole lines under the file's lock (a killed run tears none)
