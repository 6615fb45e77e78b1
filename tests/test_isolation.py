"""The isolation engine against a hostile battery, on real processes (no mocks).

Each test runs code that tries to break out for real: kill or trace the caller (its real pid is
written into the snippet), see host processes, read, write or delete files outside its work dir
(a "run dir" the test fills, the repository's datasets, the venv, home, the host's /tmp and
/dev/shm), read a secret from the caller's environment, reach a server of the test on the host's
loopback, gain privileges. Each then checks, from the host, that the caller and the files are
untouched and that the attempt came back as a normal result. ``isolation: none`` is the control
where that is safe to show (the same snippet reads the file it cannot read under bwrap).
The last test runs the battery through a real rollout (``gsm8k`` with the ``python`` tool; the
model is a scripted test double) and checks that every episode's trajectory is written.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from va_sandbox import alive
from va_testing import GSM8K_TEST, REPO
from verl_agentic.agentic_utils import load_rows
from verl_agentic.backends.base import GenerationBackend
from verl_agentic.interfaces import ConfigError, GenOutput
from verl_agentic.isolation import IsolationUnavailable, SandboxLimits, run_python, sandbox_support
from verl_agentic.isolation.bwrap import probe
from verl_agentic.rollout import AsyncRollout, RolloutConfig, read_jsonl, write_jsonl
from verl_agentic.tools.python_sandbox import PythonTool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux namespaces")

SECRET = f"sk-va-test-{uuid.uuid4().hex}"


@pytest.fixture(scope="module", autouse=True)
def bwrap_works():
    support = sandbox_support()
    assert support["bwrap"], f"bubblewrap must work here (scripts/setup_bwrap.sh): {support['bwrap_reason']}"


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    """What a run owns outside the sandbox: outputs, a checkpoint, a dataset."""
    d = tmp_path / "run"
    (d / "checkpoints").mkdir(parents=True)
    (d / "checkpoints" / "step_10.pt").write_bytes(b"weights" * 100)
    (d / "trajectories.jsonl").write_text('{"uid": "x"}\n')
    (d / "dataset.jsonl").write_text('{"question": "?"}\n')
    return d


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None, p.stat().st_mode)
            for p in sorted(d.rglob("*"))}


# --- processes -------------------------------------------------------------------------------------
async def test_cannot_signal_kill_or_trace_the_caller_or_any_host_process():
    victim = subprocess.Popen(["sleep", "60"])  # a host process of the same user (root)
    me = os.getpid()
    code = f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
for name, pid in (("caller", {me}), ("victim", {victim.pid})):
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
        try:
            os.kill(pid, sig)
            print(name, sig.name, "sent")
        except OSError as e:
            print(name, sig.name, type(e).__name__)
    r = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    print(name, "ptrace", r, os.strerror(ctypes.get_errno()))
os.kill(os.getppid(), signal.SIGKILL)  # its parent: bwrap's init of its PID namespace (ignores it)
for d in os.listdir("/proc"):  # kill everything it can see
    if d.isdigit() and int(d) != os.getpid():
        try:
            os.kill(int(d), signal.SIGKILL)
        except OSError:
            pass
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal
except OSError as e:
    print("kill -1", type(e).__name__)
print("still here")
"""
    try:
        res = await run_python(code)
        assert alive(me) and alive(victim.pid) and victim.poll() is None
        out = res.stdout
        assert res.isolation == "bwrap" and res.error_type is None and out.endswith("still here\n"), res
        for name in ("caller", "victim"):  # their pids do not exist in the sandbox's PID namespace
            assert f"{name} SIGKILL ProcessLookupError" in out and f"{name} ptrace -1 No such process" in out
    finally:
        victim.kill()
        victim.wait()


async def test_sees_only_its_own_processes():
    res = await run_python("import os\nprint(sorted(int(d) for d in os.listdir('/proc') if d.isdigit()))\n"
                           f"print(os.path.exists('/proc/{os.getpid()}'), os.getpid(), os.getppid())")
    pids, line2 = res.stdout.splitlines()
    assert json.loads(pids) == [1, 2] and line2 == "False 2 1"  # bwrap's init and the code itself


async def test_background_processes_die_with_the_call():
    m = f"va-iso-{uuid.uuid4().hex}"
    res = await run_python(f"# {m}\nimport os, subprocess, time\n"
                           "if os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n"
                           "subprocess.Popen(['sleep', '617.25'], start_new_session=True)\nprint('left')")
    assert res.ok and res.stdout == "left\n"
    left = [d for d in os.listdir("/proc") if d.isdigit() and alive(int(d))
            and (m.encode() in _cmdline(d) or b"617.25" in _cmdline(d))]
    assert left == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# --- files -------------------------------------------------------------------------------------------
HOSTILE_FILES = """
import os, shutil, sys
def attempt(label, fn):
    try:
        r = fn()
        print(label, "DONE", repr(r)[:60])
    except Exception as e:
        print(label, "REFUSED", type(e).__name__)
RUN = {run!r}
attempt("read checkpoint", lambda: open(RUN + "/checkpoints/step_10.pt", "rb").read())
attempt("overwrite checkpoint", lambda: open(RUN + "/checkpoints/step_10.pt", "wb").write(b"x"))
attempt("delete trajectories", lambda: os.remove(RUN + "/trajectories.jsonl"))
attempt("create beside", lambda: open(RUN + "/planted.py", "w").write("x"))
attempt("rmtree run", lambda: shutil.rmtree(RUN))
attempt("read dataset", lambda: open({dataset!r}).read())
attempt("list repo", lambda: os.listdir({repo!r}))
attempt("write venv", lambda: open(sys.prefix + "/planted.txt", "w").write("x"))
attempt("write stdlib", lambda: open(os.__file__, "a").write("x"))
attempt("list home", lambda: sorted(os.listdir("/root")))
attempt("read bashrc", lambda: open("/root/.bashrc").read())
attempt("host tmp", lambda: open({host_tmp!r}, "w").write("x"))
attempt("host shm", lambda: open({host_shm!r}, "w").write("x"))
attempt("etc shadow", lambda: open("/etc/shadow").read())
attempt("chmod stdlib", lambda: os.chmod(os.__file__, 0o777))
attempt("work dir", lambda: open("mine.txt", "w").write("ok"))
"""


def _outcomes(stdout: str) -> dict:
    return {m.group(1): m.group(2) for m in re.finditer(r"^(.+?) (DONE|REFUSED)", stdout, re.M)}


async def test_files_outside_the_work_dir_cannot_be_read_written_or_deleted(run_dir, tmp_path):
    tag = uuid.uuid4().hex
    host_tmp, host_shm = f"/tmp/va-iso-{tag}", f"/dev/shm/va-iso-{tag}"
    dataset = REPO / "data" / "humaneval" / "README.md"
    before, stdlib = snapshot(run_dir), Path(os.__file__).read_bytes()
    wd = tmp_path / "work"
    code = HOSTILE_FILES.format(run=str(run_dir), dataset=str(dataset), repo=str(REPO), host_tmp=host_tmp,
                                host_shm=host_shm)
    res = await run_python(code, workdir=wd)
    got = _outcomes(res.stdout)
    assert res.ok, res.stderr
    allowed = {"host tmp", "host shm", "work dir", "list home"}  # private tmpfs, its own dir, /root's skeleton
    # a venv inside the repository (a fresh clone's .venv) is bound read-only there: the repository's
    # skeleton then shows that one folder and nothing else of the repository
    venv = Path(sys.prefix).resolve()
    if venv.is_relative_to(REPO.resolve()):
        allowed.add("list repo")
        top = venv.relative_to(REPO.resolve()).parts[0]
        assert re.search(rf"^list repo DONE \[{re.escape(repr(top))}\]", res.stdout, re.M), res.stdout
    assert {k for k, v in got.items() if v == "DONE"} == allowed, res.stdout
    assert len(got) == 16
    assert re.search(r"^list home DONE \['.pyenv'\]", res.stdout, re.M)  # only the interpreter's prefix
    # from the host: nothing changed, nothing appeared
    assert snapshot(run_dir) == before and Path(os.__file__).read_bytes() == stdlib
    assert not Path(host_tmp).exists() and not Path(host_shm).exists()
    assert not (Path(sys.prefix) / "planted.txt").exists()
    assert (wd / "mine.txt").read_text() == "ok"
    # the control, limited to the test's own files: without isolation the code reads and deletes them
    safe = ('attempt("read checkpoint"', 'attempt("rmtree run"')  # never the venv, the stdlib or host /tmp
    control = "\n".join(line for line in code.splitlines() if not line.startswith("attempt(") or line.startswith(safe))
    res = await run_python(control, workdir=wd, limits=SandboxLimits(isolation="none"))
    assert _outcomes(res.stdout) == {"read checkpoint": "DONE", "rmtree run": "DONE"} and not run_dir.exists()


async def test_symlinks_in_the_work_dir_do_not_lead_out(run_dir, tmp_path):
    wd = tmp_path / "work"
    res = await run_python(f"import os\nos.symlink({str(run_dir)!r}, 'out')\n"
                           "try:\n    print(os.listdir('out'))\nexcept OSError as e:\n    print(type(e).__name__)\n"
                           "os.symlink('/', 'root')\nprint(sorted(os.listdir('root')))", workdir=wd)
    lines = res.stdout.splitlines()
    # '/' is the sandbox's root: system dirs and the skeleton of the bound prefixes (e.g. /work/main/.venv)
    assert lines[0] == "FileNotFoundError" and "home" not in lines[1] and "var" not in lines[1], res.stdout


# --- environment, network, privileges -------------------------------------------------------------
async def test_caller_environment_secrets_do_not_reach_the_code(monkeypatch):
    monkeypatch.setenv("VA_TEST_API_KEY", SECRET)
    res = await run_python("import os\nprint(dict(os.environ))\n"
                           "for p in ('/proc/1/environ', '/proc/self/environ', f'/proc/{os.getppid()}/environ'):\n"
                           "    try:\n        print(open(p, 'rb').read())\n"
                           "    except OSError as e:\n        print(p, type(e).__name__)\n")
    assert res.ok and SECRET not in res.stdout + res.stderr and "VA_TEST_API_KEY" not in res.stdout


async def test_no_network_not_even_the_hosts_loopback_or_abstract_sockets(tmp_path):
    hits = []

    async def handle(reader, writer):
        hits.append(1)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0va-iso-{uuid.uuid4().hex}")
    abstract.listen()
    path_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path_sock.bind(str(tmp_path / "daemon.sock"))
    path_sock.listen()
    code = f"""
import socket
def attempt(label, fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(addr)
        print(label, "CONNECTED")
    except OSError as e:
        print(label, "REFUSED", type(e).__name__)
attempt("loopback", socket.AF_INET, ("127.0.0.1", {port}))
attempt("abstract", socket.AF_UNIX, {abstract.getsockname()!r})
attempt("unix path", socket.AF_UNIX, {str(tmp_path / "daemon.sock")!r})
attempt("outside", socket.AF_INET, ("1.1.1.1", 53))
"""
    try:
        res = await run_python(code)
        assert res.network_isolated and res.stdout.count("REFUSED") == 4, res.stdout
        assert hits == []
    finally:
        server.close()
        await server.wait_closed()
        abstract.close()
        path_sock.close()


async def test_runs_unprivileged_and_cannot_gain_privileges():
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(os.getuid(), os.geteuid(), os.getgid(), status["CapEff"].strip(), status["CapBnd"].strip(),
      status["NoNewPrivs"].strip())
for label, fn in (("setuid0", lambda: os.setuid(0)), ("setgid0", lambda: os.setgid(0))):
    try:
        fn()
        print(label, "DONE")
    except OSError as e:
        print(label, "REFUSED", e.errno)
print("unshare-user", libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER
print("unshare-net", libc.unshare(0x40000000), ctypes.get_errno())
print("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None), ctypes.get_errno())
"""
    res = await run_python(code)
    lines = res.stdout.splitlines()
    assert lines[0] == "65534 65534 65534 0000000000000000 0000000000000000 1", res.stdout
    # EINVAL: uid/gid 0 does not exist in its user namespace (and it has no CAP_SETUID anyway)
    assert lines[1] in ("setuid0 REFUSED 1", "setuid0 REFUSED 22") and lines[2].startswith("setgid0 REFUSED")
    assert lines[3].startswith("unshare-user -1 ") and lines[4] == "unshare-net -1 1" and lines[5] == "mount -1 1"


# --- resources (the limits that held before, now inside the namespaces) ---------------------------
async def test_resource_exhaustion_is_contained():
    limits = SandboxLimits(wall_timeout_s=3, max_processes=32, memory_mb=256, max_output_bytes=10_000, tmp_mb=8)
    bomb = await run_python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                            "        pass", limits=limits)
    hog = await run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))", limits=limits)
    flood = await run_python("while True:\n    print('y' * 1000)", limits=limits)
    tmpfs = await run_python("open('/tmp/fill', 'wb').write(b'0' * (64 * 2**20))", limits=limits)
    assert bomb.timed_out and bomb.process_limit == "cgroup"
    assert hog.error_type == "memory"
    assert flood.error_type == "output_limit" and len(flood.stdout) == 10_000
    assert tmpfs.error_type in ("runtime_error", "file_size") and ("No space left" in tmpfs.stderr
                                                                   or "File too large" in tmpfs.stderr)


# --- refusing to run without isolation -------------------------------------------------------------
async def test_missing_bwrap_refuses_with_how_to_install_it_and_none_warns(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    probe.cache_clear()
    try:
        with pytest.raises(IsolationUnavailable, match="apt-get install -y bubblewrap") as e:
            await run_python("print(1)")
        assert "scripts/setup_bwrap.sh" in str(e.value) and "isolation: none" in str(e.value)
        assert isinstance(e.value, ConfigError)
        with pytest.raises(IsolationUnavailable, match="bubblewrap"):
            PythonTool(config={})
        with caplog.at_level(logging.WARNING):
            for _ in range(2):  # a warning at every start of a tool
                tool = PythonTool(config={"isolation": "none"})
        assert sum("WITHOUT process isolation" in r.getMessage() for r in caplog.records) >= 2
        res = await run_python("print(1)", limits=SandboxLimits(isolation="none"))
        assert res.ok and res.isolation == "none" and tool.limits.isolation == "none"
        # the sandbox service refuses to start (exit 2, the same message)
        svc = subprocess.run([sys.executable, "-m", "verl_agentic.sandbox.server", "--port", "0"],
                             capture_output=True, text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path)})
        assert svc.returncode == 2 and "apt-get install -y bubblewrap" in svc.stderr, svc.stderr[-2000:]
    finally:
        probe.cache_clear()
    with pytest.raises(ConfigError, match="isolation must be one of"):
        SandboxLimits(isolation="docker")
    with pytest.raises(ConfigError, match="readonly_paths"):
        SandboxLimits(readonly_paths="relative/path")


async def test_the_service_refuses_requests_that_weaken_isolation():
    from verl_agentic.sandbox.client import SandboxClient, SandboxError
    from verl_agentic.sandbox.server import ServiceConfig, serve

    async with serve(ServiceConfig(max_sandboxes=2)) as url, SandboxClient(url) as c:
        for limits in ({"isolation": "none"}, {"readonly_paths": ["/"]}):
            with pytest.raises(SandboxError) as e:
                await c.create("weak", {"a.py": "x"}, limits=limits)
            assert e.value.type == "bad_request" and "set by the service" in e.value.message
        sid = (await c.create("ok", {"a.py": "x"}))["sandbox_id"]
        res = await c.exec(sid, f"cat /proc/{os.getpid()}/environ; ls {REPO}/pyproject.toml /root/.bashrc; id -u")
        assert res["stdout"].strip() == "65534" and res["stderr"].count("No such file") == 3, res


# --- the battery inside a real rollout ----------------------------------------------------------------
def battery(caller_pid: int, run_dir: Path) -> list[str]:
    """Hostile snippets (and benign ones between them), one per episode."""
    return [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('ppid killed?')",
        f"import os, signal\nos.kill({caller_pid}, signal.SIGKILL)",
        "import os, signal\nfor d in os.listdir('/proc'):\n    if d.isdigit():\n"
        "        try:\n            os.kill(int(d), signal.SIGKILL)\n        except OSError:\n            pass",
        f"import shutil\nshutil.rmtree({str(run_dir)!r})",
        f"open({str(run_dir / 'checkpoints' / 'step_10.pt')!r}, 'wb').write(b'poisoned')",
        "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "x = []\nwhile True:\n    x.append(bytearray(10**7))",
        "while True:\n    print('y' * 1000)",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nprint('daemon left')",
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)",
        "import os\nos.setuid(0)",
        "print(6 * 7)",
        "print(sum(range(10)))",
    ]


class ScriptedCoder(GenerationBackend):
    """TEST DOUBLE for the model: episode i (found by its question) answers with ``snippets[i]`` in a
    python fence, then with a final answer. No model runs; the tool calls and the sandbox are real."""

    def __init__(self, tokenizer, questions: list[str], snippets: list[str]):
        self.tokenizer = tokenizer
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.stop_token_ids = [self.end_id]
        self.questions, self.snippets = questions, snippets

    async def generate(self, prompt_ids, sampling):
        context = self.tokenizer.decode(prompt_ids)
        i = next(k for k, q in enumerate(self.questions) if q in context)
        turn = context.count("<|im_start|>assistant") - 1
        reply = f"Let me run it.\n```python\n{self.snippets[i]}\n```" if turn == 0 else "The answer is #### 0"
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_id]
        return GenOutput(ids, [0.0] * len(ids), self.tokenizer.decode(ids), "stop")


async def test_hostile_battery_inside_a_real_rollout_leaves_every_other_episode_and_file_intact(
        qwen25_tokenizer, run_dir):
    snippets = battery(os.getpid(), run_dir)
    rows = load_rows(GSM8K_TEST, "gsm8k", len(snippets))
    questions = [r["prompt"][-1]["content"] if isinstance(r.get("prompt"), list) else r["question"] for r in rows]
    questions = [q[:80] for q in questions]
    before = snapshot(run_dir)
    tool = {"class_name": "python", "config": {"wall_timeout_s": 3, "memory_mb": 256, "max_processes": 32,
                                               "max_output_bytes": 10_000}}
    task_cfg = {"gsm8k": {"tools": [tool], "parser": "python_code", "call_timeout_s": 30}}
    rollout = AsyncRollout(ScriptedCoder(qwen25_tokenizer, questions, snippets),
                           RolloutConfig(max_turns=3, max_new_tokens=512, max_total_tokens=4096, temperature=0,
                                         concurrency=len(snippets)), task_configs=task_cfg, seed=0)
    trajs = await rollout.run(rows)
    out = run_dir / "trajectories_rollout.jsonl"
    write_jsonl(out, trajs)  # the caller is alive and its run dir writable
    assert alive(os.getpid()) and len(read_jsonl(out)) == len(snippets)
    assert {k: v for k, v in snapshot(run_dir).items() if k != out.name} == before
    tool_texts = []
    for t in trajs:
        assert t["error"] is None, t["error"]
        msgs = [m["content"] for m in t["messages"] if m["role"] == "tool"]
        assert len(msgs) == 1 and t["metrics"]["tool_calls"] == 1, t["messages"]
        tool_texts.append(msgs[0])
    assert tool_texts[-2:] == ["42", "45"]  # the benign episodes beside the hostile ones
    assert "PermissionError" in tool_texts[3] or "FileNotFoundError" in tool_texts[3]
    assert "FileNotFoundError" in tool_texts[4]
    assert SECRET not in "".join(tool_texts)
    assert "timed out" in tool_texts[6] and "MemoryError" in tool_texts[7] and "truncated" in tool_texts[8]
    assert tool_texts[9] == "daemon left" and "[Errno 22] Invalid argument" in tool_texts[11]  # no uid 0 there
