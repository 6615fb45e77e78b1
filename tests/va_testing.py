"""Paths and helpers shared by the tests (importable as ``va_testing``: pytest pythonpath=tests)."""

import re
from pathlib import Path

from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import GenOutput
from verl_agentic.shm import PYTHON_SEGMENTS, SHM_DIR, own_segments, remove_orphans

ASSETS = Path(__file__).parent / "assets"
QWEN25_DIR = ASSETS / "tokenizers" / "qwen2.5-instruct"
QWEN3_DIR = ASSETS / "tokenizers" / "qwen3"
REPO = Path(__file__).resolve().parent.parent
GSM8K_TEST = REPO / "data" / "gsm8k" / "test.jsonl"


SHM = Path(SHM_DIR)


def shm_segments() -> set[str]:
    """This user's Python shared-memory segments (``psm_*``) in /dev/shm now."""
    return own_segments(PYTHON_SEGMENTS)


def remove_orphan_shm(before: set[str]) -> list[str]:
    """Remove the ``psm_*`` segments made since ``before`` that no live process has open or mapped
    (``verl_agentic.shm``: vLLM's engine processes leave them behind when Ray kills them, 160-250 MB
    each, ~2 GB of RAM over the vLLM tests). Returns the names removed."""
    new = shm_segments() - before
    return sorted(Path(p).name for p in remove_orphans(PYTHON_SEGMENTS, among=new))


def release_memory() -> None:
    """Collect reference cycles (models in them linger until a full collection) and hand freed heap back
    to the OS (glibc keeps it otherwise), so the test process's RSS shrinks after a module of models."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class ScriptedPolicy(GenerationBackend):
    """TEST DOUBLE for the model: the reply of assistant turn t is ``replies[t]`` (tokenized with the
    real tokenizer, ending with ``<|im_end|>``, logprob -0.5 each); ``replies`` may be a dict keyed by a
    regex group of the prompt (``key``), one script per instance."""

    def __init__(self, tokenizer, replies, key: str | None = None):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]
        self.replies, self.key = replies, key
        self.requests = 0

    async def generate(self, prompt_ids, sampling):
        self.requests += 1
        context = self.tokenizer.decode(prompt_ids)
        turn = context.count("<|im_start|>assistant") - 1
        script = self.replies[re.search(self.key, context).group(1)] if self.key else self.replies
        ids = self.tokenizer.encode(script[min(turn, len(script) - 1)], add_special_tokens=False) + [self.end_id]
        ids = ids[: sampling.max_new_tokens]
        return GenOutput(ids, [-0.5] * len(ids), self.tokenizer.decode(ids),
                         "stop" if ids[-1] == self.end_id else "length")

    def stats(self):
        return {"requests": self.requests}
