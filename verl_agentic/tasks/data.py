"""A task's data: its prompt generator and dataset preprocessor, and dataset loading.

``PREPROCESS_DATASET[task_type](raw_row, index) -> row`` turns a raw example into a rollout row
in verl's RLHFDataset layout::

    {"data_source", "task_type", "prompt": [messages], "ability",
     "reward_model": {"style": "rule", "ground_truth": str}, "extra_info": {"index", ...}}

``PROMPT_GENERATOR[task_type](raw_row) -> messages`` builds the chat prompt of a raw example. A
preprocessor leaves ``prompt`` out of its row and ``preprocess_row`` (the one consumer of both
registries) fills it in from the task's prompt generator. A task without a preprocessor of its
own gets ``default``; without a prompt generator, ``default`` (the row's ``prompt``: a string or
a message list, else its ``question``). A preprocessor raises ``DatasetError`` naming the field;
the loader adds the file and row.

Both registries find the built-in tasks' entries through the ``verl_agentic.tasks`` entry points
(importing a task's module registers them), like ``TASKS``.

CLI (writes parquet or jsonl, by the output's suffix)::

    python -m verl_agentic.tasks.data gsm8k data/gsm8k/test.jsonl out/gsm8k_test.parquet
    python -m verl_agentic.tasks.data --imports my_task my_task raw.jsonl rows.parquet   # a task of yours

(``python -m verl_agentic.agentic_utils`` is the same command under its first name.)
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.jsonl import iter_json_lines, write_json_lines
from verl_agentic.registry import Registry, import_modules
from verl_agentic.rollout.task_spec import ENTRY_POINT_GROUP

PROMPT_GENERATOR: Registry[Callable[[dict], list[dict]]] = Registry(
    "prompt generator", ENTRY_POINT_GROUP, modules_only=True)
PREPROCESS_DATASET: Registry[Callable[[dict, int], dict]] = Registry(
    "dataset preprocessor", ENTRY_POINT_GROUP, modules_only=True)


class DatasetError(ConfigError):
    """A dataset that cannot be used; the message names the file, the row and the field."""


@PROMPT_GENERATOR.register("default")
def default_prompt(raw: dict) -> list[dict]:
    """The row's ``prompt`` (a message list, or a string as one user message), else its ``question``."""
    prompt = raw.get("prompt")
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    text = prompt if isinstance(prompt, str) else raw.get("question")
    if not isinstance(text, str) or not text.strip():
        raise DatasetError("field 'prompt' (or 'question') is missing or empty")
    return [{"role": "user", "content": text.strip()}]


@PREPROCESS_DATASET.register("default")
def default_preprocess(raw: dict, index: int) -> dict:
    """A raw row with ``ground_truth`` (or ``answer``) -> a rollout row; other fields go to extra_info."""
    gt = raw.get("ground_truth", raw.get("answer"))
    if gt is None or (isinstance(gt, str) and not gt.strip()):
        raise DatasetError("field 'ground_truth' (or 'answer') is missing or empty")
    rest = {k: v for k, v in raw.items() if k not in ("prompt", "question", "ground_truth", "answer", "data_source",
                                                         "task_type", "extra_info")}
    return {
        "data_source": raw.get("data_source") or raw.get("task_type") or "unknown",
        "task_type": raw.get("task_type"),
        "reward_model": {"style": "rule", "ground_truth": gt if isinstance(gt, str) else json.dumps(gt)},
        "extra_info": {"index": index, **rest, **(raw.get("extra_info") or {})},
    }


def preprocess_row(raw: dict, index: int, task_type: str) -> dict:
    """``raw`` as a rollout row of ``task_type``: the task's preprocessor (else ``default``), and the
    prompt from its prompt generator (else ``default``) when the preprocessor left it out."""
    name = raw.get("task_type") or task_type
    pre = PREPROCESS_DATASET[name] if name in PREPROCESS_DATASET else PREPROCESS_DATASET["default"]
    row = pre(raw, index)
    if row.get("task_type") is None:
        row["task_type"] = name
    if "prompt" in row:
        return row
    gen = PROMPT_GENERATOR[name] if name in PROMPT_GENERATOR else PROMPT_GENERATOR["default"]
    prompt = gen(raw)
    out: dict = {}
    for k, v in row.items():  # the prompt goes after task_type: verl's column order
        out[k] = v
        if k == "task_type":
            out["prompt"] = prompt
    out.setdefault("prompt", prompt)
    return out


BAD_ROW_POLICIES = ("fail", "skip")


@dataclass
class BadRow:
    """A row left out under ``data.on_bad_row=skip``: where it is, why, and the row (or its line's text)."""

    file: str
    row: int  # its position among the file's records (blank lines do not count), from 0
    reason: str
    raw: Any = None

    def as_dict(self) -> dict:
        raw = json.loads(json.dumps(self.raw, ensure_ascii=False, default=str))  # parquet values may be bytes, dates
        return {"file": self.file, "row": self.row, "reason": self.reason, "raw": raw}


def read_raw_rows(path: str | Path, max_samples: Optional[int] = None) -> list[dict]:
    """Rows of a ``.jsonl`` / ``.json`` / ``.parquet`` file or a ``datasets.save_to_disk`` folder."""
    return [r for _, r in _read_records(Path(path), max_samples, None)]


def _read_records(p: Path, max_samples: Optional[int], bad: Optional[list[BadRow]]) -> list[tuple[int, dict]]:
    """``(row number, row)`` of the first ``max_samples`` records; a record that is not a JSON object
    raises ``DatasetError``, or goes to ``bad`` when given. A file that cannot be read at all raises
    ``DatasetError`` either way, in one line naming it."""
    if not p.exists():
        raise DatasetError(f"dataset {str(p)!r} does not exist")
    limit = None if max_samples is None or max_samples < 0 else int(max_samples)
    try:
        return _read_file(p, limit, bad)
    except DatasetError:
        raise
    except UnicodeDecodeError as e:
        raise DatasetError(f"{p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise DatasetError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except (OSError, EOFError, ValueError, zlib.error) as e:  # a bad gzip stream, parquet (ArrowInvalid is a ValueError)
        raise DatasetError(f"{p}: cannot be read as a dataset ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def _read_file(p: Path, limit: Optional[int], bad: Optional[list[BadRow]]) -> list[tuple[int, dict]]:
    if p.is_dir():
        import datasets

        ds = datasets.load_from_disk(str(p))
        if isinstance(ds, datasets.DatasetDict):
            raise DatasetError(f"{p}: a DatasetDict; point data.path at one split folder ({', '.join(ds)})")
        rows = ds.select(range(min(limit, len(ds)))) if limit is not None else ds
        return list(enumerate(dict(r) for r in rows))
    suffix = p.suffix.lower()
    opener = open
    if suffix == ".gz":  # e.g. data/humaneval/HumanEval.jsonl.gz
        import gzip

        opener, suffix = gzip.open, Path(p.stem).suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(p)
        if limit is not None:
            table = table.slice(0, limit)
        return list(enumerate(table.to_pylist()))
    if suffix not in (".jsonl", ".json"):
        raise DatasetError(f"{p}: unsupported dataset format {suffix!r} (use .jsonl, .json, .parquet, .jsonl.gz or a datasets folder)")
    with opener(p, "rt", encoding="utf-8") as f:
        if suffix == ".json":
            data = json.load(f)
            if not isinstance(data, list):
                raise DatasetError(f"{p}: a .json dataset must hold a list of objects, got {type(data).__name__}")
            records = list(enumerate(data[:limit] if limit is not None else data))
        else:
            records = []
            # a line that is not a JSON object takes its row number too: the rows after it keep theirs

            def skip(line_no: int, text: str, reason: str) -> None:
                records.append((len(records), BadRow(str(p), len(records), reason, text)))

            for _, row in iter_json_lines(f, str(p), error=DatasetError, on_bad=None if bad is None else skip):
                records.append((len(records), row))
                if limit is not None and len(records) >= limit:
                    break
            if limit is not None:
                records = records[:limit]
    out = []
    for i, r in records:
        if isinstance(r, BadRow) or not isinstance(r, dict):
            problem = r if isinstance(r, BadRow) else BadRow(
                str(p), i, f"{p}: row {i} is a {type(r).__name__}, expected a JSON object", r)
            if bad is None:
                raise DatasetError(problem.reason)
            bad.append(problem)
            continue
        out.append((i, r))
    return out


def is_preprocessed(row: dict) -> bool:
    return "prompt" in row and "reward_model" in row


def validate_row(row: dict, where: str) -> None:
    """A rollout row needs a non-empty chat prompt and a ground truth."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        raise DatasetError(f"{where}: field 'prompt' must be a non-empty list of chat messages, got {prompt!r:.80}")
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DatasetError(f"{where}: field 'prompt[{j}]' must be a message with 'role' and string 'content'")
    gt = (row.get("reward_model") or {}).get("ground_truth")
    if gt is None or (isinstance(gt, str) and not gt.strip()):
        raise DatasetError(f"{where}: field 'reward_model.ground_truth' is missing or empty")


def load_rows(path: str | Path, task_type: str, max_samples: Optional[int] = None, *,
              on_bad_row: str = "fail", skipped: Optional[list[BadRow]] = None) -> list[dict]:
    """Load a dataset as rollout rows: raw rows go through ``preprocess_row``.

    Rows are validated. ``on_bad_row="fail"``: the first problem raises ``DatasetError`` naming the
    file, row and field; ``"skip"``: a bad row is left out and appended to ``skipped`` (a
    ``BadRow`` with the reason). A file that cannot be read at all is a ``DatasetError`` either way.
    Parquet files written by ``preprocess`` (or verl's own gsm8k preprocessing) load as they are.
    """
    if on_bad_row not in BAD_ROW_POLICIES:
        raise ConfigError(f"data.on_bad_row must be one of {BAD_ROW_POLICIES}, got {on_bad_row!r}")
    bad: Optional[list[BadRow]] = [] if on_bad_row == "skip" else None
    raw = _read_records(Path(path), max_samples, bad)
    rows = []
    for i, r in raw:
        where = f"{path}: row {i}"
        try:
            if is_preprocessed(r):
                row = dict(r)
                row.setdefault("task_type", task_type)
            else:
                try:
                    row = preprocess_row(r, i, task_type)
                except DatasetError as e:
                    raise DatasetError(f"{where}: {e}") from None
            validate_row(row, where)
        except DatasetError as e:
            if bad is None:
                raise
            bad.append(BadRow(str(path), i, str(e), r))
            continue
        rows.append(row)
    if bad and skipped is not None:
        skipped.extend(bad)
    if not rows:
        raise DatasetError(f"dataset {str(path)!r} has no rows" + (f" ({len(bad)} skipped as bad, the first: "
                                                                   f"{bad[0].reason})" if bad else ""))
    return rows


def write_skipped_rows(path: str | Path, skipped: list[BadRow]) -> None:
    """The rows ``data.on_bad_row=skip`` left out, one JSON object a line (file, row, reason, raw)."""
    write_json_lines(path, [b.as_dict() for b in skipped])


def preprocess(task_type: str, src: str | Path, dst: str | Path, max_samples: Optional[int] = None, *,
               on_bad_row: str = "fail", skipped: Optional[list[BadRow]] = None) -> int:
    """Preprocess a raw dataset file into rollout rows written as parquet or jsonl (by suffix); returns
    how many rows were written (``on_bad_row`` and ``skipped``: as in ``load_rows``)."""
    dst = Path(dst)
    if dst.suffix not in (".parquet", ".jsonl"):
        raise DatasetError(f"output {str(dst)!r}: use a .parquet or .jsonl file name")
    rows = load_rows(src, task_type, max_samples, on_bad_row=on_bad_row, skipped=skipped)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), dst)
    else:
        write_json_lines(dst, rows)
    return len(rows)


def main(argv: Optional[list[str]] = None, prog: str = "python -m verl_agentic.tasks.data") -> None:
    """The CLI; a bad dataset or argument is one line on stderr and exit code 2."""
    ap = argparse.ArgumentParser(prog=prog,
                                 description="Preprocess a raw dataset into rollout rows.")
    ap.add_argument("task_type", help=f"one of: {', '.join(PREPROCESS_DATASET.names())}")
    ap.add_argument("input", help=".jsonl / .json / .parquet file or datasets folder")
    ap.add_argument("output", help="output .parquet or .jsonl")
    ap.add_argument("--imports", action="append", default=[], metavar="MODULE",
                    help="import MODULE first: its tasks' preprocessors register (repeatable)")
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--on-bad-row", choices=BAD_ROW_POLICIES, default="fail",
                    help="fail (default): stop at the first bad row, naming it; skip: leave bad rows out "
                         "and list them in OUTPUT's folder as <name>.skipped.jsonl")
    args = ap.parse_args(argv)
    skipped: list[BadRow] = []
    try:
        import_modules(args.imports, "--imports")
        n = preprocess(args.task_type, args.input, args.output, args.max_samples, on_bad_row=args.on_bad_row,
                       skipped=skipped)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"wrote {n} rows to {args.output}")
    if skipped:
        out = Path(args.output)
        listing = out.with_name(out.name.rsplit(".", 1)[0] + ".skipped.jsonl")
        write_skipped_rows(listing, skipped)
        print(f"skipped {len(skipped)} bad rows (listed with their reasons in {listing})")


if __name__ == "__main__":
    # Run as a script this file is a second module object with empty registries of its own; the
    # tasks register into the imported module's (verl_agentic.tasks.data), so use that one.
    from verl_agentic.tasks.data import main as _main

    _main()
