"""The sandbox service over real loopback HTTP: sandboxes, confinement, limits, reaping, shutdown, scoring.

Servers are real: in-process ``serve()`` on 127.0.0.1, or ``python -m verl_agentic.sandbox.server``
subprocesses (for signals and crashes). Commands are real sandboxed processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import aiohttp
import pytest

from va_sandbox import SandboxServerProcess, alive
from verl_agentic.isolation import SandboxLimits
from verl_agentic.reward.base import RewardConfig, RewardItem, make_reward_manager
from verl_agentic.sandbox.client import SandboxClient, SandboxError
from verl_agentic.sandbox.runtime import PASS_MARKER, Changes, HiddenTests, file_list
from verl_agentic.sandbox.server import ServiceConfig, serve

FILES = {"pkg/mod.py": "VALUE = 1\n", "README.md": "hello\n"}
FAST = dict(max_retries=2, retry_backoff_s=0.02)


def _service(**kw) -> ServiceConfig:
    kw.setdefault("limits", SandboxLimits(wall_timeout_s=10.0))
    return ServiceConfig(**kw)


async def _raw(method: str, url: str, **kw) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.request(method, url, **kw) as r:
        return r.status, await r.json(content_type=None)


def _host_pid(workdir: Path, ns_pid: int) -> Optional[int]:
    """The host pid of the live process that a command in ``workdir`` saw as ``ns_pid`` (``$$``): commands
    run in their own PID namespace, so a pid they write is not the host's (``NSpid`` maps the two)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            status = Path(f"/proc/{d}/status").read_text()
            cwd = os.readlink(f"/proc/{d}/cwd")
        except OSError:
            continue
        nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if cwd == str(workdir) and nspid and nspid[-1] == str(ns_pid) and alive(int(d)):
            return int(d)
    return None


# --- sandboxes, commands, files ------------------------------------------------------------------
async def test_create_exec_files_changes_destroy(tmp_path):
    async with serve(_service(workdir_parent=str(tmp_path))) as url, SandboxClient(url) as c:
        box = await c.create("repo/1", FILES, key="episode-a")
        sid, workdir = box["sandbox_id"], Path(box["workdir"])
        assert box["created"] and (workdir / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
        res = await c.exec(sid, "python -c 'import pkg.mod as m; print(m.VALUE)'; echo oops >&2; exit 3")
        assert (res["stdout"], res["stderr"], res["exit_code"], res["error_type"]) == ("1\n", "oops\n", 3,
                                                                                      "runtime_error")
        assert res["network_isolated"] and res["process_limit"] == "cgroup"
        await c.write_file(sid, "pkg/mod.py", "VALUE = 2\n")
        await c.write_file(sid, "new/dir/file.txt", "made")
        assert (await c.read_file(sid, "pkg/mod.py"))["content"] == "VALUE = 2\n"
        listing = await c.read_file(sid, ".")
        assert [(e["name"], e["type"]) for e in listing["entries"]] == [
            ("README.md", "file"), ("new", "directory"), ("pkg", "directory")]
        assert (await c.exec(sid, "rm README.md"))["exit_code"] == 0
        changes = await c.changes(sid)
        assert changes == {"files": file_list({"new/dir/file.txt": "made", "pkg/mod.py": "VALUE = 2\n"}),
                           "deleted": ["README.md"], "skipped": []}
        assert Changes.from_dict(changes).apply(FILES) == {"pkg/mod.py": "VALUE = 2\n", "new/dir/file.txt": "made"}
        assert await c.destroy(sid) is True
        assert not workdir.exists()
        assert await c.destroy(sid) is False  # already gone: not an error
        with pytest.raises(SandboxError) as e:
            await c.exec(sid, "true")
        assert (e.value.type, e.value.status, e.value.fatal) == ("unknown_sandbox", 404, True)
        assert "destroyed" in e.value.message


async def test_instance_ids_map_to_sandboxes_key_reuses_and_list_looks_up():
    async with serve(_service()) as url, SandboxClient(url) as c:
        with pytest.raises(SandboxError) as e:
            await c.create("never-seen")
        assert (e.value.type, e.value.status) == ("unknown_instance", 404)
        first = await c.create("HumanEval/0", {"solution.py": "x = 1\n"}, key="ep-1")
        again = await c.create("HumanEval/0", {"solution.py": "x = 1\n"}, key="ep-1")  # a retried request
        assert again["sandbox_id"] == first["sandbox_id"] and not again["created"]
        by_id = await c.create("HumanEval/0")  # from the registered files, a sandbox of its own
        assert by_id["sandbox_id"] != first["sandbox_id"]
        assert (await c.read_file(by_id["sandbox_id"], "solution.py"))["content"] == "x = 1\n"
        with pytest.raises(SandboxError) as e:
            await c.create("HumanEval/1", {"a.py": ""}, key="ep-1")
        assert (e.value.type, e.value.status) == ("key_conflict", 409)
        assert {b["sandbox_id"] for b in await c.list("HumanEval/0")} == {first["sandbox_id"], by_id["sandbox_id"]}
        assert [b["sandbox_id"] for b in await c.list("HumanEval/1")] == []
        # a new key after the first sandbox is destroyed: a fresh sandbox
        await c.destroy(first["sandbox_id"])
        fresh = await c.create("HumanEval/0", key="ep-1")
        assert fresh["created"] and fresh["sandbox_id"] not in (first["sandbox_id"], by_id["sandbox_id"])


async def test_paths_are_confined_to_the_sandbox(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    async with serve(_service()) as url, SandboxClient(url) as c:
        sid = (await c.create("confine", FILES))["sandbox_id"]
        await c.exec(sid, f"ln -s {outside} escape && ln -s {outside}/secret.txt leak.txt")
        for path in ("../x", "pkg/../../x", "/etc/passwd", "escape/secret.txt", "leak.txt"):
            with pytest.raises(SandboxError) as e:
                await c.read_file(sid, path)
            assert (e.value.type, e.value.status, e.value.fatal) == ("path_outside_sandbox", 400, False), path
        for path in ("../evil.txt", "/tmp/evil.txt", "escape/evil.txt"):
            with pytest.raises(SandboxError) as e:
                await c.write_file(sid, path, "pwned")
            assert e.value.type == "path_outside_sandbox", path
        assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
        with pytest.raises(SandboxError) as e:
            await c.create("confine-2", {"../up.py": "x"})
        assert e.value.status == 400 and "'..'" in e.value.message
        with pytest.raises(SandboxError) as e:
            await c.read_file(sid, "missing.py")
        assert (e.value.type, e.value.status, e.value.fatal) == ("file_not_found", 404, False)
        # links are not followed when the changes are collected: reported as skipped
        assert (await c.changes(sid))["skipped"] == ["escape", "leak.txt"]


async def test_typed_json_errors_for_bad_requests():
    async with serve(_service(max_timeout_s=20)) as url, SandboxClient(url) as c:
        status, body = await _raw("POST", f"{url}/sandboxes", data=b"{not json")
        assert status == 400 and body["error"]["type"] == "bad_request"
        assert "not valid JSON" in body["error"]["message"]
        status, body = await _raw("POST", f"{url}/sandboxes", json={"instance_id": "a", "colour": "red"})
        assert status == 400 and "unknown fields ['colour']" in body["error"]["message"]
        status, body = await _raw("GET", f"{url}/nowhere")
        assert status == 404 and body["error"]["type"] == "not_found"
        for limits, why in (({"memory_mb": -1}, "memory_mb"), ({"network": True}, "--allow-network"),
                            ({"wall_timeout_s": 99}, "max_timeout_s"), ({"bogus": 1}, "unknown sandbox limits")):
            with pytest.raises(SandboxError) as e:
                await c.create("lim", {"a.py": ""}, limits=limits)
            assert e.value.type == "bad_request" and why in e.value.message, limits
        box = await c.create("lim", {"a.py": ""}, limits={"memory_mb": 128})
        assert box["limits"]["memory_mb"] == 128
        res = await c.exec(box["sandbox_id"], "python -c 'x = bytearray(500 * 2**20)'")
        assert res["error_type"] == "memory" and "MemoryError" in res["stderr"]
        with pytest.raises(SandboxError) as e:
            await c.exec(box["sandbox_id"], "true", timeout_s=21)
        assert e.value.type == "bad_request" and "timeout_s" in e.value.message


async def test_hanging_and_crashing_commands_are_killed_and_reported():
    async with serve(_service()) as url, SandboxClient(url) as c:
        sid = (await c.create("faults", FILES))["sandbox_id"]
        t0 = time.perf_counter()
        res = await c.exec(sid, "echo $$ > pid; sleep 1 & python -c 'while True: pass'", timeout_s=1.0)
        assert (res["error_type"], res["timed_out"], res["killed_by"]) == ("timeout", True, "SIGKILL")
        assert time.perf_counter() - t0 < 5
        shell = int((await c.read_file(sid, "pid"))["content"])
        assert _host_pid(Path((await c.info(sid))["workdir"]), shell) is None  # killed
        crash = await c.exec(sid, "python -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'")
        # the shell exits 128 + 11; bwrap reports a signal the same way, so it reads as the signal (documented)
        assert (crash["error_type"], crash["exit_code"], crash["killed_by"]) == ("killed", -11, "SIGSEGV")
        direct = await c.exec(sid, "exec python -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'")
        assert (direct["error_type"], direct["killed_by"]) == ("killed", "SIGKILL")
        flood = await c.exec(sid, "yes")
        assert flood["error_type"] == "output_limit" and flood["truncated"]
        # the sandbox is still usable after all that
        assert (await c.exec(sid, "cat pkg/mod.py"))["stdout"] == "VALUE = 1\n"


async def test_no_network_not_even_the_service_itself():
    async with serve(_service()) as url, SandboxClient(url) as c:
        sid = (await c.create("net", FILES))["sandbox_id"]
        res = await c.exec(sid, f"python -c \"import urllib.request; urllib.request.urlopen('{url}/health', "
                                "timeout=2)\"")
        assert res["exit_code"] == 1 and ("Connection refused" in res["stderr"] or "unreachable" in res["stderr"])


async def test_operations_on_one_sandbox_run_in_order_and_destroy_kills_a_running_command():
    async with serve(_service()) as url, SandboxClient(url) as c:
        sid = (await c.create("order", FILES))["sandbox_id"]
        slow = asyncio.create_task(c.exec(sid, "sleep 0.5; echo written > out.txt"))
        await asyncio.sleep(0.1)
        read = await c.read_file(sid, "out.txt")  # waits for the command before it
        assert read["content"] == "written\n" and (await slow)["exit_code"] == 0
        running = asyncio.create_task(c.exec(sid, "echo $$ > pid; exec sleep 30", timeout_s=30))
        workdir = Path((await c.info(sid))["workdir"])
        while not (workdir / "pid").exists() or not (workdir / "pid").read_text().strip():
            await asyncio.sleep(0.02)
        pid = _host_pid(workdir, int((workdir / "pid").read_text()))
        assert pid is not None and alive(pid)
        t0 = time.perf_counter()
        assert await c.destroy(sid)
        with pytest.raises(SandboxError) as e:
            await running
        assert (e.value.type, e.value.status) == ("sandbox_destroyed", 409)
        assert time.perf_counter() - t0 < 5 and not workdir.exists()
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not alive(pid)


async def test_hidden_tests_marker_and_cleanup():
    good = HiddenTests({"test_it.py": f"import pkg.mod\nassert pkg.mod.VALUE == 1\nprint('{PASS_MARKER}')\n"},
                       "python test_it.py")
    async with serve(_service()) as url, SandboxClient(url) as c:
        sid = (await c.create("hidden", FILES))["sandbox_id"]
        passed = await c.run_hidden_tests(sid, good, timeout_s=10)
        assert passed.passed and passed.marker_ok and passed.exit_code == 0
        assert "<pass marker>" in passed.output and PASS_MARKER not in passed.output
        assert (await c.changes(sid))["files"] == []  # the test files were removed again
        # a solution that ends the process early with status 0 does not pass
        await c.write_file(sid, "pkg/mod.py", "import sys\nVALUE = 1\nsys.exit(0)\n")
        cheat = await c.run_hidden_tests(sid, good)
        assert (cheat.passed, cheat.exit_code, cheat.marker_ok) == (False, 0, False)
        await c.write_file(sid, "pkg/mod.py", "VALUE = 1\nwhile True:\n    pass\n")
        hang = await c.run_hidden_tests(sid, good, timeout_s=1.0)
        assert (hang.passed, hang.timed_out, hang.error_type) == (False, True, "timeout")
        plain = await c.run_hidden_tests(sid, HiddenTests({"t.py": "pass\n"}, "python t.py"))
        assert plain.passed and plain.marker_ok is None  # no marker used: the exit status decides


# --- the cap, reaping, shutdown, restart -------------------------------------------------------------
async def test_cap_gives_429_with_counts():
    async with serve(_service(max_sandboxes=2)) as url, SandboxClient(url) as c:
        a = await c.create("cap", FILES)
        await c.create("cap")
        status, body = await _raw("POST", f"{url}/sandboxes", json={"instance_id": "cap"})
        assert status == 429 and body["error"]["type"] == "too_many_sandboxes"
        err = body["error"]
        assert (err["live"], err["max_sandboxes"]) == (2, 2) and "--max-sandboxes" in err["message"]
        with pytest.raises(SandboxError) as e:
            await c.create("cap")
        assert e.value.type == "too_many_sandboxes" and e.value.fatal
        # waiting for a slot: one frees up while the request waits
        waiting = asyncio.create_task(c.create("cap", wait_s=10))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await c.destroy(a["sandbox_id"])
        assert (await waiting)["created"]
        with pytest.raises(SandboxError) as e:
            await c.create("cap", wait_s=0.3)
        assert "still full after waiting 0.3 s" in e.value.message
        health = await c.health()
        assert health["sandboxes"] == 2 and health["stats"]["rejected_at_cap"] >= 3


async def test_idle_sandboxes_are_reaped():
    async with serve(_service(idle_timeout_s=0.3, reap_interval_s=0.05)) as url, SandboxClient(url) as c:
        idle = await c.create("reap", FILES)
        busy = await c.create("reap")
        running = asyncio.create_task(c.exec(busy["sandbox_id"], "sleep 0.8"))  # busy, not idle
        await asyncio.sleep(0.6)
        with pytest.raises(SandboxError) as e:
            await c.read_file(idle["sandbox_id"], ".")
        assert (e.value.type, e.value.status) == ("sandbox_reaped", 404) and "--idle-timeout-s" in e.value.message
        assert not Path(idle["workdir"]).exists()
        assert (await running)["exit_code"] == 0
        assert (await c.read_file(busy["sandbox_id"], "README.md"))["content"] == "hello\n"
        assert (await c.health())["stats"]["reaped_idle"] == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_shutdown_kills_commands_and_removes_every_workdir(tmp_path, sig):
    server = SandboxServerProcess(workdir_parent=str(tmp_path))
    try:
        async with SandboxClient(server.url, **FAST) as c:
            boxes = [await c.create("shutdown", FILES), await c.create("shutdown")]
            root = Path(boxes[0]["workdir"]).parent
            cmd = "echo $$ > pid; setsid sleep 60 & echo $! > bg; exec sleep 60"
            running = asyncio.create_task(c.exec(boxes[0]["sandbox_id"], cmd, timeout_s=60))
            pid_file, bg_file = Path(boxes[0]["workdir"]) / "pid", Path(boxes[0]["workdir"]) / "bg"
            while not (pid_file.exists() and bg_file.exists() and bg_file.read_text().strip()):
                await asyncio.sleep(0.02)
            # the second left the process group
            pids = [_host_pid(pid_file.parent, int(f.read_text())) for f in (pid_file, bg_file)]
            assert all(p is not None and alive(p) for p in pids), pids
            code = await asyncio.to_thread(server.stop, sig)
            stderr = server.stderr_text()
            assert code == 0, stderr[-2000:]
            with pytest.raises(SandboxError) as e:
                await running
            assert e.value.type in ("sandbox_destroyed", "service_unavailable"), e.value
        assert not root.exists() and list(tmp_path.iterdir()) == []
        deadline = time.monotonic() + 5
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert [p for p in pids if alive(p)] == [], f"alive after shutdown (shell, setsid child): {pids}"
        assert "all sandboxes destroyed" in stderr
    finally:
        server.close()


async def test_crashed_service_restarts_clean_and_reports_lost_sandboxes(tmp_path):
    server = SandboxServerProcess(workdir_parent=str(tmp_path))
    try:
        async with SandboxClient(server.url, **FAST) as c:
            old = await c.create("crash", FILES)
            old_root = Path(old["workdir"]).parent
            server.kill()
            with pytest.raises(SandboxError) as e:  # down: refused (nothing sent, so retried), then typed
                await c.exec(old["sandbox_id"], "true")
            assert e.value.type == "service_unavailable" and "gave up after 3 attempts" in e.value.message
            server.restart()
            health = await c.health()
            assert health["stats"]["stale_dirs_removed"] == 1 and not old_root.exists()
            with pytest.raises(SandboxError) as e:
                await c.exec(old["sandbox_id"], "true")
            assert (e.value.type, e.value.status, e.value.fatal) == ("sandbox_lost", 404, True)
            assert "restarted" in e.value.message
            assert await c.destroy(old["sandbox_id"]) is False
            with pytest.raises(SandboxError) as e:  # a restarted service has no registered instances
                await c.create("crash")
            assert e.value.type == "unknown_instance"
            assert (await c.create("crash", FILES))["created"]
    finally:
        server.close()


# --- the reward protocol -----------------------------------------------------------------------------
def _items() -> list[RewardItem]:
    repo = {"calc.py": "def add(a, b):\n    pass\n"}
    tests = HiddenTests({"test_calc.py": f"from calc import add\nassert add(2, 3) == 5\nprint('{PASS_MARKER}')\n"},
                        "python test_calc.py")
    extra = {"swedev": {"instance_id": "calc", "files": file_list(repo), "test_command": None}}

    def item(body: str | None) -> RewardItem:
        sub = None if body is None else Changes({"calc.py": f"def add(a, b):\n    {body}\n"}).as_dict()
        return RewardItem("", tests.as_dict(), "swedev-test", "swedev",
                          {**extra, **({"swedev_submission": sub} if sub else {})})

    return [item("return a + b"), item("return a - b"), item("while True: pass"), item(None),
            RewardItem("#### 5", "5", "openai/gsm8k", "gsm8k")]


async def test_score_endpoint_speaks_the_reward_protocol_and_agrees_with_naive_and_prime():
    items = _items()
    kwargs = {"swedev": {"timeout_s": 1.5}}
    async with serve(_service()) as url:
        remote = make_reward_manager(RewardConfig(manager="swedev", url=url, scorer_kwargs=kwargs, **FAST))
        got = await remote.ascore_items(items)
        status, body = await _raw("POST", f"{url}/score", json={"items": [{"solution_str": 1}]})
        assert status == 400 and "items[0]" in body["error"]["message"]
        status, body = await _raw("POST", f"{url}/score", json={"items": [], "scorer": "nope"})
        assert status == 404 and "swedev" in body["error"]["scorers"]
    assert [r.score for r in got[:3]] == [1.0, 0.0, 0.0] and got[4].score == 1.0
    assert got[0].extra == {"passed": True, "exit_code": 0, "tests_error": None, "files_changed": 1}
    assert got[1].extra["exit_code"] == 1 and got[2].extra["tests_error"] == "timeout"
    assert got[3].error.type == "scorer_error" and "swedev_submission is missing" in got[3].error.message
    for manager in ("naive", "prime"):  # prime's workers ignore SIGCHLD: the scorer must still see exit codes
        with make_reward_manager(RewardConfig(manager=manager, scorer_kwargs=kwargs, num_workers=1)) as m:
            same = await asyncio.to_thread(m.score_items, items)
        assert [(r.score, r.extra, r.error.type if r.error else None) for r in same] == \
            [(r.score, r.extra, r.error.type if r.error else None) for r in got], manager


def test_cli_rejects_bad_settings():
    bad = subprocess.run([sys.executable, "-m", "verl_agentic.sandbox.server", "--wall-timeout-s", "900"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "max_timeout_s" in bad.stderr
