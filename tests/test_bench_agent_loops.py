"""bench/agent_loops_vllm.py's own pieces, without verl's trainer: the few-shot data, the per-loop table and
the token identity across loops (the runs themselves are in bench/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("va_agent_loops_bench", ROOT / "bench" / "agent_loops_vllm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_a_seed_picks_the_problems_and_each_prompt_starts_with_the_solved_examples(tmp_path):
    bench = _bench()
    first = bench.write_data(tmp_path / "a", 4, seed=0, shots=2)
    again = bench.write_data(tmp_path / "b", 4, seed=0, shots=2)
    other = bench.write_data(tmp_path / "c", 4, seed=1, shots=2)
    assert first == again and first != other and len(set(first)) == 4
    rows = pd.read_parquet(tmp_path / "a" / "train.parquet")
    prompt = list(rows.iloc[0]["prompt"])
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    call = prompt[1]["tool_calls"][0]["function"]
    assert call["name"] == "calculator" and json.loads(call["arguments"]) == {"expression": "12 * 7"}
    assert rows.iloc[0]["extra_info"]["question"] in prompt[-1]["content"]
    # the bench's template shows the call as hermes does, where the model can copy it
    from transformers import AutoTokenizer

    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.tools.calculator import CalculatorTool

    tok = AutoTokenizer.from_pretrained(embedded_model_dir(quiet=True))
    tok.chat_template = (ROOT / "bench" / "agent_loops" / "smollm2_tools.jinja").read_text()
    messages = [{k: v for k, v in m.items() if v is not None} for m in prompt]
    text = tok.apply_chat_template(messages, tools=[CalculatorTool.DEFAULT_SCHEMA], tokenize=False,
                                   add_generation_prompt=True)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>' in text
    assert "<tool_response>\n84\n</tool_response>" in text and text.count("# Tools") == 1
    assert bench.few_shot(0) == [] and len(bench.few_shot(1)) == 4


def _episodes(tokens: list[list[int]], requests: list[list[float]], tool_calls: int) -> list[dict]:
    bench = _bench()
    out = []
    for i, (ids, req) in enumerate(zip(tokens, requests)):
        turns = [{"role": "assistant", "start": 0, "end": 1}] + [{"role": "tool", "start": 1, "end": 2},
                                                                  {"role": "assistant", "start": 2, "end": len(ids)}] * tool_calls
        out.append(bench.compact({"extra_info": {"index": i}, "turns": turns, "response_mask": [1] * len(ids),
                                  "response_ids": ids, "timing": {"requests_s": req}}))
    return out


def test_the_table_pairs_the_loops_by_seed_and_recomputes_from_its_files(tmp_path):
    """Per loop the mean over seeds, per seed the ratio task_agent / tool_agent and the token-identical
    episodes; `summarize --out` on the committed files alone gives the same table."""
    bench = _bench()
    runs = {}
    for seed, slow in ((0, 1.0), (1, 2.0)):
        metrics = [{"step": 1, "data": {"timing_s/gen": 10.0 * slow, "timing_s/step": 50.0}}]
        info = lambda loop: {"loop": loop, "seed": seed, "exit": 0, "commit": "c0ffee"}  # noqa: E731
        runs[("task_agent", seed)] = {"episodes": _episodes([[1, 2, 3], [4, 5, 6]], [[0.1 * slow, 0.2 * slow]] * 2, 1),
                                      "metrics": metrics, "drift": {"episodes_ok": 2, "injected_differing_tokens": 0},
                                      "info": info("task_agent")}
        runs[("tool_agent", seed)] = {"episodes": _episodes([[1, 2, 3], [4, 5, 7]], [[0.2 * slow, 0.4 * slow]] * 2, 1),
                                      "metrics": metrics, "drift": None, "info": info("tool_agent")}
    result = bench.summarize(runs, tmp_path)
    loops = {l["loop"]: l for l in result["loops"]}  # noqa: E741
    assert loops["task_agent"]["tool_calls_per_episode"][0] == 1.0 and loops["task_agent"]["complete"] == 2
    assert result["task_agent_over_tool_agent"]["request_s_mean"][0] == pytest.approx(0.5)  # 0.15 / 0.3, each seed
    assert result["task_agent_over_tool_agent"]["episodes_per_s"][0] == pytest.approx(1.0)
    assert [p["identical"] for p in result["identical"]] == [1, 1]  # the second episode's last token differs
    assert [p["identical_response"] for p in result["identical"]] == [1, 1]
    # an injected token (mask 0) that differs: the generated tokens still alike, the whole response not
    ep = {"extra_info": {"index": 0}, "turns": [], "response_ids": [1, 9, 3], "response_mask": [1, 0, 1]}
    a = {"extra_info": {"index": 0}, "turns": [], "response_ids": [1, 2, 3], "response_mask": [1, 0, 1]}
    assert bench.identical([bench.compact(a)], [bench.compact(ep)]) == 1
    assert bench.identical([bench.compact(a)], [bench.compact(ep)], "tokens_sha1") == 0
    (run,) = [r for r in result["runs"] if r["loop"] == "task_agent" and r["seed"] == 1]
    assert run["requests"] == 4 and run["request_s_p50"] == pytest.approx(0.3) and run["request_s_p90"] == pytest.approx(0.4)
    assert "seed 0: 1 of 2 (1)" in (tmp_path / "results.md").read_text()

    import argparse

    for (loop, seed), r in runs.items():  # the committed files, as `summarize` writes them
        name = f"{loop}_seed{seed}"
        (tmp_path / f"{name}.episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in r["episodes"]))
        (tmp_path / f"{name}.metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in r["metrics"]))
        (tmp_path / f"{name}.run.json").write_text(json.dumps({**r["info"], "drift": r["drift"]}))
    first = (tmp_path / "results.json").read_text()
    (tmp_path / "results.json").unlink()
    assert bench.collect(argparse.Namespace(work=tmp_path / "no_runs_here", out=tmp_path)) == 0
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(first)


def test_the_tool_calling_fine_tune_trains_on_the_assistants_calls_and_answer_only():
    """bench/agent_loops/tool_sft.py: a GSM8K train row becomes a tool episode from its own annotated
    calculations, and the mask is 1 on exactly the assistant messages' tokens (calls, answer, end of turn)."""
    spec = importlib.util.spec_from_file_location("va_tool_sft", ROOT / "bench" / "agent_loops" / "tool_sft.py")
    sft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sft)
    from transformers import AutoTokenizer

    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.tools.calculator import CalculatorTool

    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72"
    messages = sft.episode("How many clips?", solution, calls=2)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["24", "72"]
    assert messages[-1]["content"].endswith("#### 72") and sft.episode("q", "no calculation\n#### 3", 2) is None
    tok = AutoTokenizer.from_pretrained(embedded_model_dir(quiet=True))
    tok.chat_template = sft.TEMPLATE.read_text()
    ids, mask = sft.tokens_and_mask(tok, messages, [CalculatorTool.DEFAULT_SCHEMA])
    assert ids == tok(tok.apply_chat_template(messages, tools=[CalculatorTool.DEFAULT_SCHEMA], tokenize=False),
                      add_special_tokens=False)["input_ids"]
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == ('\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call><|im_end|>'
                       '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48+24"}}\n</tool_call><|im_end|>'
                       'The answer is 72.\n#### 72<|im_end|>')
    assert "How many clips?" not in trained and "<tool_response>" not in trained


def test_the_committed_head_to_head_is_what_its_files_say(tmp_path):
    """bench/agent_loops/results (PREREG.md's six runs): recomputed from its committed files, the table is the
    committed one; every run is there, from one clean commit, exited 0, and its episodes called the tool."""
    import argparse
    import shutil

    bench = _bench()
    committed = ROOT / "bench" / "agent_loops" / "results"
    shutil.copytree(committed, tmp_path / "results")
    assert bench.collect(argparse.Namespace(work=tmp_path / "no_runs_here", out=tmp_path / "results")) == 0
    again = json.loads((tmp_path / "results" / "results.json").read_text())
    assert again == json.loads((committed / "results.json").read_text())
    assert (tmp_path / "results" / "results.md").read_text() == (committed / "results.md").read_text()
    assert {(r["loop"], r["seed"]) for r in again["runs"]} == {(loop, s) for loop in bench.LOOPS for s in (0, 1, 2)}
    assert len(again["commits"]) == 1 and all(r["exit"] == 0 for r in again["runs"])
    assert all(json.loads(f.read_text())["dirty"] == [] for f in committed.glob("*.run.json"))
    assert all(r["tool_calls_per_episode"] >= 1 for r in again["runs"])  # the pre-registered condition
