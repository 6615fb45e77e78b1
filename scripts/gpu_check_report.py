"""The Python half of scripts/gpu_check.sh: its input checks, its dry run, and its report and judge.

    python scripts/gpu_check_report.py gpu MIN_GIB                 # one GPU with MIN_GIB, or one line, exit 2
    python scripts/gpu_check_report.py probe URL                   # the package index answers, or one line, exit 2
    python scripts/gpu_check_report.py requirements PYPROJECT      # this package's dependencies but torch/transformers/verl
    python scripts/gpu_check_report.py validate NAME=FILE ...      # verl's config validation of each run's overrides
    python scripts/gpu_check_report.py environment OUT.json        # versions and GPU name (run in the check's venv)
    python scripts/gpu_check_report.py report RUN_DIR --model M --steps N --gap-bound B --runs sync,colocate_async

``report`` reads each run's folder, ``RUN_DIR/<mode>/``: ``metrics.jsonl`` (verl's file logger, lines
``{"step": N, "data": {...}}``), ``rollouts/step_NNNNNN.jsonl`` (verl_agentic's trajectory dump) and
``gpu_memory.csv`` (nvidia-smi's memory.used in MiB, one sample a line), plus ``RUN_DIR/environment.json``.
It writes ``RUN_DIR/report.md`` and ``RUN_DIR/report.json`` and exits 1 when a check fails (see FAILURES).

The module imports only the standard library at the top: ``gpu`` and ``probe`` run before the check's
environment exists. The others import verl, transformers and verl_agentic when called.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

# verl 0.9.1's rollout-vs-trainer metric (verl/utils/debug/metrics.py, calculate_debug_metrics, logged every
# step when actor_rollout_ref.rollout.calculate_log_probs=true): the mean over response tokens of
# |exp(trainer logprob) - exp(rollout logprob)|, a difference of probabilities despite its name.
GAP_KEY = "training/rollout_probs_diff_mean"
GAP_VALID_KEY = "training/rollout_probs_diff_valid"
GEN_TIME_KEY = "timing_s/gen"          # verl's time in generation, per step
STEP_TIME_KEY = "timing_s/step"        # present once a step has finished
ACTOR_MEMORY_KEY = "actor/perf/max_memory_reserved_gb"  # torch's peak in the training process
EXIT_BAD_INPUT = 2


class BadInput(Exception):
    """A machine the check cannot run on: one line for the user, exit 2."""


# --------------------------------------------------------------------------------------------
# input checks (standard library only)


def gpu_from_nvidia_smi(output: str, min_gib: float) -> tuple[str, float]:
    """(name, total GiB) of the first GPU in ``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits``
    output, or BadInput when there is none or it has less than ``min_gib``."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        raise BadInput("no GPU: nvidia-smi lists none")
    name, _, mib = lines[0].rpartition(",")
    try:
        total_gib = float(mib) / 1024
    except ValueError:
        raise BadInput(f"no GPU: cannot read nvidia-smi's line {lines[0]!r}") from None
    if total_gib < min_gib:
        raise BadInput(f"too little GPU memory: {name.strip()} has {total_gib:.1f} GiB, the check needs {min_gib:g} GiB "
                       f"(GPU_CHECK_MIN_GIB lowers the bar at your own risk)")
    return name.strip(), total_gib


def query_gpu(min_gib: float) -> tuple[str, float]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise BadInput("no GPU: nvidia-smi is not installed (this check needs one NVIDIA GPU of the H100/H200 class)") from None
    if out.returncode != 0:
        reason = (out.stderr or out.stdout).strip().splitlines()
        raise BadInput(f"no GPU: nvidia-smi failed ({reason[0] if reason else f'exit {out.returncode}'})")
    return gpu_from_nvidia_smi(out.stdout, min_gib)


def probe_index(url: str, timeout_s: float = 15) -> None:
    """BadInput unless ``url`` (the package index) answers at all."""
    try:
        urllib.request.urlopen(url, timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise BadInput(f"no network: the package index {url} does not answer ({reason}); install elsewhere or by hand "
                       f"and pass GPU_CHECK_VENV=/path/to/venv (verl[vllm]==0.9.1 and this package, see the header "
                       f"of scripts/gpu_check.sh) to skip the install, with MODEL_PATH=/a/local/model/folder") from None


def our_requirements(pyproject: Path) -> list[str]:
    """This package's dependencies but torch, transformers and verl, whose versions verl's extra pins."""
    import tomllib

    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if not d.replace("_", "-").lower().startswith(("torch", "transformers", "verl"))]


# --------------------------------------------------------------------------------------------
# the dry run: verl's own config validation, with our plugin loaded (import verl loads it)


def validate_runs(named_files: list[str]) -> int:
    """Compose verl's ppo_trainer config with each NAME=FILE's overrides (one a line) and validate it as main_ppo
    does; 0 when every one is valid, else 1 with verl's message."""
    import os

    from hydra import compose, initialize_config_dir

    import verl  # loads verl_agentic's plugin (the verl.plugins entry point)
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import validate_config

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    failed = 0
    for item in named_files:
        name, _, path = item.partition("=")
        overrides = [line for line in Path(path).read_text().splitlines() if line]
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                cfg = compose("ppo_trainer", overrides=overrides)
            get_trainer_cls(cfg.trainer.v1.trainer_mode)
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
            loop = cfg.actor_rollout_ref.rollout.agent.default_agent_loop
            if loop not in _agent_loop_registry:
                raise ValueError(f"agent loop {loop!r} is not registered with verl (is verl_agentic installed, "
                                 f"its verl.plugins entry point loaded?); registered: {sorted(_agent_loop_registry)}")
        except Exception as e:  # noqa: BLE001 - whatever verl or hydra refuses, in their words
            print(f"gpu_check: {name}: invalid: {type(e).__name__}: {e}", file=sys.stderr)
            failed += 1
            continue
        rollout = cfg.actor_rollout_ref.rollout
        print(f"gpu_check: {name}: valid (trainer_mode={cfg.trainer.v1.trainer_mode}, rollout={rollout.name} "
              f"{rollout.dtype}, device={cfg.trainer.device}, steps={cfg.trainer.total_training_steps})")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# the environment, recorded in the check's venv


def environment(commit: str) -> dict:
    from importlib import metadata

    def version(dist: str) -> Optional[str]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60).stdout.strip() or None
    except FileNotFoundError:
        gpu = None
    return {"gpu": gpu, "commit": commit, "python": sys.version.split()[0],
            **{dist: version(dist) for dist in ("verl", "vllm", "sglang", "torch", "transformers", "verl-agentic")}}


# --------------------------------------------------------------------------------------------
# reading one run's folder


def peak_gpu_memory_gib(path: Path) -> Optional[float]:
    if not path.exists():
        return None
    samples = [float(line.split(",")[0]) for line in path.read_text().splitlines() if line.strip()]
    return max(samples) / 1024 if samples else None


# --------------------------------------------------------------------------------------------
# judging one run, and the report


def judge_run(run: Path, *, steps: int, gap_bound: float, tokenizer, stops: list[int]) -> dict:
    """One run's figures and its failures (an empty list: it passed)."""
    from verl_agentic.inspect.runs import load_run, read_verl_metrics
    from verl_agentic.rollout.trajectory import drift_summary

    metrics = read_verl_metrics(run / "metrics.jsonl")
    exit_file = run / "exit_code"  # the trainer's exit status, written by gpu_check.sh
    exit_code = int(exit_file.read_text()) if exit_file.exists() else None
    finished = [s for s in range(1, steps + 1) if STEP_TIME_KEY in metrics.get(s, {})]
    failures = [f"step {s} did not finish (no {STEP_TIME_KEY} for it in metrics.jsonl)"
                for s in range(1, steps + 1) if s not in finished]
    if exit_code:
        failures.append(f"the trainer exited {exit_code} (see train.log)")

    gaps = {s: metrics[s][GAP_KEY] for s in finished if metrics[s].get(GAP_VALID_KEY) == 1 and GAP_KEY in metrics[s]}
    failures += [f"step {s}: no rollout-vs-trainer gap ({GAP_KEY} missing or {GAP_VALID_KEY} != 1)"
                 for s in finished if s not in gaps]
    failures += [f"step {s}: {GAP_KEY} = {g:.4g} is above the bound {gap_bound:g}"
                 for s, g in gaps.items() if not g <= gap_bound]  # NaN fails too

    # our trajectory dump (rollouts/step_NNNNNN.jsonl), every episode checked against the chat template
    episodes = load_run(run).trajectories if (run / "rollouts").is_dir() else []
    if not episodes:
        failures.append("no trajectories in rollouts/ (trainer.rollout_data_dir): the drift check had nothing to check")
    drift = drift_summary(episodes, tokenizer, {}, stops)
    bad = drift["episodes"] - drift["episodes_ok"]
    if bad:
        failures.append(f"drift: {bad} of {drift['episodes']} episodes are not token-exact "
                        f"({drift['injected_differing_tokens']} injected tokens differ from the chat template, "
                        f"{drift['structure_problems']} structure problems)")

    generated = sum(sum(t["response_mask"]) for t in episodes)
    gen_s = sum(metrics[s].get(GEN_TIME_KEY, 0.0) for s in finished)
    trainer_peaks = [metrics[s][ACTOR_MEMORY_KEY] for s in finished if ACTOR_MEMORY_KEY in metrics[s]]
    return {"exit_code": exit_code, "steps_expected": steps, "steps_finished": finished,
            "gap_key": GAP_KEY, "gap_by_step": gaps, "gap_max": max(gaps.values()) if gaps else None, "gap_bound": gap_bound,
            "generated_tokens": generated, "generation_s": gen_s,
            "rollout_tokens_per_s": generated / gen_s if gen_s > 0 else None,
            "drift": drift, "peak_gpu_memory_gib": peak_gpu_memory_gib(run / "gpu_memory.csv"),
            "trainer_peak_reserved_gib": max(trainer_peaks, default=None),
            "failures": failures}


def make_report(run_dir: Path, *, runs: list[str], model: str, steps: int, gap_bound: float) -> dict:
    from transformers import AutoTokenizer

    from verl_agentic.verl_plugin.agent_loop import model_stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(model)
    stops = model_stop_token_ids({"path": model}, tokenizer)  # the ids the runs' task_agent loop stopped on
    env_file = run_dir / "environment.json"
    report = {"model": model, "environment": json.loads(env_file.read_text()) if env_file.exists() else None,
              "runs": {name: judge_run(run_dir / name, steps=steps, gap_bound=gap_bound, tokenizer=tokenizer, stops=stops)
                       for name in runs}}
    report["passed"] = not any(r["failures"] for r in report["runs"].values())
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (run_dir / "report.md").write_text(markdown(report))
    return report


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(report: dict) -> str:
    env = report["environment"] or {}
    lines = [f"# GPU check: {'PASSED' if report['passed'] else 'FAILED'}", "",
             f"GPU: {env.get('gpu') or 'unknown'}; model {report['model']}; verl {env.get('verl')}, vllm {env.get('vllm')}, "
             f"sglang {env.get('sglang')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
             f"verl-agentic {env.get('verl-agentic')} at {env.get('commit')}", "",
             f"| run | steps | rollout tok/s | gap max ({GAP_KEY}) | drift (episodes exact) | peak GPU GiB | trainer peak GiB |",
             "|---|---|---|---|---|---|---|"]
    for name, r in report["runs"].items():
        d = r["drift"]
        lines.append(f"| {name} | {len(r['steps_finished'])}/{r['steps_expected']} | {_fmt(r['rollout_tokens_per_s'], '.0f')} "
                     f"| {_fmt(r['gap_max'], '.4f')} (bound {r['gap_bound']:g}) | {d['episodes_ok']}/{d['episodes']} "
                     f"| {_fmt(r['peak_gpu_memory_gib'], '.1f')} | {_fmt(r['trainer_peak_reserved_gib'], '.1f')} |")
    failures = [f"- {name}: {f}" for name, r in report["runs"].items() for f in r["failures"]]
    lines += ["", "## Failures", "", *failures] if failures else ["", "All checks passed."]
    lines += ["", f"rollout tok/s: generated tokens (loss mask 1) of the run's dumped training episodes over the sum of "
              f"verl's {GEN_TIME_KEY}; gap: verl's {GAP_KEY}, mean |p_trainer - p_rollout| over response tokens, "
              f"the largest of the steps; drift: verl_agentic's check_drift on every dumped episode; peak GPU: "
              f"nvidia-smi's memory.used, all processes; trainer peak: verl's {ACTOR_MEMORY_KEY}."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# command line


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check_report.py")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("gpu").add_argument("min_gib", type=float)
    sub.add_parser("probe").add_argument("url")
    sub.add_parser("requirements").add_argument("pyproject", type=Path)
    sub.add_parser("validate").add_argument("named_files", nargs="+", metavar="NAME=FILE")
    env = sub.add_parser("environment")
    env.add_argument("out", type=Path)
    env.add_argument("--commit", default="unknown")
    rep = sub.add_parser("report")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--model", required=True)
    rep.add_argument("--steps", type=int, required=True)
    rep.add_argument("--gap-bound", type=float, required=True)
    rep.add_argument("--runs", required=True, help="comma-separated run folders under RUN_DIR")
    args = p.parse_args(argv)
    try:
        if args.command == "gpu":
            name, gib = query_gpu(args.min_gib)
            print(f"{name}, {gib:.1f} GiB")
        elif args.command == "probe":
            probe_index(args.url)
        elif args.command == "requirements":
            print("\n".join(our_requirements(args.pyproject)))
        elif args.command == "validate":
            return validate_runs(args.named_files)
        elif args.command == "environment":
            args.out.write_text(json.dumps(environment(args.commit), indent=2) + "\n")
        else:
            report = make_report(args.run_dir, runs=args.runs.split(","), model=args.model, steps=args.steps,
                                 gap_bound=args.gap_bound)
            print((args.run_dir / "report.md").read_text(), end="")
            return 0 if report["passed"] else 1
    except BadInput as e:
        print(f"gpu_check.sh: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
