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
