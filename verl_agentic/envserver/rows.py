"""``python -m verl_agentic.envserver.rows ENV_TASK IN OUT``: a dataset of ENV_TASK as gen_chat rows.

Each row is preprocessed by ENV_TASK's preprocessor (as ``main_rollout task_type=ENV_TASK`` would) and
marked ``task_type: gen_chat`` with ``extra_info.env_task: ENV_TASK``, so a rollout sends it to the
environment service that runs ENV_TASK::

    python -m verl_agentic.envserver.rows gsm8k data/gsm8k/test.jsonl outputs/gen_chat_gsm8k.jsonl
    python -m verl_agentic.main_rollout task_type=gen_chat data.path=outputs/gen_chat_gsm8k.jsonl \\
        task.gen_chat.url=http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from verl_agentic.interfaces import ConfigError
from verl_agentic.rollout import write_jsonl
from verl_agentic.tasks.data import load_rows
from verl_agentic.tasks.gen_chat import as_gen_chat_row


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_agentic.envserver.rows",
                                 description="Convert a dataset of ENV_TASK into gen_chat rows (.jsonl).")
    ap.add_argument("env_task", help="the task the environment service runs (python -m verl_agentic.tasks lists them)")
    ap.add_argument("input", help=".jsonl / .json / .parquet file or datasets folder")
    ap.add_argument("output", help="output .jsonl")
    ap.add_argument("--max-samples", type=int, default=None)
    args = ap.parse_args(argv)

    out = Path(args.output)
    try:
        if out.suffix != ".jsonl":
            raise ConfigError(f"output {str(out)!r}: use a .jsonl file name")
        rows = [as_gen_chat_row(r, args.env_task) for r in load_rows(args.input, args.env_task, args.max_samples)]
        out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(out, rows)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(rows)} gen_chat rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
