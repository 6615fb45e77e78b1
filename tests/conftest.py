"""Shared fixtures: real tokenizers (Qwen2.5, Qwen3, SmolLM2) and small real models."""

from __future__ import annotations

from pathlib import Path

import pytest

from va_testing import QWEN3_DIR, QWEN25_DIR, release_memory, remove_orphan_shm, shm_segments


@pytest.fixture(autouse=True, scope="module")
def _no_orphan_shared_memory():
    """After each test module: remove the shared-memory segments it left that nothing holds (vLLM's, when
    Ray kills its engine), and give the memory its models used back to the OS, so neither crowds the
    verl runs after it (Ray kills workers at 95% of the machine's memory)."""
    before = shm_segments()
    yield
    remove_orphan_shm(before)
    release_memory()


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN25_DIR)


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN3_DIR)


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    from verl_agentic.models.embedded import embedded_model_dir

    return embedded_model_dir(quiet=True)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="session")
def tiny_qwen_dir() -> Path:
    """A tiny random Qwen2 model carrying the real Qwen2.5 tokenizer (fast generation)."""
    from verl_agentic.models.tiny import make_tiny_model

    return Path(make_tiny_model(str(QWEN25_DIR)))


@pytest.fixture(scope="session")
def tiny_smol_dir(smol_dir) -> str:
    """A tiny random Qwen2 with SmolLM2's tokenizer (49k vocab: cheap logits), for the trainer's tests."""
    from verl_agentic.models.tiny import make_tiny_model

    return make_tiny_model(str(smol_dir))
