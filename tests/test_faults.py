"""The fault battery (issue 28): our CLIs as real processes, killed with SIGKILL, stopped with SIGTERM,
starved of disk space, and scoring against a reward service that dies; then run again.

Nothing finished may be lost or done twice, every line must parse, and what is run again must give what
an uninterrupted run gives. The runs stop at known points by watching files they write: the episodes
in ``trajectories.jsonl``, and a scorer (``va_scorers.va_marked_vowels``) that appends a line to a file
per sample it scores and then sleeps. The models are the tiny random Qwen2s; on 2 cores the whole file
takes about 4 minutes (the trainer's runs most of it: verl loads in ~8 s a process).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from va_services import ServiceProcess
from va_testing import REPO

TESTS = Path(__file__).resolve().parent
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))


def _start(module: str, *args: str, log: Path, env: dict = ENV) -> subprocess.Popen:
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.DEVNULL, stderr=err,
                                cwd=REPO, env=env)


def _run(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO, env=ENV,
                          timeout=timeout)


def _count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _stop_when(proc: subprocess.Popen, ready, sig: int, log: Path, timeout: float = 180) -> int:
    """Send ``sig`` to ``proc`` as soon as ``ready()`` holds; its exit code (it must not exit first)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before the point to stop it:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the point to stop the run never came:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)
    proc.send_signal(sig)
    return proc.wait(120)


def _lines(path: Path) -> list[dict]:
    """Every line of a JSON-lines file, each of which must parse (a torn or mangled line fails here)."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path} ends in a torn line"
    return [json.loads(line) for line in text.splitlines()]


def _keys(trajs: list[dict]) -> list[tuple[int, int]]:
    return [(t["index"], t["sample_id"]) for t in trajs]


def _same_episodes(got: list[dict], want: list[dict]) -> None:
    """The episodes of an interrupted and resumed run are those of an uninterrupted one: the same tokens
    (sampled with per-sample seeds) and scores; the logprobs agree to float error (a request's logits
    depend on which requests share its forward passes, ~1e-5: docs/rollouts.md)."""
    assert _keys(got) == _keys(want)
    for g, w in zip(got, want):
        assert g["response_ids"] == w["response_ids"] and g["messages"] == w["messages"], _keys([g])
        assert g["score"] == w["score"] and g["score_error"] is None
        for a, b in zip(g["response_logprobs"], w["response_logprobs"]):
            assert (a is None) == (b is None) and (a is None or abs(a - b) < 1e-4)


# ----------------------------------------------------------------------------------------------
# main_rollout

ROWS, N = 6, 2  # 12 episodes


def _rollout_args(model: Path, out: Path, marks: Path, *extra: str) -> list[str]:
    return [f"model.path={model}", f"data.max_samples={ROWS}", f"rollout.n={N}", "rollout.max_turns=2",
            "rollout.max_new_tokens=24", "task.gsm8k.feedback=always_verify", "rollout.concurrency=1",
            "reward.scorer=va_marked_vowels", "reward.scorer_modules=[va_scorers]",
            f"reward.scorer_kwargs={{va_marked_vowels: {{marks: '{marks}', sleep_s: 0.15}}}}",
            "reward.batch_size=2", "reward.concurrency=1", f"output.dir={out}", *extra]


def test_a_rollout_killed_at_any_point_continues_without_losing_or_repeating_an_episode(tiny_qwen_dir, tmp_path):
    ref = _run("verl_agentic.main_rollout", *_rollout_args(tiny_qwen_dir, tmp_path / "ref", tmp_path / "ref.marks"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = _lines(tmp_path / "ref" / "trajectories.jsonl")

    out, marks, log = tmp_path / "run", tmp_path / "run.marks", tmp_path / "run.log"
    args = _rollout_args(tiny_qwen_dir, out, marks)
    trajs = out / "trajectories.jsonl"
    # 1. killed while the model loads: the journal is there, no episode yet
    rc = _stop_when(_start("verl_agentic.main_rollout", *args, log=log), lambda: (out / "journal.json").exists(),
                    signal.SIGKILL, log)
    assert rc == -signal.SIGKILL and _count(trajs) == 0
    # 2. killed in the middle of the rollout
    rc = _stop_when(_start("verl_agentic.main_rollout", *args, log=log), lambda: _count(trajs) >= 4, signal.SIGKILL, log)
    assert rc == -signal.SIGKILL
    before = _lines(trajs)
    assert 4 <= len(before) < ROWS * N and len(set(_keys(before))) == len(before)
    with open(trajs, "ab") as f:  # constructed: what a kill during a write leaves (a kill seldom lands there)
        f.write(b'{"uid": "gsm8k-5", "task_type": "gsm8k", "index": 5, "sample_id": 1, "prompt_ids": [151644, 8')
    # 3. killed while scoring: the rollout finished, some scores are written down
    rc = _stop_when(_start("verl_agentic.main_rollout", *args, log=log), lambda: _count(marks) >= 5, signal.SIGKILL, log)
    assert rc == -signal.SIGKILL
    stderr = log.read_text()
    assert "dropped a torn last line" in stderr and f"{len(before)} of {ROWS * N} episodes already finished" in stderr
    assert len(_lines(trajs)) == ROWS * N
    scored_before = len(_lines(out / "scores.jsonl"))
    assert 2 <= scored_before < ROWS * N
    marks_before = _count(marks)
    # 4. run to the end
    done = _run("verl_agentic.main_rollout", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    got = _lines(trajs)
    _same_episodes(got, want)
    for b in before:  # the episodes written before the kills are in the final file as they were
        assert {k: v for k, v in got[_keys(got).index((b["index"], b["sample_id"]))].items() if not k.startswith("score")} == b
    assert _count(marks) - marks_before == ROWS * N - scored_before  # scoring continued, it did not start over
    assert not (out / "scores.jsonl").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["episodes"] == ROWS * N and summary["run"]["resumed_episodes"] == ROWS * N
    assert summary["tasks"]["gsm8k"]["episodes"] == ROWS * N and summary["reward"]["scored_now"] == ROWS * N - scored_before
    # run once more: everything is done, nothing is redone
    again = _run("verl_agentic.main_rollout", *args)
    assert again.returncode == 0 and _lines(trajs) == got and _count(marks) - marks_before == ROWS * N - scored_before


def test_a_rollout_stopped_with_sigterm_keeps_what_finished_and_says_how_to_continue(tiny_qwen_dir, tmp_path):
    out, log = tmp_path / "run", tmp_path / "run.log"
    # 16 episodes in flight, decoded 4 at a time: they finish in waves
    args = [f"model.path={tiny_qwen_dir}", "data.max_samples=8", "rollout.n=2", "rollout.max_turns=2",
            "rollout.max_new_tokens=32", "rollout.max_batch_size=4", "task.gsm8k.feedback=always_verify",
            f"output.dir={out}"]
    rc = _stop_when(_start("verl_agentic.main_rollout", *args, log=log),
                    lambda: _count(out / "trajectories.jsonl") >= 2, signal.SIGTERM, log)
    assert rc == 128 + signal.SIGTERM
    stderr = log.read_text().strip().splitlines()
    kept = _lines(out / "trajectories.jsonl")
    assert 2 <= len(kept) < 16 and len(set(_keys(kept))) == len(kept)
    assert all(t["error"] is None for t in kept)  # the episodes cut short were not written as finished ones
    assert f"[verl-agentic] stopped: {len(kept)} of 16 episodes and 0 scores are in {out}" in stderr
    command = stderr[-1]
    assert command.startswith("to continue, run: python -m verl_agentic.main_rollout ") and f"output.dir={out}" in command
    argv = shlex.split(command.removeprefix("to continue, run: "))
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = _lines(out / "trajectories.jsonl")
    assert _keys(got) == [(i, k) for i in range(8) for k in range(2)] and all("score" in t for t in got)


def test_a_rollout_whose_disk_fills_up_stops_with_one_line_and_keeps_its_episodes(tiny_qwen_dir, tmp_path):
    """A real full disk: a 32 KiB tmpfs mounted in a private mount namespace (``unshare``: root, as CI,
    or user namespaces), which disappears with the process; the output folder is copied out first."""
    mnt, kept, log = tmp_path / "mnt", tmp_path / "kept", tmp_path / "run.log"
    mnt.mkdir()
    args = _rollout_args(tiny_qwen_dir, mnt / "run", tmp_path / "marks", "output.quiet=true")
    script = ('mount -t tmpfs -o size=32k tmpfs "$1" || exit 99; shift; "$@"; rc=$?; cp -a "$0/run" "$0.kept"; exit $rc')
    with open(log, "w") as err:
        rc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mnt), str(mnt), sys.executable, "-m",
                             "verl_agentic.main_rollout", *args], stderr=err, stdout=subprocess.DEVNULL, cwd=REPO,
                            env=ENV, timeout=300).returncode
    shutil.move(str(mnt) + ".kept", kept)
    stderr = log.read_text()
    assert rc == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (f"error: [Errno 28] cannot append to {mnt}/run/trajectories.jsonl: No "
                                               f"space left on device; its earlier lines are intact")
    assert "Traceback" not in stderr
    before = _lines(kept / "trajectories.jsonl")  # whole lines only: the failed write was cut back off
    assert 1 <= len(before) < ROWS * N
    # with room again, the same command on the saved folder finishes the run
    done = _run("verl_agentic.main_rollout", *_rollout_args(tiny_qwen_dir, kept, tmp_path / "marks", "output.quiet=true"))
    assert done.returncode == 0, done.stderr[-3000:]
    got = _lines(kept / "trajectories.jsonl")
    assert _keys(got) == [(i, k) for i in range(ROWS) for k in range(N)]
    for b in before:
        assert {k: v for k, v in got[_keys(got).index((b["index"], b["sample_id"]))].items() if not k.startswith("score")} == b


def test_a_reward_service_that_dies_while_scoring_leaves_the_rest_to_score_on_the_next_run(tiny_qwen_dir, tmp_path):
    out, marks = tmp_path / "run", tmp_path / "marks"
    with ServiceProcess("verl_agentic.reward.server", "--manager", "naive", "--scorer-module", "va_scorers", "--quiet",
                        ready="reward server listening on ") as server:
        args = _rollout_args(tiny_qwen_dir, out, marks, "reward.manager=swedev", f"reward.url={server.url}",
                             "reward.max_retries=1", "reward.retry_backoff_s=0.05", "output.quiet=true")
        log = tmp_path / "run.log"
        proc = _start("verl_agentic.main_rollout", *args, log=log)
        deadline = time.monotonic() + 180
        while _count(marks) < 3:  # the service is scoring the second request
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        server.kill()
        assert proc.wait(120) == 0, log.read_text()[-3000:]
        stderr = log.read_text()
        got = _lines(out / "trajectories.jsonl")
        lost = [t for t in got if (t["score_error"] or {}).get("type") == "service_unavailable"]
        assert 1 <= len(lost) <= ROWS * N - 2 and all(t["score"] is None for t in lost)
        assert f"warning: {len(lost)} episodes could not be scored (the reward service was unavailable); run the " \
               "same command again to score them" in stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["tasks"]["gsm8k"]["score_errors"] == {"service_unavailable": len(lost)}

        server.restart()  # the same port: the same command
        marks_before = _count(marks)
        done = _run("verl_agentic.main_rollout", *args)
        assert done.returncode == 0, done.stderr[-3000:]
    final = _lines(out / "trajectories.jsonl")
    assert _keys(final) == _keys(got) and all(t["score_error"] is None and t["score"] is not None for t in final)
    assert _count(marks) - marks_before == len(lost)  # only those were scored again
    for before, after in zip(got, final):
        if before not in lost:
            assert after == before
    assert json.loads((out / "summary.json").read_text())["reward"]["scored_now"] == len(lost)


# ----------------------------------------------------------------------------------------------
# main_ppo

EPISODES_PER_STEP = 6


def _ppo_args(model: str, out: Path, marks: Path, *extra: str, sleep_s: float = 0.1) -> list[str]:
    """The settings of tests/test_trainer.py; ``rollout.concurrency=1`` makes every step's floats the same
    in every run (one request at a time: no batch composition to differ), so results compare bitwise."""
    return [f"model.path={model}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=16",
            "trainer.total_steps=3", "trainer.batch_size=2", "rollout.n=3", "rollout.max_turns=2",
            "rollout.max_new_tokens=12", "rollout.max_batch_size=8", "rollout.concurrency=1",
            "actor.ppo_mini_batch_size=6", "actor.ppo_micro_batch_size=3", "actor.optim.lr=1e-3",
            "task.gsm8k.feedback=always_verify", "reward.scorer=va_marked_vowels", "reward.scorer_modules=[va_scorers]",
            f"reward.scorer_kwargs={{va_marked_vowels: {{marks: '{marks}', sleep_s: {sleep_s}}}}}",
            "output.quiet=true", f"output.dir={out}", *extra]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "hf_model" / "model.safetensors")


def _continue(command: str) -> None:
    """Run ``command`` (the "to continue, run: ..." line a stopped run printed) to its end."""
    done = subprocess.run([sys.executable, *shlex.split(command.removeprefix("to continue, run: "))[1:]],
                          capture_output=True, text=True, cwd=REPO, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _metrics(folder: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(("timing/", "perf/"))} for m in _lines(folder / "metrics.jsonl")]


def test_training_stopped_with_sigterm_mid_step_resumes_to_the_same_weights_and_metrics(tiny_smol_dir, tmp_path):
    import torch

    ref = _run("verl_agentic.main_ppo", *_ppo_args(tiny_smol_dir, tmp_path / "ref", tmp_path / "ref.marks"))
    assert ref.returncode == 0, ref.stderr[-3000:]

    out, marks, log = tmp_path / "run", tmp_path / "marks", tmp_path / "run.log"
    args = _ppo_args(tiny_smol_dir, out, marks)
    # SIGTERM while step 2 scores its episodes (or, if it lands later, during its update: the stop then
    # waits for the step to be recorded); either way the checkpoint is of a step boundary
    rc = _stop_when(_start("verl_agentic.main_ppo", *args, log=log), lambda: _count(marks) > EPISODES_PER_STEP + 1,
                    signal.SIGTERM, log)
    stderr = log.read_text()
    assert rc == 128 + signal.SIGTERM, stderr[-3000:]
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved in (["step_000001"], ["step_000002"]), saved
    step = int(saved[0][-6:])
    assert f"training stopped in step {step + 1}: checkpoint of step {step} written to {out / 'checkpoints' / saved[0]}" in stderr
    assert [m["step"] for m in _lines(out / "metrics.jsonl")] == list(range(1, step + 1))
    command = stderr.strip().splitlines()[-1]
    assert command.startswith("to continue, run: python -m verl_agentic.main_ppo ") and command.endswith(
        f"output.dir={out} trainer.resume=true")
    _continue(command)
    assert _metrics(out) == _metrics(tmp_path / "ref")
    want, got = _weights(tmp_path / "ref"), _weights(out)
    assert all(torch.equal(got[k], want[k]) for k in want)
    for s in (1, 2, 3):
        a, b = (_lines(d / "rollouts" / f"step_{s:06d}.jsonl") for d in (out, tmp_path / "ref"))
        assert [t["response_ids"] for t in a] == [t["response_ids"] for t in b]


def test_training_through_a_reward_service_outage_warns_then_checkpoints_and_resumes(tiny_smol_dir, tmp_path):
    """A partial outage: the step trains on the episodes that got a reward, with a warning and
    ``reward/missing_share``; a whole step without rewards: the run fails with a checkpoint of the last
    step, and ``trainer.resume=true`` continues from it once the service is back."""
    out, marks, log = tmp_path / "run", tmp_path / "marks", tmp_path / "run.log"
    with ServiceProcess("verl_agentic.reward.server", "--manager", "naive", "--scorer-module", "va_scorers", "--quiet",
                        ready="reward server listening on ") as server:
        args = _ppo_args(tiny_smol_dir, out, marks, "reward.manager=swedev", f"reward.url={server.url}",
                         "reward.batch_size=2", "reward.concurrency=1", "reward.max_retries=1",
                         "reward.retry_backoff_s=0.05", sleep_s=0.3)  # step 2's scoring: 1.8 s to hit
        proc = _start("verl_agentic.main_ppo", *args, log=log)
        deadline = time.monotonic() + 180
        while _count(marks) < EPISODES_PER_STEP + 3:  # step 2's second request is being scored
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        server.kill()
        rc = proc.wait(180)
        stderr = log.read_text()
        assert rc == 1 and "RuntimeError: step 3: no episode has a reward and a generated token to train on" in stderr
        metrics = _lines(out / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2]
        assert metrics[0]["reward/missing_share"] == 0.0 and 0 < metrics[1]["reward/missing_share"] < 1
        missing = int(metrics[1]["reward/masked"])
        assert f"warning: step 2: {missing} of 6 episodes have no reward (service_unavailable: {missing}); the step " \
               "trains on the rest" in stderr
        assert "warning: step 3: 6 of 6 episodes have no reward (service_unavailable: 6)" in stderr
        assert "training failed (RuntimeError: step 3: no episode has a reward" in stderr
        assert "checkpoint of step 2 written to" in stderr and (out / "checkpoints" / "step_000002" / "state.pt").is_file()

        server.restart()
        done = _run("verl_agentic.main_ppo", *args, "trainer.resume=true")
        assert done.returncode == 0, done.stderr[-3000:]
    final = _lines(out / "metrics.jsonl")
    assert [m["step"] for m in final] == [1, 2, 3] and final[:2] == metrics and final[2]["reward/missing_share"] == 0.0


def test_training_whose_disk_fills_up_stops_with_one_line_and_keeps_its_files(tiny_smol_dir, tmp_path):
    """A 48 MiB tmpfs holds the checkpoint of step 0 (the weights, 25 MB, written as step 1 begins), not
    that of step 1 (with Adam's state, 75 MB, as step 2 begins): a clear error before step 2 runs, no
    partial checkpoint, the metrics and rollouts written before intact (see the rollout's disk test for
    the namespace)."""
    mnt, log = tmp_path / "mnt", tmp_path / "run.log"
    mnt.mkdir()
    args = _ppo_args(tiny_smol_dir, mnt / "run", tmp_path / "marks", "trainer.total_steps=3")
    script = 'mount -t tmpfs -o size=48m tmpfs "$1" || exit 99; shift; "$@"; rc=$?; cp -a "$0/run" "$0.kept"; exit $rc'
    with open(log, "w") as err:
        rc = subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mnt), str(mnt), sys.executable, "-m",
                             "verl_agentic.main_ppo", *args], stderr=err, stdout=subprocess.DEVNULL, cwd=REPO,
                            env=ENV, timeout=300).returncode
    kept = Path(str(mnt) + ".kept")
    stderr = log.read_text()
    assert rc == 1, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (f"error: [Errno 28] cannot write the checkpoint {mnt}/run/checkpoints/"
                                               f"step_000001: No space left on device")
    assert "Traceback" not in stderr
    assert "training failed (OSError: [Errno 28] cannot write the checkpoint" in stderr
    assert [m["step"] for m in _lines(kept / "metrics.jsonl")] == [1]
    assert [len(_lines(kept / "rollouts" / f"step_{s:06d}.jsonl")) for s in (1,)] == [6]
    # no partial checkpoint for resume to pick up: step 0's, whole
    assert [p.name for p in (kept / "checkpoints").iterdir()] == ["step_000000"]
    assert "task_type: gsm8k" in (kept / "config.yaml").read_text().splitlines()


STOP_BUDGET_S = 10.0  # SIGTERM in an update to exit, tiny model (docs/training.md: SmolLM2's worst case)


def test_sigterm_in_the_update_exits_within_its_budget_without_validating_and_resumes_exactly(tiny_smol_dir, tmp_path):
    """SIGTERM while step 2's policy update runs (``va_update_watch`` holds each update forward 3 s, so the
    signal lands in one): the run neither finishes the update nor validates after it; it exits within
    ``STOP_BUDGET_S`` with the checkpoint of step 1 (written as step 2 began), and the command it prints
    continues to the uninterrupted run's metrics and weights."""
    import torch

    val = ("data.val_path=data/gsm8k/test.jsonl", "data.val_max_samples=2", "trainer.test_freq=1",
           "imports=[va_update_watch]")
    ref = _run("verl_agentic.main_ppo", *_ppo_args(tiny_smol_dir, tmp_path / "ref", tmp_path / "ref.marks", *val))
    assert ref.returncode == 0, ref.stderr[-3000:]

    out, log, updates = tmp_path / "run", tmp_path / "run.log", tmp_path / "updates"
    env = dict(ENV, VA_UPDATE_MARKS=str(updates), VA_UPDATE_SLEEP_S="3")
    proc = _start("verl_agentic.main_ppo", *_ppo_args(tiny_smol_dir, out, tmp_path / "marks", *val), log=log, env=env)
    step_1_updates, signalled = [], []

    def in_step_2_update() -> bool:
        if not step_1_updates and _count(out / "metrics.jsonl") >= 2:  # the rows of steps 0 (validation) and 1
            step_1_updates.append(_count(updates))
        if step_1_updates and _count(updates) > step_1_updates[0]:
            signalled.append(time.monotonic())
            return True
        return False

    rc = _stop_when(proc, in_step_2_update, signal.SIGTERM, log)
    exit_s = time.monotonic() - signalled[0]
    stderr = log.read_text()
    assert rc == 128 + signal.SIGTERM, stderr[-3000:]
    assert exit_s < STOP_BUDGET_S, f"{exit_s:.1f} s from SIGTERM to exit"
    assert [m["step"] for m in _lines(out / "metrics.jsonl")] == [0, 1]
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step_000000.jsonl", "step_000001.jsonl"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001"]
    assert f"training stopped in step 2: checkpoint of step 1 written to {out / 'checkpoints' / 'step_000001'}" in stderr
    _continue(stderr.strip().splitlines()[-1])
    # the same episodes, token for token, and the same figures to float rounding: the engine's logprobs
    # depend on what it ran before (~1e-7 apart here, where validation runs between two steps)
    for s in (1, 2, 3):
        a, b = (_lines(d / "rollouts" / f"step_{s:06d}.jsonl") for d in (out, tmp_path / "ref"))
        assert [t["response_ids"] for t in a] == [t["response_ids"] for t in b]
    got, want = _metrics(out), _metrics(tmp_path / "ref")
    assert [m["step"] for m in got] == [0, 1, 2, 3] and [m.keys() for m in got] == [m.keys() for m in want]
    for g, w in zip(got, want):
        assert g == pytest.approx(w, rel=1e-3, abs=1e-5), g["step"]
    want, got = _weights(tmp_path / "ref"), _weights(out)
    for k in want:
        assert float((got[k] - want[k]).norm() / want[k].norm().clamp(min=1e-12)) < 1e-3, k
