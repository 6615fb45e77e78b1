"""Bad rows and malformed dataset files: ``data.on_bad_row=fail|skip``, and one clear line from every
entry point (the Python API, ``python -m verl_agentic.tasks.data`` / ``agentic_utils``, main_rollout,
main_ppo). Real files, real subprocesses."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from va_testing import GSM8K_TEST, REPO
from verl_agentic.tasks.data import DatasetError, load_rows, read_raw_rows

GOOD = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()[:3]]


def _mixed(tmp_path):
    """A .jsonl file of 7 records: 3 good rows and 4 bad ones of each kind, with a blank line."""
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join([
        json.dumps(GOOD[0]),
        "{not json",                                   # row 1: not JSON
        "[1, 2]",                                      # row 2: not an object
        json.dumps({"question": "2+2?"}),              # row 3: no answer
        "",
        json.dumps(GOOD[1]),                           # row 4
        json.dumps({"prompt": [], "reward_model": {"ground_truth": "1"}}),  # row 5: empty prompt
        json.dumps(GOOD[2]),                           # row 6
    ]) + "\n")
    return p


def test_fail_names_the_file_the_row_and_the_field_and_skip_lists_each_bad_row_with_its_reason(tmp_path):
    p = _mixed(tmp_path)
    with pytest.raises(DatasetError, match=rf"^{p}: line 2 is not valid JSON"):
        load_rows(p, "gsm8k")
    skipped: list = []
    rows = load_rows(p, "gsm8k", on_bad_row="skip", skipped=skipped)
    # the good rows keep their positions in the file (extra_info.index), bad ones do not shift them
    assert [r["extra_info"]["index"] for r in rows] == [0, 4, 6]
    assert [r["reward_model"]["ground_truth"] for r in rows] == [r["answer"].split("####")[-1].strip() for r in GOOD]
    got = [(b.row, b.reason) for b in skipped]
    assert [row for row, _ in got] == [1, 2, 3, 5]
    assert "line 2 is not valid JSON" in got[0][1] and "line 3: expected a JSON object, got list" in got[1][1]
    assert f"{p}: row 3: field 'answer' is missing" in got[2][1]
    assert f"{p}: row 5: field 'prompt' must be a non-empty list" in got[3][1]
    assert skipped[0].as_dict()["raw"] == "{not json" and skipped[2].as_dict()["raw"] == {"question": "2+2?"}
    # max_samples counts the file's records, bad ones included
    assert len(load_rows(p, "gsm8k", max_samples=4, on_bad_row="skip", skipped=[])) == 1
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text("{x\n")
    with pytest.raises(DatasetError, match=r"has no rows \(1 skipped as bad, the first: .*line 1 is not valid JSON"):
        load_rows(only_bad, "gsm8k", on_bad_row="skip", skipped=[])


@pytest.mark.parametrize("name,content,message", [
    ("broken.json", '[{"question": "a", "answer": "#### 1"}, ', r"broken.json: not valid JSON \(Expecting value at line 1"),
    ("dict.json", '{"question": "a"}', r"dict.json: a .json dataset must hold a list of objects, got dict"),
    ("broken.parquet", "PAR1 not a parquet file", r"broken.parquet: cannot be read as a dataset \(ArrowInvalid: "),
    ("broken.jsonl.gz", "not gzip", r"broken.jsonl.gz: cannot be read as a dataset \(BadGzipFile: "),
    ("latin1.jsonl", b'{"question": "caf\xe9", "answer": "#### 1"}\n', r"latin1.jsonl: not UTF-8 text"),
])
def test_a_malformed_file_is_one_error_naming_it(tmp_path, name, content, message):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    for policy in ("fail", "skip"):  # a file that cannot be read at all is not a bad row
        with pytest.raises(DatasetError, match=message):
            load_rows(p, "gsm8k", on_bad_row=policy, skipped=[])


def test_a_truncated_gzip_file_is_one_error(tmp_path):
    p = tmp_path / "cut.jsonl.gz"
    p.write_bytes(gzip.compress(GSM8K_TEST.read_bytes())[:2000])
    with pytest.raises(DatasetError, match=r"cut.jsonl.gz: cannot be read as a dataset \(EOFError"):
        read_raw_rows(p)


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("module", ["verl_agentic.tasks.data", "verl_agentic.agentic_utils"])
def test_the_data_clis_print_one_line_and_skip_on_request(module, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    r = _cli("-m", module, "gsm8k", str(bad), str(tmp_path / "out.parquet"))
    assert r.returncode == 2 and r.stderr.strip() == f"error: {bad}: not valid JSON (Expecting property name enclosed " \
                                                      "in double quotes at line 1 column 3)", r.stderr
    out = tmp_path / "out.jsonl"
    r = _cli("-m", module, "gsm8k", str(_mixed(tmp_path)), str(out))
    assert r.returncode == 2 and r.stderr.strip().startswith("error: ") and "line 2 is not valid JSON" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    r = _cli("-m", module, "gsm8k", str(_mixed(tmp_path)), str(out), "--on-bad-row", "skip")
    assert r.returncode == 0, r.stderr
    assert "wrote 3 rows" in r.stdout and "skipped 4 bad rows" in r.stdout and r.stderr == ""
    listed = [json.loads(line) for line in (tmp_path / "out.skipped.jsonl").read_text().splitlines()]
    assert [b["row"] for b in listed] == [1, 2, 3, 5] and len(out.read_text().splitlines()) == 3


def test_main_rollout_skips_bad_rows_and_counts_them(tiny_qwen_dir, tmp_path):
    out = tmp_path / "run"
    args = ["-m", "verl_agentic.main_rollout", f"model.path={tiny_qwen_dir}", f"data.path={_mixed(tmp_path)}",
            "rollout.max_new_tokens=4", "rollout.max_turns=1", "output.quiet=true", f"output.dir={out}"]
    r = _cli(*args)
    assert r.returncode == 2 and "line 2 is not valid JSON" in r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and "model loaded" not in r.stderr
    r = _cli(*args, "data.on_bad_row=skip")
    assert r.returncode == 0, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["rows"] == 3 and summary["data"]["skipped_rows"] == 4
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 3
    listed = [json.loads(line) for line in (out / "skipped_rows.jsonl").read_text().splitlines()]
    assert [b["row"] for b in listed] == [1, 2, 3, 5] and all(b["reason"] and b["file"] for b in listed)


def test_main_ppo_reports_a_malformed_dataset_in_one_line(tmp_path):
    bad = tmp_path / "train.parquet"
    bad.write_text("not parquet")
    r = _cli("-m", "verl_agentic.main_ppo", f"data.path={bad}", f"output.dir={tmp_path / 'run'}")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(f"error: {bad}: cannot be read"), r.stderr
    assert "Traceback" not in r.stderr
