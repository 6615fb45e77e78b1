"""scripts/gpu_check.sh on this CPU: its dry run (verl's config validation of each GPU run, our plugin loaded),
its bad-input lines, and its report's judge on run folders in the formats the GPU runs write (verl's file
logger, our trajectory dump from a real main_rollout run). Nothing here ran on a GPU."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from va_testing import REPO

SCRIPT = REPO / "scripts" / "gpu_check.sh"
# `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` lines with the totals an H100 SXM and an
# A10G report (written by hand in nvidia-smi's format, not captured here): stand-ins for GPUs this machine lacks
H100_LINE = "NVIDIA H100 80GB HBM3, 81559"
A10G_LINE = "NVIDIA A10G, 23028"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_check_report", REPO / "scripts" / "gpu_check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str, path_dirs: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess:
    """The script as a user runs it; ``path_dirs`` go in front of a PATH without nvidia-smi."""
    base = {k: v for k, v in os.environ.items() if k not in ("GPU_CHECK_VENV", "PIP_INDEX_URL")}
    base["PATH"] = os.pathsep.join([*path_dirs, *(p for p in base["PATH"].split(os.pathsep)
                                                  if not (Path(p) / "nvidia-smi").exists())])
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**base, "PYTHON": sys.executable, **env})


def _fake_nvidia_smi(folder: Path, line: str) -> str:
    """A stand-in nvidia-smi printing a given line (this machine has no GPU)."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   "  *memory.used*) echo 30000; echo 41000 ;;\n"  # the sampler's query: MiB used, a sample a line
                   "  *driver_version*) echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15' ;;\n"  # the environment's
                   f"  *) echo '{line}' ;;\nesac\n")
    exe.chmod(0o755)
    return str(folder)


# --------------------------------------------------------------------------------------------
# the dry run


@pytest.mark.parametrize("rollout", ["vllm", "sglang"])
def test_dry_run_validates_each_gpu_run_with_verl(rollout, tmp_path):
    out = _run("--dry-run", "--rollout", rollout, OUT=str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr[-3000:]
    for mode in ("sync", "colocate_async"):
        assert (f"gpu_check: {mode}/{rollout}: valid (trainer_mode={mode}, rollout={rollout} bfloat16, device=cuda, "
                f"steps=2)") in out.stdout
        would = next(line for line in out.stdout.splitlines() if line.startswith(f"gpu_check: would run ({mode},"))
        assert f"trainer.rollout_data_dir={tmp_path / 'out' / mode} " in would and "DEVICE=gpu" in would
    assert not (tmp_path / "out").exists()  # nothing installed, nothing written


def test_dry_run_composes_the_launch_scripts_gpu_overrides_then_the_checks(tmp_path):
    """The configuration validated is run_gsm8k_multiturn.sh's GPU one with the check's overrides after it."""
    launch = subprocess.run(["bash", str(REPO / "scripts" / "run_gsm8k_multiturn.sh"), "--print-overrides"],
                            capture_output=True, text=True, check=True, env={**os.environ, "DEVICE": "gpu"})
    fake = tmp_path / "py"  # in place of python: keeps the files the script hands to `validate`
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *=/*) cp \"${a#*=}\" " + str(tmp_path) +
                    "/\"$(echo \"${a%%=*}\" | tr / _)\".txt;; esac; done\n")
    fake.chmod(0o755)
    out = _run("--dry-run", PYTHON=str(fake), OUT=str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    composed = (tmp_path / "colocate_async_vllm.txt").read_text().splitlines()
    n = len(launch.stdout.splitlines())
    assert composed[:n] == [line.replace('["console"]', '["console","file"]') for line in launch.stdout.splitlines()]
    assert composed[n:n + 3] == ["trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.name=vllm",
                                 "actor_rollout_ref.rollout.dtype=bfloat16"]


def test_dry_run_fails_with_verls_message_on_a_broken_override(tmp_path):
    out = _run("--dry-run", "actor_rollout_ref.actor.ppo_mini_batch_size=1000", OUT=str(tmp_path / "out"))
    assert out.returncode == 1
    assert ("gpu_check: sync/vllm: invalid: ValueError: train_batch_size (16) must be >= actor.ppo_mini_batch_size "
            "(1000)") in out.stderr


def test_dry_run_refuses_an_unknown_trainer_mode(tmp_path):
    out = _run("--dry-run", "trainer.v1.trainer_mode=no_such_mode", OUT=str(tmp_path / "out"))
    assert out.returncode == 1 and "Unknown trainer 'no_such_mode'" in out.stderr


# --------------------------------------------------------------------------------------------
# bad input: one line each, exit 2


def _one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr)
    return lines[0]


def test_no_gpu_is_one_line(tmp_path):
    """For real: this machine has no GPU and no nvidia-smi."""
    line = _one_line(_run(OUT=str(tmp_path / "out")))
    assert line.startswith("gpu_check.sh: no GPU: nvidia-smi is not installed")
    assert not (tmp_path / "out").exists()


def test_no_network_is_one_line_naming_the_way_out(tmp_path):
    """For real: the index URL is a closed port on this machine (a stand-in nvidia-smi gets the script there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the socket is
    line = _one_line(_run(path_dirs=(_fake_nvidia_smi(tmp_path / "bin", H100_LINE),), OUT=str(tmp_path / "out"),
                          PIP_INDEX_URL=f"http://127.0.0.1:{port}/simple"))
    assert line.startswith(f"gpu_check.sh: no network: the package index http://127.0.0.1:{port}/simple/verl/ does not answer")
    assert "GPU_CHECK_VENV=/path/to/venv" in line and "MODEL_PATH=" in line
    assert not (tmp_path / "out" / "venv").exists()


def test_too_little_gpu_memory_is_one_line(check, tmp_path):
    """A stand-in: an nvidia-smi line of a 24 GB GPU (this machine has no GPU)."""
    with pytest.raises(check.BadInput, match=r"too little GPU memory: NVIDIA A10G has 22.5 GiB, the check needs 40 GiB"):
        check.gpu_from_nvidia_smi(A10G_LINE + "\n", 40)
    assert check.gpu_from_nvidia_smi(H100_LINE + "\n", 40) == ("NVIDIA H100 80GB HBM3", pytest.approx(79.65, abs=0.01))
    line = _one_line(_run(path_dirs=(_fake_nvidia_smi(tmp_path / "bin", A10G_LINE),), OUT=str(tmp_path / "out")))
    assert line.startswith("gpu_check.sh: too little GPU memory: NVIDIA A10G has 22.5 GiB")


def test_a_venv_without_python_is_one_line(tmp_path):
    line = _one_line(_run(path_dirs=(_fake_nvidia_smi(tmp_path / "bin", H100_LINE),), OUT=str(tmp_path / "out"),
                          GPU_CHECK_VENV=str(tmp_path / "nothing")))
    assert line == f"gpu_check.sh: GPU_CHECK_VENV={tmp_path / 'nothing'} has no bin/python"


def test_the_install_keeps_verls_pins(check):
    """This package's own torch/transformers pins (the CPU build's) stay out of the GPU install."""
    reqs = check.our_requirements(REPO / "pyproject.toml")
    assert reqs and not any(r.startswith(("torch", "transformers", "verl")) for r in reqs)
    assert "gguf==0.19.0" in reqs


# --------------------------------------------------------------------------------------------
# the report and its judge


@pytest.fixture(scope="module")
def episodes(tiny_qwen_dir, tmp_path_factory) -> list[dict]:
    """Real trajectories: main_rollout on a tiny Qwen2 (Qwen2.5's tokenizer), gsm8k with a feedback turn each."""
    from verl_agentic.main_rollout import load_config, run

    out = tmp_path_factory.mktemp("rollout")
    run(load_config([f"model.path={tiny_qwen_dir}", "data.max_samples=4", "rollout.max_new_tokens=8",
                     "rollout.max_turns=2", "task.gsm8k.feedback=always_verify", "output.quiet=true",
                     f"output.dir={out}"]))
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines() if line.strip()]
    assert any(t["role"] != "assistant" for r in rows for t in r["turns"])  # the drift case needs an injected turn
    return rows


def _verl_metrics_line(step: int, gap: float, gen_s: float) -> str:
    """A step as verl's file logger writes it (keys as in a real CPU run's metrics.jsonl)."""
    return json.dumps({"step": step, "data": {
        "training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": gap * 40,
        "training/rollout_probs_diff_mean": gap, "training/rollout_probs_diff_std": gap * 3,
        "training/rollout_actor_probs_pearson_corr": 0.999, "actor/perf/max_memory_reserved_gb": 21.5,
        "timing_s/gen": gen_s, "timing_s/step": gen_s + 20.0, "training/global_step": step}}) + "\n"


def _write_run(folder: Path, episodes: list[dict], *, gaps=(0.004, 0.006), steps=(1, 2)) -> Path:
    (folder / "rollouts").mkdir(parents=True)
    for step in steps:
        with open(folder / "metrics.jsonl", "a") as f:
            f.write(_verl_metrics_line(step, gaps[step - 1], gen_s=2.0 * step))
        with open(folder / "rollouts" / f"step_{step - 1:06d}.jsonl", "w") as f:  # the weight version they sampled
            for t in episodes:
                f.write(json.dumps({**t, "step": step - 1, "agent_name": "task_agent"}) + "\n")
    (folder / "gpu_memory.csv").write_text("1024\n40960\n30000\n")
    return folder


@pytest.fixture
def good_dir(tmp_path, episodes, check) -> Path:
    for mode in ("sync", "colocate_async"):
        _write_run(tmp_path / mode, episodes)
    (tmp_path / "environment.json").write_text(json.dumps(check.environment("abc1234")))
    return tmp_path


def _report(check, run_dir: Path, model) -> tuple[int, dict, str]:
    rc = check.main(["report", str(run_dir), "--model", str(model), "--steps", "2", "--gap-bound", "0.02",
                     "--runs", "sync,colocate_async"])
    return rc, json.loads((run_dir / "report.json").read_text()), (run_dir / "report.md").read_text()


def test_report_passes_a_good_run(check, good_dir, episodes, tiny_qwen_dir):
    rc, report, md = _report(check, good_dir, tiny_qwen_dir)
    assert rc == 0 and report["passed"], report
    sync = report["runs"]["sync"]
    assert sync["steps_finished"] == [1, 2] and sync["failures"] == []
    assert sync["gap_key"] == "training/rollout_probs_diff_mean" and sync["gap_max"] == 0.006
    assert sync["drift"]["episodes"] == sync["drift"]["episodes_ok"] == 2 * len(episodes)
    generated = 2 * sum(sum(t["response_mask"]) for t in episodes)
    assert sync["rollout_tokens_per_s"] == pytest.approx(generated / (2.0 + 4.0))
    assert sync["peak_gpu_memory_gib"] == 40.0 and sync["trainer_peak_reserved_gib"] == 21.5
    env = report["environment"]
    assert env["commit"] == "abc1234" and env["verl"] == "0.9.1" and env["gpu"] is None  # no GPU here
    assert md.startswith("# GPU check: PASSED") and "| sync | 2/2 |" in md and "All checks passed." in md


def test_report_fails_on_drift(check, tmp_path, episodes, tiny_qwen_dir):
    broken = copy.deepcopy(episodes)
    turn = next(t for t in broken[0]["turns"] if t["role"] != "assistant")  # a feedback turn the loop injected
    broken[0]["response_ids"][turn["start"]] += 1
    _write_run(tmp_path / "sync", episodes)
    _write_run(tmp_path / "colocate_async", broken)
    rc, report, md = _report(check, tmp_path, tiny_qwen_dir)
    assert rc == 1 and not report["passed"] and report["runs"]["sync"]["failures"] == []
    [failure] = report["runs"]["colocate_async"]["failures"]
    assert failure.startswith(f"drift: 2 of {2 * len(episodes)} episodes") and "2 injected tokens differ" in failure  # one episode, both steps
    assert md.startswith("# GPU check: FAILED") and f"- colocate_async: {failure}" in md


def test_report_fails_on_a_gap_above_the_bound(check, tmp_path, episodes, tiny_qwen_dir):
    _write_run(tmp_path / "sync", episodes, gaps=(0.004, 0.031))
    _write_run(tmp_path / "colocate_async", episodes)
    rc, report, _ = _report(check, tmp_path, tiny_qwen_dir)
    assert rc == 1 and report["runs"]["sync"]["failures"] == [
        "step 2: training/rollout_probs_diff_mean = 0.031 is above the bound 0.02"]


def test_report_fails_on_a_step_that_did_not_finish(check, tmp_path, episodes, tiny_qwen_dir):
    _write_run(tmp_path / "sync", episodes)
    _write_run(tmp_path / "colocate_async", episodes, steps=(1,))
    rc, report, md = _report(check, tmp_path, tiny_qwen_dir)
    assert rc == 1 and report["runs"]["colocate_async"]["steps_finished"] == [1]
    assert report["runs"]["colocate_async"]["failures"] == [
        "step 2 did not finish (no timing_s/step for it in metrics.jsonl)"]
    assert "| colocate_async | 1/2 |" in md


def test_report_fails_a_run_that_never_started(check, tmp_path, episodes, tiny_qwen_dir):
    _write_run(tmp_path / "sync", episodes)
    (tmp_path / "sync" / "exit_code").write_text("0\n")
    (tmp_path / "colocate_async").mkdir()  # the trainer died before its first step: no metrics, no dump
    (tmp_path / "colocate_async" / "exit_code").write_text("1\n")
    rc, report, _ = _report(check, tmp_path, tiny_qwen_dir)
    failures = report["runs"]["colocate_async"]["failures"]
    assert rc == 1 and report["runs"]["sync"]["failures"] == []
    assert failures[:3] == [*(f"step {s} did not finish (no timing_s/step for it in metrics.jsonl)" for s in (1, 2)),
                            "the trainer exited 1 (see train.log)"]
    assert failures[3].startswith("no trajectories in rollouts/")


def test_the_readmes_good_report_has_the_reports_columns(check):
    """README.md shows a passing report: its lines are the ones markdown() writes."""
    readme = (REPO / "README.md").read_text()
    table_head = next(line for line in check.markdown({"environment": None, "model": "m", "passed": True, "runs": {}})
                      .splitlines() if line.startswith("| run |"))
    assert "# GPU check: PASSED" in readme and table_head in readme and "All checks passed." in readme


# --------------------------------------------------------------------------------------------
# the run path end to end, with stand-ins for the GPU and the trainer


STAND_IN_TRAINER = '''
import json, os, sys
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
out, steps = args["trainer.rollout_data_dir"], int(args["trainer.total_training_steps"])
with open(os.environ["VERL_FILE_LOGGER_PATH"] + ".argv", "w") as f:
    f.write("\\n".join(sys.argv[1:]))
os.makedirs(os.path.join(out, "rollouts"), exist_ok=True)
episodes = open(os.environ["STAND_IN_EPISODES"]).read().splitlines()
for step in range(1, steps + 1 - (args["trainer.v1.trainer_mode"] == os.environ.get("STAND_IN_DIE_IN", ""))):
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as f:
        f.write(json.dumps({"step": step, "data": {"training/rollout_probs_diff_valid": 1,
                "training/rollout_probs_diff_mean": 0.005, "timing_s/gen": 1.5, "timing_s/step": 9.0}}) + "\\n")
    with open(os.path.join(out, "rollouts", f"step_{step - 1:06d}.jsonl"), "w") as f:
        f.writelines(json.dumps({**json.loads(e), "step": step - 1}) + "\\n" for e in episodes)
sys.exit(1 if args["trainer.v1.trainer_mode"] == os.environ.get("STAND_IN_DIE_IN", "") else 0)
'''


def _stand_in_venv(folder: Path) -> Path:
    """GPU_CHECK_VENV whose python is this one, except that verl's trainer is STAND_IN_TRAINER."""
    (folder / "bin").mkdir(parents=True)
    (folder / "trainer.py").write_text(STAND_IN_TRAINER)
    py = folder / "bin" / "python"
    py.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = verl.trainer.main_ppo ]; then shift 2; '
                  f'exec {sys.executable} {folder / "trainer.py"} "$@"; fi\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")  # the launch script's parquet files, made by the first run


@pytest.mark.parametrize("die_in", ["", "colocate_async"])
def test_the_run_path_writes_and_judges_the_report(die_in, tmp_path, episodes, tiny_qwen_dir, data_dir):
    """Everything but the GPU and verl's trainer is real: the data, the launch script, the environment record,
    the memory sampler, the report. A trainer dying after its first step fails the check."""
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    out = _run(path_dirs=(_fake_nvidia_smi(tmp_path / "bin", H100_LINE),), OUT=str(tmp_path / "out"),
               GPU_CHECK_VENV=str(_stand_in_venv(tmp_path / "venv")), MODEL_PATH=str(tiny_qwen_dir),
               DATA_DIR=str(data_dir), STAND_IN_EPISODES=str(tmp_path / "episodes.jsonl"),
               STAND_IN_DIE_IN=die_in)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    argv = (tmp_path / "out" / "sync" / "metrics.jsonl.argv").read_text().splitlines()
    assert f"actor_rollout_ref.model.path={tiny_qwen_dir}" in argv and "trainer.logger=[\"console\",\"file\"]" in argv
    assert f"trainer.rollout_data_dir={tmp_path / 'out' / 'sync'}" in argv and "trainer.v1.trainer_mode=sync" in argv
    assert report["environment"]["gpu"] == "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54.15"
    assert report["model"] == str(tiny_qwen_dir)
    assert report["runs"]["sync"]["failures"] == [] and report["runs"]["sync"]["exit_code"] == 0
    assert report["runs"]["sync"]["peak_gpu_memory_gib"] == pytest.approx(41000 / 1024)  # the sampler ran
    if not die_in:
        assert out.returncode == 0 and report["passed"], out.stdout[-3000:] + out.stderr[-3000:]
        assert "# GPU check: PASSED" in out.stdout
    else:
        assert out.returncode == 1 and report["runs"]["colocate_async"]["failures"] == [
            "step 2 did not finish (no timing_s/step for it in metrics.jsonl)", "the trainer exited 1 (see train.log)"]
