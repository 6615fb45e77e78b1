"""Paths and helpers shared by the tests (importable as ``va_testing``: pytest pythonpath=tests)."""

from pathlib import Path

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
