"""Paths and helpers shared by the tests (importable as ``va_testing``: pytest pythonpath=tests)."""

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
QWEN25_DIR = ASSETS / "tokenizers" / "qwen2.5-instruct"
QWEN3_DIR = ASSETS / "tokenizers" / "qwen3"
REPO = Path(__file__).resolve().parent.parent
GSM8K_TEST = REPO / "data" / "gsm8k" / "test.jsonl"
