"""The reward-hacking and collapse monitors replayed over this project's committed training runs.

    .venv/bin/python bench/monitors_on_runs.py            # print the table
    .venv/bin/python bench/monitors_on_runs.py --write    # and put it into bench/RESULTS.md

Each run's ``metrics.jsonl`` goes through the same summary and monitors ``main_ppo`` runs online
(``verl_agentic.monitors``), step by step; a run's held-out answers (the word-problem runs commit
the last validation's, ``final_validation.jsonl``) join the summary at that validation's step. A cell
is the first step at which the monitor fired, ``-`` when it never did, ``n/a`` when the run never
gives its statistic (no KL to a reference model, no tools, no held-out answers logged per step).

Runs: ``examples/word_problems/runs/ARM/seedN`` (main_ppo), ``examples/word_problems/monitored/*``
(main_ppo runs made with the monitors online: every step's ``batch/*`` summary is in their
metrics), ``examples/learning_run/metrics/seedN.jsonl`` (main_ppo), and
``examples/learning_run_verl/metrics/seed0.verl.jsonl`` (verl's trainer, verl's metric names).
``tests/test_monitors.py`` checks the table in bench/RESULTS.md against this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verl_agentic.jsonl import read_json_lines  # noqa: E402
from verl_agentic.monitors import BUILTIN, from_metrics, heldout_summary, make_monitors  # noqa: E402
from verl_agentic.tasks.gsm8k.answer import extract_answer  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN = "<!-- monitor table begin: written by bench/monitors_on_runs.py --write, checked by tests/test_monitors.py -->"
END = "<!-- monitor table end -->"
NAMES = [cls.name for cls in BUILTIN]


def _extraction(run_json: Path) -> str:
    command = json.loads(run_json.read_text())["command"] if run_json.exists() else []
    return "strict" if "task.gsm8k.extraction=strict" in command else "flexible"


def _validation_episodes(folder: Path) -> tuple[Optional[int], list[dict]]:
    """The committed last validation of a word-problem run as episodes ``heldout_summary`` reads:
    (its step, the episodes with the answer the run's extraction reads from each turn's text)."""
    path = folder / "final_validation.jsonl"
    if not path.exists():
        return None, []
    run = json.loads((folder / "run.json").read_text())
    step = int(run["validation_file"].removeprefix("step_").removesuffix(".jsonl"))
    extraction = _extraction(folder / "run.json")
    episodes = []
    for e in read_json_lines(path, what="a validation episode"):
        episodes.append({"messages": [{"role": "assistant", "content": text} for text in e["answers"]],
                         "turns": [{"role": "assistant", "info": {"answer": extract_answer(text, extraction)}}
                                   for text in e["answers"]],
                         "metrics": {"final_correct": e["final_correct"]}})
    return step, episodes


def replay(metrics_path: Path, names: str = "ours", validation: tuple[Optional[int], list[dict]] = (None, [])):
    """The MonitorSet after every step of one run's metrics."""
    monitors = make_monitors()
    rows = read_json_lines(metrics_path, what="a step's metrics")
    rows = [{**r["data"], "step": r["step"]} if isinstance(r.get("data"), dict) else r for r in rows]
    val_step, val_episodes = validation
    for row in sorted(rows, key=lambda r: r["step"]):
        summary = from_metrics(row, names)
        if row["step"] == val_step:
            summary.update(heldout_summary(val_episodes))
        monitors.observe(row["step"], summary)
    return monitors


def runs() -> list[tuple[str, Path, str, tuple]]:
    """(label, metrics file, metric names, validation) of every committed run, in table order."""
    out = []
    wp = ROOT / "examples" / "word_problems"
    for kind in ("runs", "monitored"):
        for folder in sorted(p for p in (wp / kind).glob("*/seed*") if (p / "metrics.jsonl").exists()):
            online = " (online)" if kind == "monitored" else ""
            label = f"{folder.parent.name} s{folder.name.removeprefix('seed')}{online}"
            out.append((label, folder / "metrics.jsonl", "ours", _validation_episodes(folder)))
    for path in sorted((ROOT / "examples" / "learning_run" / "metrics").glob("seed*.jsonl")):
        out.append((f"learning_run s{path.stem.removeprefix('seed')}", path, "ours", (None, [])))
    verl = ROOT / "examples" / "learning_run_verl" / "metrics" / "seed0.verl.jsonl"
    out.append(("learning_run_verl s0 (verl)", verl, "verl", (None, [])))
    return out


def table() -> str:
    head = "| run | " + " | ".join(NAMES) + " |"
    lines = [head, "| --- |" + " --- |" * len(NAMES)]
    for label, path, names, validation in runs():
        m = replay(path, names, validation)
        cells = [str(m.first_fired[n]) if n in m.first_fired else ("-" if n in m.seen else "n/a") for n in NAMES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="put the table into bench/RESULTS.md between its markers")
    args = ap.parse_args(argv)
    text = table()
    print(text)
    if args.write:
        doc = RESULTS.read_text()
        start, end = doc.find(BEGIN), doc.find(END)
        if start < 0 or end < start:
            print(f"{RESULTS}: no '{BEGIN}' / '{END}' markers", file=sys.stderr)
            return 2
        head = doc.index("\n", start) + 1
        RESULTS.write_text(doc[:head] + "\n" + text + "\n\n" + doc[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
