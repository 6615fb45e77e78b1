"""The Python sandbox on real processes: HumanEval, hostile snippets, cleanup, and the python tool.

Hostile snippets carry a unique marker in their source; since the source is the child's argv,
``/proc/*/cmdline`` finds every process a snippet started (children inherit the argv), which is
how "nothing is left behind" is checked, independently of the sandbox's own bookkeeping.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import gzip
import json
import os
import time
import uuid
from pathlib import Path

import pytest

from verl_agentic.interfaces import ConfigError
from verl_agentic.tools import load_tools
from verl_agentic.tools.python_sandbox import (
    PythonTool,
    SandboxLimits,
    run_python,
    run_python_sync,
    sandbox_support,
)

REPO = Path(__file__).resolve().parent.parent
HUMANEVAL = REPO / "data" / "humaneval" / "HumanEval.jsonl.gz"
IS_ROOT = os.geteuid() == 0


def marker() -> str:
    return f"va-sandbox-test-{uuid.uuid4().hex}"


def processes_with(text: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes().decode("utf-8", "replace")
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        if text in cmdline and stat[stat.rfind(")") + 2] not in "ZX":
            found.append(int(d))
    return found


def group_members(pgid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[2] == str(pgid) and fields[0] not in "ZX":
            out.append(int(d))
    return out


# --- HumanEval ---------------------------------------------------------------------------------
def _humaneval_rows() -> list[dict]:
    with gzip.open(HUMANEVAL, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


async def test_humaneval_canonical_solutions_pass_and_stubs_fail():
    rows = _humaneval_rows()
    assert len(rows) == 164
    sem = asyncio.Semaphore(4)

    async def run(program: str):
        async with sem:
            return await run_python(program)

    def program(row: dict, body: str) -> str:
        return row["prompt"] + body + "\n\n" + row["test"] + f"\n\ncheck({row['entry_point']})\n"

    t0 = time.perf_counter()
    good = await asyncio.gather(*(run(program(r, r["canonical_solution"])) for r in rows))
    stub = await asyncio.gather(*(run(program(r, "    pass\n")) for r in rows))
    elapsed = time.perf_counter() - t0

    failed = [(r["task_id"], res.error_type, res.stderr[-300:]) for r, res in zip(rows, good) if not res.ok]
    assert not failed, f"canonical solutions failing in the sandbox: {failed[:5]}"
    passed = [r["task_id"] for r, res in zip(rows, stub) if res.exit_code == 0]
    assert not passed, f"'pass' bodies passing their tests: {passed}"
    assert all(res.exit_code == 1 and res.error_type == "runtime_error" and not res.timed_out for res in stub)
    # the stubs fail in the tests (an assertion, or a TypeError on the None they return)
    assert sum("AssertionError" in res.stderr for res in stub) > 150  # 159 of 164 here
    assert elapsed < 90, f"328 sandboxed programs took {elapsed:.1f}s"


# --- basics ----------------------------------------------------------------------------------------
async def test_stdout_stderr_exit_code_stdin_and_files():
    res = await run_python("import sys\nprint(input()[::-1])\nprint(open('data/in.txt').read(), end='')\n"
                           "print('warn', file=sys.stderr)\nsys.exit(3)",
                           stdin="abc\n", files={"data/in.txt": "from a file\n"})
    assert res.stdout == "cba\nfrom a file\n"
    assert res.stderr == "warn\n"
    assert (res.exit_code, res.error_type, res.ok, res.timed_out, res.truncated) == (3, "runtime_error", False, False,
                                                                                     False)
    ok = await run_python("print('héllo', 6 * 7)")
    assert ok.ok and ok.stdout == "héllo 42\n" and ok.error_type is None and ok.killed_by is None
    # no stdin given: EOF at once, not a hang
    eof = await run_python("input()")
    assert eof.exit_code == 1 and "EOFError" in eof.stderr


async def test_syntax_error_and_traceback_are_reported():
    res = await run_python("def f(:\n  pass")
    assert res.exit_code == 1 and "SyntaxError" in res.stderr and res.error_type == "runtime_error"
    res = await run_python("def f():\n    return 1 / 0\nf()")
    assert "ZeroDivisionError" in res.stderr and 'File "<string>", line 2' in res.stderr


async def test_fresh_workdir_removed_given_workdir_kept(tmp_path):
    res = await run_python("import os; open('f.txt', 'w').write('x'); print(os.getcwd())")
    cwd = Path(res.stdout.strip())
    assert res.ok and cwd.name.startswith("va_sandbox_") and not cwd.exists()
    await run_python("open('state.txt', 'w').write('1')", workdir=tmp_path)
    res = await run_python("import os; print(open('state.txt').read(), os.getcwd())", workdir=tmp_path)
    assert res.stdout.split() == ["1", str(tmp_path)]
    # the work dir is importable: a module written by one call is imported by the next
    await run_python("open('helper.py', 'w').write('def f():\\n    return 41 + 1\\n')", workdir=tmp_path)
    res = await run_python("import helper; print(helper.f())", workdir=tmp_path)
    assert res.stdout == "42\n"


async def test_environment_is_minimal(monkeypatch):
    monkeypatch.setenv("VA_SECRET_TOKEN", "do-not-leak")
    res = await run_python("import os, sys; print(sorted(os.environ)); print(sys.flags.ignore_environment)")
    names = ast.literal_eval(res.stdout.splitlines()[0])
    assert "VA_SECRET_TOKEN" not in names and "HOME" in names and "PATH" in names
    assert res.stdout.splitlines()[1] == "1"


async def test_long_code_runs_through_a_file():
    code = "x = 0\n" + "x += 1\n" * 30_000 + "print(x)\n"  # ~210 kB: more than one argv entry may hold
    assert len(code) > 128 * 1024
    res = await run_python(code)
    assert res.ok and res.stdout == "30000\n"


def test_run_python_sync_outside_and_inside_a_loop():
    assert run_python_sync("print(2 + 2)").stdout == "4\n"

    async def inside():
        return run_python_sync("print(3 + 3)")  # blocks this loop, runs in a worker thread

    assert asyncio.run(inside()).stdout == "6\n"


def test_limits_validation():
    with pytest.raises(ConfigError, match="wall_timeout_s"):
        SandboxLimits(wall_timeout_s=0)
    with pytest.raises(ConfigError, match="memory_mb"):
        SandboxLimits(memory_mb=-1)
    with pytest.raises(ConfigError, match="unknown sandbox limits"):
        SandboxLimits.from_dict({"timeout": 3})


# --- hostile snippets ---------------------------------------------------------------------------
async def test_infinite_loop_hits_wall_timeout_and_the_group_is_gone():
    m = marker()
    code = (f"# {m}\nimport os, time\n"
            "if os.fork() == 0:\n    time.sleep(1000)\n"  # a sleeping child in the same group
            "print('looping', flush=True)\nwhile True:\n    pass\n")
    t0 = time.perf_counter()
    res = await run_python(code, limits=SandboxLimits(wall_timeout_s=1.5))
    elapsed = time.perf_counter() - t0
    assert res.timed_out and res.error_type == "timeout" and res.killed_by == "SIGKILL" and res.exit_code == -9
    assert res.stdout == "looping\n"  # output before the kill is kept (unbuffered)
    assert 1.4 < res.duration_s < 4.0 and elapsed < 6.0
    assert group_members(res.pid) == []
    assert processes_with(m) == []


async def test_cpu_time_limit():
    res = await run_python("while True:\n    pass", limits=SandboxLimits(wall_timeout_s=30, cpu_time_s=1))
    assert res.error_type == "cpu_time" and res.killed_by == "SIGXCPU" and not res.timed_out
    assert res.duration_s < 15  # 1 s of CPU; more wall time only if the cores are busy


async def test_memory_bomb_is_contained():
    t0 = time.perf_counter()
    res = await run_python("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
                           limits=SandboxLimits(memory_mb=256))
    assert res.error_type == "memory" and "MemoryError" in res.stderr and res.exit_code == 1
    assert time.perf_counter() - t0 < 8
    res = await run_python("x = bytearray(8 * 2**30)")  # one 8 GiB allocation, refused at once
    assert res.error_type == "memory" and res.duration_s < 2
    # under the limit: fine; and the machine is fine afterwards
    res = await run_python("x = bytearray(100 * 2**20); print(len(x))")
    assert res.ok and res.stdout == f"{100 * 2**20}\n"


async def test_fork_bomb_is_contained_and_nothing_is_left():
    support = sandbox_support()
    m = marker()
    # as root RLIMIT_NPROC does not apply: the bomb below must only ever run under a pids cgroup
    limits = SandboxLimits(wall_timeout_s=3, max_processes=32)
    probe = await run_python("pass", limits=limits)
    expected = "cgroup" if IS_ROOT else "rlimit"
    assert probe.process_limit == expected, (probe, support)
    code = (f"# {m}\nimport os, sys\nreported = False\n"
            "while True:\n"
            "    try:\n        os.fork()\n"
            "    except OSError as e:\n"
            "        if not reported:\n"
            "            reported = True\n"
            "            print('fork refused:', e.strerror, flush=True)\n")
    t0 = time.perf_counter()
    res = await run_python(code, limits=limits)
    assert time.perf_counter() - t0 < 8
    assert res.timed_out and res.error_type == "timeout" and res.process_limit == expected
    assert "fork refused: Resource temporarily unavailable" in res.stdout  # the limit bit
    assert group_members(res.pid) == []
    assert processes_with(m) == []
    if IS_ROOT:  # the per-run cgroups are gone too
        assert not list(Path(support["cgroup_base"]).glob(f"run-{os.getpid()}-*"))


async def test_background_process_that_leaves_the_group_is_killed_too():
    m = marker()
    code = (f"# {m}\nimport os, time\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(1000)\n"  # a daemon in its own session
            "print('parent done')\n")
    t0 = time.perf_counter()
    res = await run_python(code)
    # the call returns once the parent exits: the daemon holding the pipes is killed, not awaited
    assert res.ok and res.stdout == "parent done\n" and time.perf_counter() - t0 < 2.5
    if IS_ROOT:  # found through its cgroup (without one, only the process group is swept)
        assert processes_with(m) == []


async def test_output_flood_is_truncated_quickly():
    cap = 10_000
    for stream in ("sys.stdout", "sys.stderr"):
        res = await run_python(f"import sys\nwhile True:\n    print('x' * 999, file={stream})",
                               limits=SandboxLimits(max_output_bytes=cap))
        text = res.stdout if stream == "sys.stdout" else res.stderr
        assert res.truncated and res.error_type == "output_limit" and res.killed_by == "SIGKILL"
        assert len(text.encode()) == cap and set(text) <= {"x", "\n"}
        assert res.duration_s < 3


async def test_file_size_limit_applies_inside_and_outside_the_workdir(tmp_path):
    limits = SandboxLimits(file_size_mb=16)
    res = await run_python("open('big.bin', 'wb').write(b'\\0' * (100 * 2**20))", limits=limits)
    assert res.error_type == "file_size" and "File too large" in res.stderr
    # isolated (the default), a path outside the work dir does not exist (tests/test_isolation.py) ...
    outside = tmp_path / "outside.txt"
    res = await run_python(f"open({str(outside)!r}, 'w').write('escaped')", limits=limits)
    assert res.error_type == "runtime_error" and "FileNotFoundError" in res.stderr and not outside.exists()
    # ... with isolation: none the filesystem is NOT isolated: writing outside works (documented),
    # but only up to the file-size limit
    unisolated = dataclasses.replace(limits, isolation="none")
    res = await run_python(f"open({str(outside)!r}, 'w').write('escaped')", limits=unisolated)
    assert res.ok and outside.read_text() == "escaped" and res.isolation == "none"
    big = tmp_path / "big.bin"
    res = await run_python(f"open({str(big)!r}, 'wb').write(b'\\0' * (100 * 2**20))", limits=unisolated)
    assert res.error_type == "file_size" and big.stat().st_size <= 16 * 2**20


async def test_network_is_isolated():
    connections = []

    async def handle(reader, writer):
        connections.append(1)
        writer.write(b"hello from the host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = ("import socket\n"
            f"try:\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
            "    print('connected', s.recv(100))\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n")
    try:
        res = await run_python(code)
        if IS_ROOT:
            assert res.network_isolated  # root: a private network namespace must be available
        if res.network_isolated:
            assert res.stdout.startswith("refused") and connections == []
        # the control: the same snippet with network allowed reaches the server
        open_res = await run_python(code, limits=SandboxLimits(network=True))
        assert not open_res.network_isolated
        assert open_res.stdout.startswith("connected") and connections == [1]
    finally:
        server.close()
        await server.wait_closed()
    if IS_ROOT:
        # the sandbox's own loopback works (a server and a client inside one run)
        res = await run_python("import socket, threading\n"
                               "srv = socket.create_server(('127.0.0.1', 0)); port = srv.getsockname()[1]\n"
                               "threading.Thread(target=lambda: srv.accept()[0].sendall(b'ok'), daemon=True).start()\n"
                               "print(socket.create_connection(('127.0.0.1', port)).recv(2).decode())\n"
                               "socket.create_connection(('1.1.1.1', 53), timeout=2)\n")
        assert res.stdout == "ok\n" and "Network is unreachable" in res.stderr


async def test_privileges_are_dropped():
    code = ("import ctypes, resource\n"
            "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "try:\n    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY,) * 2)\n"
            "    print('raised')\nexcept (ValueError, OSError) as e:\n    print('refused')\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "print('unshare', libc.unshare(0x40000000), ctypes.get_errno())\n")
    res = await run_python(code)
    lines = res.stdout.splitlines()
    assert lines[1] == "refused"  # the code cannot lift its limits
    if IS_ROOT:
        assert int(lines[0], 16) == 0  # no capabilities left
        assert lines[2] == "unshare -1 1"  # EPERM: it cannot make (or leave) namespaces


async def test_cancellation_kills_the_run():
    m = marker()
    task = asyncio.create_task(run_python(f"# {m}\nimport time\ntime.sleep(100)"))
    for _ in range(200):
        await asyncio.sleep(0.02)
        if processes_with(m):
            break
    assert processes_with(m), "the sandboxed process did not start"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not processes_with(m):
            break
        await asyncio.sleep(0.02)
    assert processes_with(m) == []


# --- the python tool -----------------------------------------------------------------------------
async def test_tool_schema_and_registry():
    (tool,) = load_tools([{"class_name": "python", "config": {"wall_timeout_s": 1.5, "memory_mb": 256}}])
    assert isinstance(tool, PythonTool) and tool.name == "python"
    assert tool.limits.wall_timeout_s == 1.5 and tool.limits.memory_mb == 256
    fn = tool.get_openai_tool_schema()["function"]
    assert fn["parameters"]["required"] == ["code"] and fn["parameters"]["properties"]["code"]["type"] == "string"
    with pytest.raises(ConfigError, match="unknown config keys"):
        PythonTool(config={"wall_timeout": 3})


async def test_tool_episode_state_persists_and_episodes_are_isolated():
    tool = PythonTool(config={"wall_timeout_s": 5})
    a = await tool.create()
    b = await tool.create(files={"seed.txt": "seeded"})
    dir_a, dir_b = tool.workdir(a), tool.workdir(b)
    assert dir_a != dir_b and dir_a.is_dir() and dir_b.is_dir()

    r = await tool.execute(a, {"code": "open('notes.txt', 'w').write('from call 1')\nprint('saved')"})
    assert (r.status, r.text) == ("ok", "saved")
    r = await tool.execute(a, {"code": "print(open('notes.txt').read())"})
    assert (r.status, r.text) == ("ok", "from call 1")  # state across calls of one episode
    assert r.metrics["exit_code"] == 0 and r.metrics["duration_s"] > 0 and r.metrics["truncated"] is False

    r = await tool.execute(b, {"code": "import os\nprint(sorted(os.listdir('.')))"})
    assert r.text == "['seed.txt']"  # episode b sees its own files only
    r = await tool.execute(b, {"code": "open('notes.txt')"})
    assert r.status == "error" and "FileNotFoundError" in r.text and "[exit code 1]" in r.text

    await tool.release(a)
    assert not dir_a.exists() and dir_b.exists()
    with pytest.raises(KeyError, match="create"):
        await tool.execute(a, {"code": "print(1)"})
    await tool.release(b)
    assert not dir_b.exists()


async def test_tool_statuses_and_messages():
    tool = PythonTool(config={"wall_timeout_s": 1, "max_output_bytes": 5000, "max_output_chars": 1000})
    iid = await tool.create()
    try:
        r = await tool.execute(iid, {"code": "while True: pass"})
        assert r.status == "timeout" and "timed out after 1 s" in r.text and r.metrics["timed_out"]
        r = await tool.execute(iid, {"code": "while True: print('y' * 100)"})
        assert r.status == "error" and "truncated" in r.text and r.metrics["truncated"] and len(r.text) < 1200
        r = await tool.execute(iid, {"code": "pass"})
        assert (r.status, r.text) == ("ok", "(no output)")
        r = await tool.execute(iid, {"code": "raise ValueError('bad input')"})
        assert r.status == "error" and r.text.rstrip().endswith("[exit code 1]") and "ValueError: bad input" in r.text
        r = await tool.execute(iid, {"source": "print(1)"})
        assert r.status == "error" and "'code'" in r.text
        assert await tool.calc_reward(iid) == 0.0
    finally:
        await tool.release(iid)


async def test_tool_calls_of_different_episodes_run_concurrently():
    tool = PythonTool(config={"max_concurrency": 4})
    ids = [await tool.create() for _ in range(4)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(tool.execute(i, {"code": "import time; time.sleep(1); print('done')"})
                                     for i in ids))
    assert [r.text for r in results] == ["done"] * 4
    assert time.perf_counter() - t0 < 3.5  # not 4 x 1 s in a row
    for i in ids:
        await tool.release(i)
