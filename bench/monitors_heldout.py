"""The monitors on runs that did not choose their thresholds: the pre-registered learning-run seeds.

    .venv/bin/python bench/monitors_heldout.py            # print the table
    .venv/bin/python bench/monitors_heldout.py --write    # and put it into bench/RESULTS.md

The monitors' thresholds were set on the runs of ``bench/monitors_on_runs.py`` (issue 29). The
pre-registered seeds of ``examples/learning_run/prereg*/`` came later, ran ``main_ppo`` with the monitors
online, and were judged by a criterion fixed before they ran (PREREG.md: reward gain >= 0.2 and held-out
greedy accuracy after the last step above step 0's). So they are held-out evidence for the monitors: what
fired on runs that met the criterion, and on runs that did not. A cell is the first step at which the
monitor fired online (its ``monitor/<name>/firing`` metric), ``-`` when it never did, ``n/a`` when the run
never logged its statistic. ``tests/test_monitors.py`` checks the table in bench/RESULTS.md against this
script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from verl_agentic.jsonl import read_json_lines  # noqa: E402
from verl_agentic.monitors import BUILTIN  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
ROUNDS = ROOT / "examples" / "learning_run"
BEGIN = "<!-- held-out monitor table begin: written by bench/monitors_heldout.py --write, checked by tests/test_monitors.py -->"
END = "<!-- held-out monitor table end -->"
NAMES = [cls.name for cls in BUILTIN]


def first_firings(metrics: Path) -> dict[str, str]:
    """Each monitor's first firing step in one run's metrics (``-``: never, ``n/a``: never logged)."""
    cells = {name: "n/a" for name in NAMES}
    for row in read_json_lines(metrics, skip_torn=True):
        for name in NAMES:
            if f"monitor/{name}" in row and cells[name] == "n/a":
                cells[name] = "-"
            if row.get(f"monitor/{name}/firing") and cells[name] in ("-", "n/a"):
                cells[name] = str(row["step"])
    return cells


def runs() -> list[dict]:
    out = []
    for folder in sorted(p for p in ROUNDS.glob("prereg*") if p.is_dir()):
        summary = json.loads((folder / "seeds.json").read_text())
        for r in summary["runs"]:
            metrics = folder / "metrics" / f"seed{r['seed']}.jsonl"
            out.append({"round": folder.name, "seed": r["seed"], "meets": r["meets"],
                        "heldout": " -> ".join(f"{a:.2f}" for _, a in r["heldout"]) or "-",
                        "fired": first_firings(metrics) if metrics.is_file() else {n: "n/a" for n in NAMES}})
    return out


def table() -> str:
    rs = runs()
    lines = ["| run | meets the criterion | held-out 0 -> 10 -> 20 | " + " | ".join(NAMES) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in NAMES) + " |"]
    for r in rs:
        lines.append(f"| {r['round']} seed {r['seed']} | {'yes' if r['meets'] else 'no'} | {r['heldout']} | "
                     + " | ".join(r["fired"][n] for n in NAMES) + " |")
    lines.append("")
    for meets, label in ((True, "met the criterion"), (False, "did not")):
        group = [r for r in rs if r["meets"] is meets]
        counts = []
        for n in NAMES:
            logged = [r for r in group if r["fired"][n] != "n/a"]
            if logged:
                counts.append(f"{n} {sum(r['fired'][n] != '-' for r in logged)}/{len(logged)}")
        lines.append(f"Runs that {label} ({len(group)}): fired in " + (", ".join(counts) or "none logged") + ".")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="replace the table in bench/RESULTS.md")
    a = p.parse_args()
    t = table()
    print(t)
    if a.write:
        doc = RESULTS.read_text()
        start, end = doc.index(BEGIN), doc.index(END)
        RESULTS.write_text(doc[:doc.index("\n", start) + 1] + "\n" + t + "\n\n" + doc[end:])


if __name__ == "__main__":
    main()
