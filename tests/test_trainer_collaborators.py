"""The trainer's collaborators (``verl_agentic/trainer/``), each on its own with real parts: the rows and
their bad rows (``data.py``), crash safety (``safety.py``), rollout correction on verl's helper
(``correction.py``), the metrics log (``metrics.py``), the monitors in the recipe (``monitoring.py``) and
the recording of rollouts (``recording.py``). How the recipe uses them, end to end: ``test_trainer.py``,
``test_faults.py``, ``test_rollout_correction.py``, ``test_monitors.py``, ``test_replay.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from va_testing import GSM8K_TEST
from verl_agentic.main_rollout import load_config
from verl_agentic.monitors import MonitorsConfig
from verl_agentic.tasks.data import DatasetError
from verl_agentic.trainer.verl_config import training_config

GOOD = GSM8K_TEST.read_text().splitlines()[:5]


def _conf(tmp_path: Path, *extra: str):
    return training_config(load_config([f"output.dir={tmp_path / 'run'}", "output.quiet=true", *extra],
                                       config_name="ppo"))


# ----------------------------------------------------------------------------------------------
# data.py


def _with_bad_rows(path: Path, good: list[str]) -> Path:
    path.write_text("\n".join([good[0], "{not json", *good[1:], json.dumps({"question": "2+2?"})]) + "\n")
    return path


def test_bad_rows_of_both_files_are_skipped_and_listed_or_fail(tmp_path):
    from verl_agentic.trainer.data import TrainData

    train, val = _with_bad_rows(tmp_path / "train.jsonl", GOOD[:3]), _with_bad_rows(tmp_path / "val.jsonl", GOOD[3:])
    paths = (f"data.path={train}", f"data.val_path={val}", "data.max_samples=100", "data.val_max_samples=100")
    with pytest.raises(DatasetError, match=rf"^{train}: line 2 is not valid JSON"):
        TrainData(_conf(tmp_path, *paths))
    data = TrainData(_conf(tmp_path, *paths, "data.on_bad_row=skip"))
    assert (len(data.rows), len(data.val_rows)) == (3, 2)
    assert [(Path(b.file).name, b.row) for b in data.skipped] == [("train.jsonl", 1), ("train.jsonl", 4),
                                                                  ("val.jsonl", 1), ("val.jsonl", 3)]
    said: list[str] = []
    data.write_skipped(tmp_path, said.append)
    listed = [json.loads(x) for x in (tmp_path / "skipped_rows.jsonl").read_text().splitlines()]
    assert [(b["row"], "answer" in b["reason"]) for b in listed] == [(1, False), (4, True), (1, False), (3, True)]
    assert said == [f"skipped 4 bad rows (data.on_bad_row=skip): {tmp_path / 'skipped_rows.jsonl'} lists them with "
                    f"their reasons"]
    clean = TrainData(_conf(tmp_path, f"data.path={GSM8K_TEST}"))
    clean.write_skipped(tmp_path / "clean", said.append)
    assert not clean.skipped and len(said) == 1 and not (tmp_path / "clean").exists()


def test_each_epoch_visits_every_row_once_and_a_restored_position_continues_the_same_order(tmp_path):
    from verl_agentic.trainer.data import TrainData

    c = _conf(tmp_path, f"data.path={GSM8K_TEST}", "data.max_samples=6", "trainer.batch_size=4", "seed=3")
    data = TrainData(c)
    seen = [r["extra_info"]["index"] for _ in range(6) for r in data.next_rows()]  # 24 rows: 4 epochs
    epochs = [seen[i:i + 6] for i in range(0, 24, 6)]
    assert all(sorted(e) == list(range(6)) for e in epochs) and len({tuple(e) for e in epochs}) > 1
    assert data.position() == {"epoch": 3, "cursor": 6}
    again = TrainData(c)
    again.restore(epoch=1, cursor=2)
    assert [r["extra_info"]["index"] for _ in range(4) for r in again.next_rows()] == seen[8:24]
    in_order = TrainData(_conf(tmp_path, f"data.path={GSM8K_TEST}", "data.max_samples=6", "data.shuffle=false"))
    assert [r["extra_info"]["index"] for r in in_order.next_rows()] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------------------------
# safety.py


class _Weights:
    """What a checkpoint holds besides the boundary: a tensor the "update" changes in place."""

    def __init__(self) -> None:
        self.w = torch.zeros(4)

    def __call__(self) -> dict:
        return {"model": {"w": self.w}}


def test_the_boundary_a_step_began_from_is_what_a_crash_in_its_update_leaves(tmp_path, capsys):
    from verl_agentic.trainer.safety import CrashSafety

    weights = _Weights()
    safety = CrashSafety(tmp_path, weights, max_checkpoints=2, save_step_boundary=True)
    safety.step_recorded({"step": 0})
    for step in (1, 2):
        safety.step_begins()  # the boundary of step - 1, transient
        safety.update_begins()
        weights.w += 1  # the update
        assert [p.name for p in tmp_path.iterdir()] == [f"step_{step - 1:06d}"] and safety.dirty
        safety.step_recorded({"step": step})
    safety.step_begins()
    safety.update_begins()
    weights.w += 1  # step 3's update, then a crash in it
    safety.on_failure(RuntimeError("out of memory"))
    assert capsys.readouterr().err.strip() == (f"[verl-agentic] training failed (RuntimeError: out of memory) in step 3: "
                                               f"checkpoint of step 2 written to {tmp_path / 'step_000002'}")
    state, folder = CrashSafety(tmp_path, weights, 2, True).load_latest()
    assert folder == tmp_path / "step_000002" and state["step"] == 2 and torch.equal(state["model"]["w"], torch.full((4,), 2.0))
    safety.step_recorded({"step": 3})
    safety.step_begins()  # a transient one gives way to the next; the one a failure left is kept
    safety.step_recorded({"step": 4})
    safety.step_begins()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000004"]


def test_without_the_boundary_on_disk_a_crash_in_an_update_leaves_the_earlier_checkpoint(tmp_path, capsys):
    from verl_agentic.trainer.safety import CrashSafety

    weights = _Weights()
    safety = CrashSafety(tmp_path, weights, max_checkpoints=2, save_step_boundary=False)
    safety.step_recorded({"step": 0})
    safety.save()
    for step in (1, 2):
        safety.step_begins()  # writes nothing
        safety.update_begins()
        weights.w += 1
        if step == 1:
            safety.step_recorded({"step": 1})
    safety.on_failure(KeyboardInterrupt())
    assert capsys.readouterr().err.strip() == (
        f"[verl-agentic] training stopped during step 2's update: the weights are between two steps, no checkpoint "
        f"written (trainer.save_step_boundary=false); the latest is {tmp_path / 'step_000000'}")
    assert [p.name for p in tmp_path.iterdir()] == ["step_000000"]


# ----------------------------------------------------------------------------------------------
# correction.py


def _batch(seed: int = 0):
    from verl_agentic.trainer.batch import build_batch

    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(4):
        n = 6 + i
        trajs.append({"uid": str(i), "index": i, "prompt_ids": [1, 2, 3], "response_ids": list(range(10, 10 + n)),
                      "response_mask": [1] * n, "response_logprobs": (-torch.rand(n, generator=g) - 0.1).tolist()})
    return build_batch(trajs, [1.0, 0.0, 1.0, 0.0], pad_id=0)


def test_rollout_correction_puts_verls_weights_and_rejections_on_the_batch(tmp_path):
    from verl.trainer.ppo import rollout_corr_helper

    from verl_agentic.trainer.batch import to_dataproto
    from verl_agentic.trainer.correction import RolloutCorrection
    from verl_agentic.trainer.verl_config import algo_config

    rc = "algorithm.rollout_correction."
    c = _conf(tmp_path, f"{rc}rollout_is=token", f"{rc}rollout_is_threshold=1.5", f"{rc}rollout_rs=token_k1",
              f"{rc}rollout_rs_threshold=\"0.5_1.5\"")
    said: list[str] = []
    corr = RolloutCorrection(c, algo_config(c).rollout_correction, said.append)
    assert corr.recompute and corr.needs_rollout_logprobs and len(said) == 1 and "overridden" in said[0]
    batch = _batch()
    old = batch.rollout_log_probs + 0.6 * (torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1)) - 0.5)
    data = to_dataproto(batch)
    data.batch["old_log_probs"] = old * batch.response_mask
    expect, expect_metrics = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(
        to_dataproto(batch).union(data.select(batch_keys=["old_log_probs"])), corr.verl_config)
    metrics: dict = {}
    corr.apply(data, batch, metrics)
    assert torch.equal(batch.response_mask, expect.batch["response_mask"]) and bool((batch.response_mask == 0).any())
    assert torch.equal(batch.extra["rollout_is_weights"], expect.batch["rollout_is_weights"])
    assert float(batch.extra["rollout_is_weights"].max()) <= 1.5 and metrics.keys() == expect_metrics.keys()
    with pytest.raises(RuntimeError, match="step 7: algorithm.rollout_correction needs the rollout's logprobs"):
        corr.check(7, missing_logprobs=True)
    off = RolloutCorrection(_conf(tmp_path), None, said.append)
    off.check(7, missing_logprobs=True)  # nothing to correct: the trainer recomputes them instead
    assert not off.recompute and len(said) == 1


# ----------------------------------------------------------------------------------------------
# metrics.py


def test_the_metrics_log_writes_whole_lines_and_a_resume_keeps_the_steps_before_it(tmp_path):
    from verl_agentic.trainer.metrics import MetricsLog

    log = MetricsLog(_conf(tmp_path), tmp_path)
    log.write(0, {"val/reward/mean": 0.5}, [])
    for step in (1, 2, 3):
        log.write(step, {"reward/mean": step / 10, "actor/grad_norm": float("nan")}, [{"step": step, "uid": "x"}])
    rows = [json.loads(x) for x in log.path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[1]["actor/grad_norm"] is None  # NaN: null
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [f"step_00000{s}.jsonl" for s in (1, 2, 3)]
    kept = log.keep_until(2)  # the base model's validation (step 0) stays with the steps kept
    assert [r["step"] for r in kept] == [0, 1, 2] == [json.loads(x)["step"] for x in log.path.read_text().splitlines()]
    assert log.keep_until(0) == [] and log.path.read_text() == ""  # at step 0 the validation is redone too


# ----------------------------------------------------------------------------------------------
# monitoring.py


def _collapsed(n: int) -> list[dict]:
    return [{"uid": str(i), "reward": 0.0, "metrics": {},
             "turns": [{"role": "assistant", "start": 0, "end": 5, "info": {"answer": "12"}}],
             "messages": [{"role": "assistant", "content": "#### 12"}]} for i in range(n)]


def test_the_monitors_warn_once_stop_when_asked_and_a_resume_replays_their_history(capsys):
    from verl_agentic.trainer.monitoring import StepMonitors

    monitors = StepMonitors(MonitorsConfig(stop_on=["answer_collapse"]), enabled=True)
    metrics: dict = {}
    monitors.observe(1, metrics, _collapsed(8), [0.0] * 8)
    assert metrics["batch/answer_top_share"] == 1.0 and metrics["monitor/answer_collapse/firing"] == 1.0
    assert monitors.stop is not None and monitors.stop.monitor == "answer_collapse"
    assert capsys.readouterr().err.count("WARNING monitor answer_collapse fired at step 1") == 1
    monitors.replay([{"step": 1, **metrics}])  # a resumed run: the history, without stopping again
    assert monitors.stop is None
    off = StepMonitors(MonitorsConfig(), enabled=False)
    metrics = {}
    off.observe(1, metrics, _collapsed(8))
    assert metrics == {} and off.stop is None


# ----------------------------------------------------------------------------------------------
# recording.py


def test_a_rollout_is_recorded_into_a_fresh_folder_only_with_output_record(tmp_path, tiny_qwen_dir):
    from verl_agentic.config import make_backend
    from verl_agentic.trainer.recording import RolloutRecording, recording_writer

    off = RolloutRecording(_conf(tmp_path), tmp_path)
    c = _conf(tmp_path, "output.record=true", f"model.path={tiny_qwen_dir}")
    backend = make_backend(c)
    assert off.target("step_000001", backend, c.rollout, seed=7) is None
    on = RolloutRecording(c, tmp_path)
    assert on.target("", backend, c.rollout, seed=7) is None  # a rollout with no name is not recorded
    stale = tmp_path / "recordings" / "step_000001" / "recording.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text("an episode of the step before a resume\n")
    folder, header = on.target("step_000001", backend, c.rollout, seed=7)
    assert folder == stale.parent and not folder.exists()  # made afresh: a redone step records again
    assert header["seed"] == 7 and header["default_task_type"] == "gsm8k" and header["config"] == c.raw
    with recording_writer((folder, header)) as writer:
        assert writer.recorded == set()
    assert json.loads((folder / "recording.json").read_text())["seed"] == 7
    with recording_writer(None) as writer:
        assert writer is None
