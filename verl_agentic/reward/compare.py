"""Score the same trajectories with several reward managers and compare them.

    python -m verl_agentic.reward.compare TRAJECTORIES.jsonl --out DIR [--managers naive,prime,swedev]
        [--repeat K] [--timeout-s T] [--workers N] [--scorer NAME] [--scorer-module MOD ...]

For ``swedev`` a reward server (``python -m verl_agentic.reward.server``) is started on a free
loopback port and stopped at the end (or use ``--url`` for a running one). Writes into DIR:

- ``comparison.json``: per manager wall time, samples/s, failures by type, and the score agreement
  with the first manager (samples whose (score, error type) differ);
- ``comparison.md``: the same as a table;
- ``comparison.png``: bar charts of throughput and failures by type.

Exits 1 when the managers disagree on any sample, 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import RewardConfig, RewardResult, item_from_trajectory, make_reward_manager
from verl_agentic.rollout.trajectory import read_jsonl


@contextlib.contextmanager
def reward_server(workers: int, timeout_s: Optional[float], scorer_modules: list[str],
                  startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Start ``python -m verl_agentic.reward.server`` on a free loopback port; yield its URL."""
    cmd = [sys.executable, "-m", "verl_agentic.reward.server", "--host", "127.0.0.1", "--port", "0",
           "--workers", str(workers), "--quiet"]
    if timeout_s is not None:
        cmd += ["--timeout-s", str(timeout_s)]
    for m in scorer_modules:
        cmd += ["--scorer-module", m]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + startup_timeout_s
        url = None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if "listening on" in line:
                url = line.strip().rsplit(" ", 1)[-1]
                break
        if url is None:
            raise RuntimeError(f"the reward server did not start (exit code {proc.poll()})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _key(r: RewardResult) -> tuple:
    return (r.score, r.error.type if r.error else None)


def compare(trajectories: list[dict], managers: list[str], *, repeat: int = 1, timeout_s: Optional[float] = 30.0,
            workers: int = 0, scorer: Optional[str] = None, scorer_modules: Optional[list[str]] = None,
            url: Optional[str] = None, progress: bool = True) -> dict:
    """Score ``trajectories`` (``repeat`` times over) with each manager; the comparison report."""
    items = [item_from_trajectory(t, where=f"trajectory {i}") for i, t in enumerate(trajectories)] * repeat
    scorer_modules = list(scorer_modules or [])
    base = {"timeout_s": timeout_s, "num_workers": workers, "scorer": scorer, "scorer_modules": scorer_modules,
            "progress": progress}
    report: dict = {"samples": len(items), "trajectories": len(trajectories), "repeat": repeat, "managers": {}}
    reference: Optional[list[RewardResult]] = None
    with contextlib.ExitStack() as stack:
        for name in managers:
            cfg = dict(base, manager=name)
            if name in ("remote", "swedev"):
                cfg["url"] = url or stack.enter_context(
                    reward_server(RewardConfig(**base).workers, timeout_s, scorer_modules))
            with make_reward_manager(RewardConfig.from_dict(cfg)) as m:
                m.score_items(items[: min(len(items), 64)])  # warm up: worker processes, connections
                t0 = time.perf_counter()
                results = m.score_items(items)
                wall = time.perf_counter() - t0
            if reference is None:
                reference = results
            differ = [i for i, (a, b) in enumerate(zip(reference, results)) if _key(a) != _key(b)]
            scores = [r.score for r in results if r.score is not None]
            report["managers"][name] = {
                "wall_s": round(wall, 4),
                "samples_per_s": round(len(items) / wall, 1) if wall > 0 else None,
                "score_mean": sum(scores) / len(scores) if scores else None,
                "failures": dict(Counter(r.error.type for r in results if r.error)),
                "agree_with_" + managers[0]: len(items) - len(differ),
                "first_disagreements": differ[:10],
            }
    first = report["managers"][managers[0]]
    for name, m in report["managers"].items():
        m["throughput_vs_" + managers[0]] = round(m["samples_per_s"] / first["samples_per_s"], 3)
    report["all_agree"] = all(m["agree_with_" + managers[0]] == len(items) for m in report["managers"].values())
    return report


def format_markdown(report: dict) -> str:
    managers = report["managers"]
    first = next(iter(managers))
    lines = [f"{report['samples']} samples ({report['trajectories']} trajectories x {report['repeat']}); "
             f"all managers agree: **{'yes' if report['all_agree'] else 'NO'}**", "",
             f"| manager | wall s | samples/s | vs {first} | agree | failures |", "|---|---|---|---|---|---|"]
    for name, m in managers.items():
        fails = ", ".join(f"{k}:{v}" for k, v in sorted(m["failures"].items())) or "-"
        lines.append(f"| {name} | {m['wall_s']:.2f} | {m['samples_per_s']:.0f} | {m['throughput_vs_' + first]:.2f}x "
                     f"| {m['agree_with_' + first]}/{report['samples']} | {fails} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["managers"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.bar(names, [report["managers"][n]["samples_per_s"] for n in names], color="#4c72b0")
    ax1.set_title(f"throughput ({report['samples']} samples)")
    ax1.set_ylabel("samples / s")
    types = sorted({t for n in names for t in report["managers"][n]["failures"]})
    width = 0.8 / max(1, len(types))
    for k, t in enumerate(types):
        ax2.bar([i + k * width for i in range(len(names))], [report["managers"][n]["failures"].get(t, 0) for n in names],
                width, label=t)
    ax2.set_xticks([i + width * (len(types) - 1) / 2 for i in range(len(names))], names)
    ax2.set_title("failures by type" + ("" if types else " (none)"))
    if types:
        ax2.legend(fontsize=8)
    fig.suptitle("reward managers: " + ("identical scores" if report["all_agree"] else "SCORES DIFFER"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_agentic.reward.compare", description=__doc__.split("\n")[0])
    p.add_argument("trajectories", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--managers", default="naive,prime,swedev")
    p.add_argument("--repeat", type=int, default=1, help="score every trajectory K times (for throughput)")
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--workers", type=int, default=0, help="prime / server worker processes (0 = CPU count)")
    p.add_argument("--scorer", default=None, help="force one scorer (default: by data_source, then task_type)")
    p.add_argument("--scorer-module", action="append", default=[], help="module that registers scorers")
    p.add_argument("--url", default=None, help="use this running reward server for remote (swedev)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    try:
        if not a.trajectories.exists():
            raise ConfigError(f"trajectories file '{a.trajectories}' does not exist")
        trajs = read_jsonl(a.trajectories)
        if not trajs:
            raise ConfigError(f"'{a.trajectories}' holds no trajectories")
        report = compare(trajs, [m.strip() for m in a.managers.split(",") if m.strip()], repeat=a.repeat,
                         timeout_s=a.timeout_s, workers=a.workers, scorer=a.scorer, scorer_modules=a.scorer_module,
                         url=a.url, progress=not a.quiet)
    except (ConfigError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "comparison.json").write_text(json.dumps(report, indent=2))
    (a.out / "comparison.md").write_text(format_markdown(report))
    plot(report, a.out / "comparison.png")
    print(format_markdown(report))
    print(f"wrote {a.out / 'comparison.md'}, comparison.json and comparison.png")
    return 0 if report["all_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
