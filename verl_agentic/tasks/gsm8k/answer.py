"""GSM8K answers: extracting the final number of a response, and the ground truth of a reference solution."""

from __future__ import annotations

import re
from typing import Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.tasks.data import DatasetError

EXTRACTIONS = ("strict", "flexible")

_NUMBER = r"-?\$?\s*\d[\d,]*(?:\.\d+)?|-?\$?\s*\.\d+"
_STRICT_RE = re.compile(r"####\s*(" + _NUMBER + r")")
_FLEXIBLE_RE = re.compile(_NUMBER)


def normalize_number(text: str) -> Optional[str]:
    """Canonical form of a number: no ``$``, commas or spaces; ``72.0`` -> ``72``; ``.5`` -> ``0.5``."""
    s = text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not s:
        return None
    try:
        value = float(s)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def extract_answer(text: str, extraction: str = "flexible") -> Optional[str]:
    """The normalised final answer of a response, or None when it has none.

    ``strict``: the number after the last ``####``. ``flexible``: the ``####`` answer when there
    is one, else the last number in the text.
    """
    if extraction not in EXTRACTIONS:
        raise ConfigError(f"gsm8k extraction must be one of {EXTRACTIONS}, got {extraction!r}")
    strict = _STRICT_RE.findall(text)
    if strict:
        return normalize_number(strict[-1])
    if extraction == "strict":
        return None
    for candidate in reversed(_FLEXIBLE_RE.findall(text)):
        n = normalize_number(candidate)
        if n is not None:
            return n
    return None


def ground_truth_from_solution(solution: str) -> str:
    """The ``#### N`` line of a GSM8K reference solution, normalised."""
    m = _STRICT_RE.findall(solution)
    gt = normalize_number(m[-1]) if m else None
    if gt is None:
        raise DatasetError("field 'answer' has no '#### <number>' line")
    return gt
