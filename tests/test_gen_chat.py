"""gen_chat end to end: a chat policy (real models through ChatAdapter) against real environment services.

- GSM8K through gen_chat, with ``python -m verl_agentic.envserver`` as a subprocess, gives the same
  episodes (messages, per-turn and episode rewards, metrics, tokens) as the gsm8k task run in this
  process with the same chat policy, on the embedded SmolLM2 with greedy decoding and feedback turns.
  (How the chat loop's episodes relate to the token loop's is test_chat_loop's subject.)
- Environment faults (a 500, garbage, a hang, on /start, /step or /end, through a fault-injecting proxy
  in front of a real service) become typed episode errors; the batch goes on and the dump keeps
  every episode with what it generated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from typing import Optional

import aiohttp
import pytest
from aiohttp import web

from verl_agentic.agentic_utils import load_rows
from verl_agentic.backends.hf import HFBackend
from verl_agentic.envserver import EnvService, serve
from verl_agentic.interfaces import ConfigError
from verl_agentic.main_rollout import load_config, run
from verl_agentic.rollout import AsyncRollout, RolloutConfig, check_drift, read_jsonl, write_jsonl
from verl_agentic.rollout.chat_loop import openai_chat_agent_loop
from verl_agentic.tasks import get_task, register_task
from verl_agentic.tasks.gen_chat import GenChatConfig, as_gen_chat_row
from verl_agentic.tasks.gsm8k import gsm8k_preprocess

from va_services import LoopbackProxy, ServiceProcess
from va_testing import GSM8K_TEST, REPO

register_task("_t_gsm8k_chat", dataclasses.replace(get_task("gsm8k"), loop=openai_chat_agent_loop,
                                                   name="_t_gsm8k_chat"), replace=True)


def _health(url: str) -> dict:
    async def get():
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                return await r.json()
    return asyncio.run(get())


def test_gsm8k_through_gen_chat_equals_the_in_process_run(smol_dir):
    backend = HFBackend.from_pretrained(smol_dir, max_batch_size=16, seed=0)
    # a GSM8K test problem (the 135M model gets it wrong: feedback turns) and two short ones (it answers
    # 7 + 5 right and 10 - 4 wrong, greedy)
    rows = load_rows(GSM8K_TEST, "gsm8k", 1)
    for i, (q, a) in enumerate([("What is 7 + 5?", 12), ("What is 10 - 4?", 6)], 1):
        row = gsm8k_preprocess({"question": q, "answer": f"#### {a}"}, i)
        row["prompt"] = [{"role": "user", "content": f"{q}\nAnswer with the number only."}]
        rows.append(row)
    server = ServiceProcess("verl_agentic.envserver", ready="environment service listening on ")
    try:
        task_configs = {"_t_gsm8k_chat": {"feedback": "verify"}, "gsm8k": {"feedback": "verify"},
                        "gen_chat": {"url": server.url, "env_config": {"feedback": "verify"}}}
        cfg = RolloutConfig(max_turns=2, max_new_tokens=40, max_total_tokens=1024, temperature=0.0, concurrency=8)

        async def both():  # side by side: the backend batches the two runs' requests together
            return await asyncio.gather(*(AsyncRollout(backend, cfg, task_configs=task_configs, seed=0).run(r) for r in (
                [{**r, "task_type": "_t_gsm8k_chat"} for r in rows], [as_gen_chat_row(r, "gsm8k") for r in rows])))

        local, remote = asyncio.run(both())
        assert _health(server.url)["sessions"] == 0  # every session was ended
    finally:
        code = server.stop()
        server.close()
    assert code == 0
    assert any(t["num_turns"] == 2 for t in remote), "no feedback turn: the test would not cover multi-turn"
    assert any(t["reward"] == 1.0 for t in remote), "no right answer: the rewards would all be 0"
    for a, b in zip(local, remote):
        assert b["error"] is None and b["task_type"] == "gen_chat" and b["data_source"] == "openai/gsm8k"
        assert b["reward"] == a["reward"] and b["messages"] == a["messages"] and b["num_turns"] == a["num_turns"]
        assert [x.get("reward") for x in b["turns"]] == [x.get("reward") for x in a["turns"]]
        assert b["response_ids"] == a["response_ids"] and b["prompt_ids"] == a["prompt_ids"]
        for key in ("first_correct", "final_correct", "answered", "feedback_turns", "flips_wrong_to_right",
                    "chat_rerender_turns", "chat_rerender_tokens"):
            assert b["metrics"][key] == a["metrics"][key], key
        assert b["metrics"]["env_requests"] == 2 + b["num_turns"] and b["metrics"]["env_retries"] == 0
        report = check_drift(b, backend.tokenizer, stop_token_ids=backend.stop_token_ids)
        assert report.ok, report.as_dict()


class SessionFaultProxy(LoopbackProxy):
    """A real HTTP server in front of an environment service that injects faults per episode.

    ``rules`` maps a row ``uid`` to ``(path, mode, times)``: that episode's first ``times`` requests to
    ``path`` get ``mode`` (``500``: an untyped 500 page, ``garbage``: 200 with non-JSON bytes, ``hang``:
    no answer) instead of reaching the service. Sessions are told apart by the ``session_id`` that
    ``/start`` carries next to the row.
    """

    shutdown_timeout = 0.2

    def __init__(self, upstream: str, rules: dict[str, tuple[str, str, float]]):
        super().__init__(upstream)
        self.rules = rules
        self.uid_of: dict[str, str] = {}
        self.hits: dict[str, int] = {}

    def _fault(self, path: str, body: bytes) -> Optional[str]:
        payload = json.loads(body) if body else {}
        if path == "/start":
            self.uid_of[payload["session_id"]] = payload["row"]["uid"]
        uid = self.uid_of.get(payload.get("session_id"))
        rule = self.rules.get(uid)
        if rule is None or rule[0] != path:
            return None
        self.hits[uid] = self.hits.get(uid, 0) + 1
        return rule[1] if self.hits[uid] <= rule[2] else None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        mode = self._fault(request.path, body) if request.method == "POST" else None
        if mode == "500":
            return web.Response(status=500, text="<html>502 Bad Gateway</html>")
        if mode == "garbage":
            return web.Response(body=b"\x00\xff{not json", content_type="application/json")
        if mode == "hang":
            await asyncio.sleep(30)
        return await self.forward_response(request, body)


@pytest.fixture(scope="module")
def tiny_backend(tiny_qwen_dir):
    return HFBackend.from_pretrained(tiny_qwen_dir, max_batch_size=16, seed=0)


async def test_environment_faults_are_typed_episode_errors_and_nothing_is_lost(tiny_backend, tmp_path):
    rules = {"step500": ("/step", "500", float("inf")), "stepgarbage": ("/step", "garbage", float("inf")),
             "stephang": ("/step", "hang", float("inf")), "flaky": ("/step", "500", 1),
             "end500": ("/end", "500", float("inf")), "start500": ("/start", "500", float("inf"))}
    base = load_rows(GSM8K_TEST, "gsm8k", 1)[0]
    uids = ["ok", *rules]
    rows = [{**as_gen_chat_row(base, "gsm8k"), "uid": uid} for uid in uids]
    service = EnvService()
    async with serve(service) as url, SessionFaultProxy(url, rules) as proxy_url:
        task_configs = {"gen_chat": {"url": proxy_url, "env_config": {"feedback": "verify"}, "request_timeout_s": 2.0,
                                     "max_retries": 1, "retry_backoff_s": 0.01}}
        rollout = AsyncRollout(tiny_backend, RolloutConfig(max_turns=2, max_new_tokens=6, max_total_tokens=1024,
                                                           temperature=1.0, concurrency=8),
                               task_configs=task_configs, seed=0)
        trajs = await rollout.run(rows)
        live = set(service.sessions)
        assert service.counts["sessions_ended"] == 5  # /end reached the service for every episode but two
    by_uid = {t["uid"]: t for t in trajs}
    assert [t["uid"] for t in trajs] == uids
    err = {uid: (t["error"] or {}).get("type") for uid, t in by_uid.items()}
    assert err == {"ok": None, "flaky": None, "step500": "env_error", "stepgarbage": "env_error",
                   "stephang": "timeout", "end500": "end_error", "start500": "env_error"}
    assert "[service_unavailable] environment service" in by_uid["step500"]["error"]["message"]
    assert "after 2 attempts)" in by_uid["step500"]["error"]["message"]
    assert "[bad_response]" in by_uid["stepgarbage"]["error"]["message"]
    assert "no answer within 2.0 s" in by_uid["stephang"]["error"]["message"]
    assert by_uid["end500"]["error"]["message"].startswith("end: EpisodeFailure: [service_unavailable]")
    assert by_uid["flaky"]["metrics"]["env_retries"] == 1 and by_uid["ok"]["metrics"]["env_retries"] == 0
    # nothing lost: a failed step keeps its generated turn; a failed start keeps the row
    for uid in ("step500", "stepgarbage", "stephang"):
        t = by_uid[uid]
        assert t["num_turns"] == 1 and t["finish_reason"] == "error" and t["messages"][-1]["role"] == "assistant"
        assert sum(t["response_mask"]) == len(t["response_ids"]) > 0 and None not in t["response_logprobs"]
    for t in trajs:
        if t["prompt_ids"]:
            assert check_drift(t, tiny_backend.tokenizer, stop_token_ids=tiny_backend.stop_token_ids).ok
    assert by_uid["start500"]["prompt_ids"] == [] and by_uid["start500"]["ground_truth"] == base["reward_model"][
        "ground_truth"]
    assert by_uid["end500"]["reward"] == 0.0 and by_uid["ok"]["num_turns"] >= 1
    path = tmp_path / "trajectories.jsonl"
    assert write_jsonl(path, trajs) == len(uids) and read_jsonl(path) == trajs
    # the session whose /end never arrived is still live on the service (its reaper ends it later)
    assert len(live) == 1


def test_main_rollout_runs_gen_chat_from_config_and_the_converter_cli(tiny_backend, tmp_path):
    converted = tmp_path / "rows.jsonl"
    cli = subprocess.run([sys.executable, "-m", "verl_agentic.envserver.rows", "gsm8k", str(GSM8K_TEST),
                          str(converted), "--max-samples", "2"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert cli.returncode == 0 and "wrote 2 gen_chat rows" in cli.stdout, cli.stderr
    assert [r["extra_info"]["env_task"] for r in read_jsonl(converted)] == ["gsm8k", "gsm8k"]
    raw = tmp_path / "raw.jsonl"  # raw rows that name their env_task go through the gsm8k preprocessor
    raw.write_text(json.dumps({"env_task": "gsm8k", "question": "What is 2+2?", "answer": "#### 4"}) + "\n")
    assert load_rows(raw, "gen_chat")[0]["extra_info"]["env_task"] == "gsm8k"
    raw.write_text(json.dumps({"question": "What is 2+2?", "answer": "#### 4"}) + "\n")
    with pytest.raises(ConfigError, match="field 'env_task' must name a task with a preprocessor"):
        load_rows(raw, "gen_chat")

    async def serve_and_run():
        async with serve(EnvService()) as url:
            cfg = load_config(["task_type=gen_chat", f"data.path={converted}", f"task.gen_chat.url={url}",
                               "+task.gen_chat.env_config.feedback=retry", "rollout.max_new_tokens=6",
                               "rollout.max_turns=2", f"output.dir={tmp_path / 'out'}", "output.quiet=true"])
            return await asyncio.to_thread(run, cfg, tiny_backend)

    trajs, summary = asyncio.run(serve_and_run())
    assert len(trajs) == 2 and all(t["error"] is None for t in trajs)
    assert summary["drift"]["episodes_ok"] == 2 and summary["tasks"]
    assert all(t["score_error"] is None for t in trajs)  # scored by the gsm8k scorer through data_source
    with pytest.raises(ConfigError, match=r"python -m verl_agentic.envserver --port 8100"):
        GenChatConfig.from_dict({})
    with pytest.raises(ConfigError, match=r"unknown task.gen_chat keys \['urll'\]"):
        GenChatConfig.from_dict({"urll": "x"})
