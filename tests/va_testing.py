"""Paths and helpers shared by the tests (importable as ``va_testing``: pytest pythonpath=tests)."""

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
QWEN25_DIR = ASSETS / "tokenizers" / "qwen2.5-instruct"
QWEN3_DIR = ASSETS / "tokenizers" / "qwen3"
REPO = Path(__file__).resolve().parent.parent
GSM8K_TEST = REPO / "data" / "gsm8k" / "test.jsonl"


SHM = Path("/dev/shm")


def shm_segments() -> set[str]:
    """Python shared-memory segments (``psm_*``) in /dev/shm now."""
    return {p.name for p in SHM.glob("psm_*")} if SHM.is_dir() else set()


def remove_orphan_shm(before: set[str]) -> list[str]:
    """Remove the ``psm_*`` segments made since ``before`` that no live process has open or mapped.

    vLLM's engine processes share a message queue through such segments and leave them behind when
    Ray kills them (160-250 MB each, ~2 GB of RAM over the vLLM tests). Returns the names removed."""
    new = shm_segments() - before
    if not new:
        return []
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            held.update(name for name in new if name in (proc / "maps").read_text())
            held.update(Path(link).name for link in (str(f.readlink()) for f in (proc / "fd").iterdir())
                        if link.startswith("/dev/shm/psm_"))
        except OSError:  # the process ended, or is not ours to read
            continue
    removed = sorted(new - held)
    for name in removed:
        (SHM / name).unlink(missing_ok=True)
    return removed


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
