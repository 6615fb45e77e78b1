"""The rollout's journal and the JSON-lines appender under it (``rollout/journal.py``, ``jsonl.py``), in
process: what a kill, a torn line, a full device or another run's folder leave, and what resuming reads.
The same faults on real processes: tests/test_faults.py."""

from __future__ import annotations

import json

import pytest

from verl_agentic.jsonl import AppendError, JsonLinesAppender, read_complete_json_lines, write_json_lines
from verl_agentic.rollout.journal import JournalError, RolloutJournal

IDENTITY = {"seed": 0, "rollout": {"n": 2}, "data": {"rows": 3, "rows_sha256": "abc"}}


def _traj(i: int, k: int, **extra) -> dict:
    return {"uid": f"u{i}", "index": i, "sample_id": k, "response_ids": [i, k], **extra}


def test_the_appender_writes_whole_lines_and_a_torn_last_line_is_cut_off_on_reading(tmp_path):
    p = tmp_path / "t.jsonl"
    with JsonLinesAppender(p) as out:
        out.append({"a": 1})
        out.append({"b": "é"})
    assert read_complete_json_lines(p) == ([{"a": 1}, {"b": "é"}], 0)
    with open(p, "ab") as f:  # what a kill in the middle of a write leaves (constructed: a kill rarely lands there)
        f.write(b'{"c": [1, 2')
    assert read_complete_json_lines(p) == ([{"a": 1}, {"b": "é"}], len(b'{"c": [1, 2'))
    assert p.read_bytes().endswith(b"}\n")  # cut off the file, so the next append starts a line
    with JsonLinesAppender(p) as out:
        out.append({"c": 3})
    assert read_complete_json_lines(p)[0] == [{"a": 1}, {"b": "é"}, {"c": 3}]
    p.write_text('{"a": 1}\n{oops\n{"b": 2}\n')  # damage in the middle is not an interrupted write
    with pytest.raises(JournalError, match=r"t.jsonl: line 2 is not valid JSON"):
        read_complete_json_lines(p, error=JournalError)


def test_a_write_to_a_full_device_is_an_append_error_naming_the_file():
    with JsonLinesAppender("/dev/full") as out:  # a real device that answers every write with ENOSPC
        with pytest.raises(AppendError, match=r"cannot append to /dev/full: No space left on device") as e:
            out.append({"a": 1})
    assert e.value.errno == 28


def test_an_atomic_write_leaves_the_old_content_when_it_fails(tmp_path):
    p = tmp_path / "t.jsonl"
    write_json_lines(p, [{"a": 1}])
    with pytest.raises(TypeError):
        write_json_lines(p, [{"a": 2}, {"b": object()}], atomic=True)
    assert p.read_text() == '{"a": 1}\n' and [x.name for x in tmp_path.iterdir()] == ["t.jsonl"]


def test_a_journal_resumes_its_episodes_and_scores_and_refuses_another_runs_folder(tmp_path):
    j = RolloutJournal(tmp_path, IDENTITY)
    assert j.pending(3, 2) == [(i, k) for i in range(3) for k in range(2)] and j.resumed == 0
    for key in ((0, 1), (2, 0), (0, 0)):
        j.append(_traj(*key))
    j.append(_traj(0, 1))  # never written twice
    first = [_traj(0, 0, score=0.5, score_extra={}, score_error=None),
             _traj(0, 1, score=None, score_extra={}, score_error={"type": "service_unavailable", "message": "down"})]
    j.record_scores(first)
    j.close()
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 3

    j = RolloutJournal(tmp_path, json.loads(json.dumps(IDENTITY)))
    assert j.resumed == 3 and j.pending(3, 2) == [(1, 0), (1, 1), (2, 1)]
    for key in j.pending(3, 2):
        j.append(_traj(*key))
    trajs = j.trajectories(3, 2)
    assert [(t["index"], t["sample_id"]) for t in trajs] == [(i, k) for i in range(3) for k in range(2)]
    # scored again: the ones without a score and the one the service could not score
    assert [(t["index"], t["sample_id"]) for t in j.unscored(trajs)] == [(0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    for t in j.unscored(trajs):
        t.update(score=1.0, score_extra={}, score_error=None)
    j.record_scores(j.unscored(trajs))
    j.finish(j.trajectories(3, 2))
    lines = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [t["score"] for t in lines] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0] and not (tmp_path / "scores.jsonl").exists()

    # a finished run, run again: nothing pending, nothing to score
    j = RolloutJournal(tmp_path, IDENTITY)
    assert j.pending(3, 2) == [] and j.unscored(j.trajectories(3, 2)) == []
    # another run's settings
    other = {**IDENTITY, "seed": 1, "rollout": {"n": 3}}
    with pytest.raises(JournalError, match=r"holds a rollout with other settings \(rollout.n: 2 -> 3, seed: 0 -> 1\)"):
        RolloutJournal(tmp_path, other)


def test_outputs_without_a_journal_are_not_taken_for_one(tmp_path):
    (tmp_path / "trajectories.jsonl").write_text('{"index": 0, "sample_id": 0}\n')
    with pytest.raises(JournalError, match="exists but journal.json does not: it is not a resumable rollout"):
        RolloutJournal(tmp_path, IDENTITY)


_WRITER = """
import sys
from verl_agentic.jsonl import JsonLinesAppender
path, size, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tag = sys.argv[4]
pad = b"x" * size
with JsonLinesAppender(path) as out:
    out.append({"tag": tag, "n": -1})
    print("ready", flush=True)
    for n in range(count):  # each line made in microseconds: the writer spends its time writing
        out.append_bytes(b'{"tag": "%s", "n": %d, "pad": "%s"}\\n' % (tag.encode(), n, pad))
"""


def _writer(path, size: int, count: int, tag: str):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(size), str(count), tag],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_writer_killed_in_the_middle_of_a_line_leaves_a_tail_the_next_appender_drops(tmp_path, caplog):
    """For real: a process killed while it writes a 64 MB line leaves part of it (Linux stops the write at
    a page boundary). The next appender, in another process's place (a resumed run), cuts that tail off
    and says so, so its line does not join the fragment, and a dump reader then reads every line."""
    import os
    import time

    from verl_agentic.jsonl import read_json_lines

    p = tmp_path / "step_000001.jsonl"
    for _ in range(20):  # kill the moment the file is seen mid-line; a try whose write completed first is redone
        p.unlink(missing_ok=True)
        proc = _writer(p, 64 << 20, 10_000, "killed")
        deadline = time.monotonic() + 30
        with open(p, "rb") as f:
            while time.monotonic() < deadline:
                size = os.fstat(f.fileno()).st_size
                if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
                    break
        proc.kill()
        proc.wait()
        if not p.read_bytes().endswith(b"\n"):
            break
    data = p.read_bytes()
    assert not data.endswith(b"\n"), "20 kills all landed between two writes"
    whole = data.rfind(b"\n") + 1
    with caplog.at_level("WARNING", logger="verl_agentic.jsonl"):
        with JsonLinesAppender(p) as out:
            out.append({"tag": "resumed"})
    assert out.torn_bytes == len(data) - whole
    assert f"{p}: dropped a torn last line ({len(data) - whole} bytes" in caplog.text
    rows = read_json_lines(p)
    assert rows[0] == {"tag": "killed", "n": -1} and rows[-1] == {"tag": "resumed"}
    assert [r["n"] for r in rows[1:-1]] == list(range(len(rows) - 2))


_MID_LINE_WRITER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)  # the writers' protocol (jsonl.JsonLinesAppender)
os.write(fd, b'{"tag": "slow", "pad": "' + b"x" * 4096)
print("half", flush=True)
sys.stdin.readline()  # the rest of the line when told: a large write still in progress
os.write(fd, b'"}\\n')
"""

_OPENERS = {  # a resume's two ways into a file that live writers append to
    "read_complete_json_lines": "from verl_agentic.jsonl import read_complete_json_lines\n"
                                "print(read_complete_json_lines(sys.argv[1])[1])",
    "JsonLinesAppender": "from verl_agentic.jsonl import JsonLinesAppender\n"
                         "out = JsonLinesAppender(sys.argv[1]); out.append({'tag': 'opener'}); print(out.torn_bytes)",
}


@pytest.mark.parametrize("opener", sorted(_OPENERS))
def test_a_process_that_opens_while_a_live_writer_is_mid_line_cuts_nothing(tmp_path, opener):
    """A live writer in the middle of a long line (it holds the lock, half its line written) while a third
    process opens the file as a resume does: the opener waits for the line to end, cuts nothing, and every
    line arrives whole. Without the lock the opener took the live half line for a torn one and cut it
    (``RecordingWriter`` did that to verl's workers' recordings)."""
    import subprocess
    import sys
    import time

    p = tmp_path / "shared.jsonl"
    with JsonLinesAppender(p) as out:
        out.append({"tag": "before"})
    writer = subprocess.Popen([sys.executable, "-c", _MID_LINE_WRITER, str(p)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "half\n"
        third = subprocess.Popen([sys.executable, "-c", "import sys\n" + _OPENERS[opener], str(p)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        still_waiting = third.poll() is None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=60) == 0
        out, err = third.communicate(timeout=60)
    finally:
        writer.kill()
    assert third.returncode == 0, err
    assert still_waiting, f"the opener did not wait for the live writer's line: {out.strip()} bytes cut"
    assert out.strip() == "0"
    rows, torn = read_complete_json_lines(p)
    assert torn == 0 and [r["tag"] for r in rows][:2] == ["before", "slow"] and len(rows[1]["pad"]) == 4096


def test_dump_readers_skip_a_torn_line_naming_file_and_line(tmp_path, caplog):
    """A dump damaged before writers dropped torn tails (a fragment joined to the next line): the
    inspector's and replay's reader skip that line and name it; the strict reader still refuses it."""
    from verl_agentic.jsonl import read_json_lines
    from verl_agentic.interfaces import ConfigError

    p = tmp_path / "step_000002.jsonl"
    p.write_text('{"a": 1}\n{"b": "torn mid-str{"c": 3}\n{"d": 4}\n')
    with caplog.at_level("WARNING", logger="verl_agentic.jsonl"):
        assert read_json_lines(p, skip_torn=True) == [{"a": 1}, {"d": 4}]
    assert f"{p}: line 2 is not valid JSON" in caplog.text and "skipped" in caplog.text
    with pytest.raises(ConfigError, match=r"step_000002.jsonl: line 2 is not valid JSON"):
        read_json_lines(p)
    p.write_text('{"a": 1}\n[1, 2]\n')  # valid JSON of the wrong shape is damage, not a torn line
    with pytest.raises(ConfigError, match=r"line 2: expected a JSON object"):
        read_json_lines(p, skip_torn=True)
