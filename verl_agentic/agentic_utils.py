"""The first name of ``verl_agentic.tasks.data``, kept for launch scripts and imports that use it::

    python -m verl_agentic.agentic_utils gsm8k data/gsm8k/test.jsonl out/gsm8k_test.parquet
"""

from verl_agentic.tasks.data import (  # noqa: F401 - re-exported
    PREPROCESS_DATASET,
    PROMPT_GENERATOR,
    DatasetError,
    load_rows,
    preprocess,
    preprocess_row,
    read_raw_rows,
    validate_row,
)

__all__ = ["PREPROCESS_DATASET", "PROMPT_GENERATOR", "DatasetError", "load_rows", "preprocess", "preprocess_row",
           "read_raw_rows", "validate_row"]

if __name__ == "__main__":
    from verl_agentic.tasks.data import main

    main(prog="python -m verl_agentic.agentic_utils")
