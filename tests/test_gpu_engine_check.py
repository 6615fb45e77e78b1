"""scripts/gpu_engine_check.py, the GPU check of our own engine, runs here on the CPU as a smoke run (its
figures judge nothing at --quick), and its judge fails a report for each reason it names."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_engine_check.py"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("gpu_engine_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(check, tiny_smol_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("engine_check")
    rc = check.main(["--device", "cpu", "--quick", "--model", tiny_smol_dir, "--out", str(out)])
    return rc, json.loads((out / "engine_check.json").read_text()), (out / "engine_check.md").read_text()


def test_a_cpu_smoke_run_writes_every_figure_for_both_dtypes(smoke):
    rc, report, md = smoke
    assert rc == 0 and report["quick"] and report["failed"] == []
    assert [r["dtype"] for r in report["dtypes"]] == ["float32", "bfloat16"]
    f32, bf16 = report["dtypes"]
    # the engine's fp32 logprobs are the plain forward's on this CPU (the suite's own bound elsewhere: 1e-4)
    assert f32["greedy"]["tokens"] > 0 and f32["greedy"]["gap_max"] < 1e-4
    assert f32["greedy"]["greedy_agree"] == 1.0
    assert f32["batch_invariance"]["same_tokens"] == f32["batch_invariance"]["requests"] == 4
    assert "fp32_gap_max" in bf16["sampled"] and "fp32_gap_max" not in f32["sampled"]
    assert bf16["sampled"]["gap_max"] > 0  # bf16 is compared, not assumed equal
    assert f32["sampler"]["draws"] == 400 and 0.0 <= f32["sampler"]["p"] <= 1.0
    assert report["versions"]["torch"] == torch.__version__ and len(report["versions"]["commit"]) >= 7
    assert "| float32 |" in md and "| bfloat16 |" in md and "judge nothing" in md


def test_the_judge_names_each_failure(check, smoke):
    report = copy.deepcopy(smoke[1])
    assert check.judge(report, quick=True) == []
    f32 = report["dtypes"][0]
    f32["sampler"].update(p=0.9, control_p_t08=1e-9)  # what a full run at 4,000 draws must show
    f32["greedy"].update(gap_max=0.0, greedy_flip_margin_max=0.0)
    f32["sampled"]["gap_max"] = 0.0
    report["dtypes"][1]["sampler"].update(p=0.9, control_p_t08=1e-9)
    assert check.judge(report, quick=False) == []
    f32["sampler"]["p"] = 1e-5
    f32["sampled"]["gap_max"] = 2e-3
    f32["greedy"]["greedy_flip_margin_max"] = 0.5
    f32["batch_invariance"]["same_tokens"] = 3
    report["dtypes"][1]["sampler"]["control_p_t08"] = 0.5
    failed = check.judge(report, quick=False)
    assert len(failed) == 5, failed
    assert any("not the softmax" in f for f in failed) and any("T=0.8" in f for f in failed)
    assert any("float32 sampled: logprob gap" in f for f in failed) and any("not a near-tie" in f for f in failed)
    assert any("alone than in the batch" in f for f in failed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where there is no CUDA device")
def test_without_a_cuda_device_it_says_so_in_one_line(check, capsys):
    assert check.main(["--device", "cuda", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
