"""A real vLLM server for tests and benches: its virtual environment and its process.

``vllm_python()`` runs ``scripts/setup_vllm.sh`` once (it creates ``.venv-vllm`` or finds it up to
date) and returns that environment's python. ``VLLMServer(model_dir, log_path)`` starts
``python -m vllm.entrypoints.openai.api_server`` on a free loopback port in its own process group
(the API server and its engine-core process), waits for ``GET /health`` and keeps its output in
``log_path``; ``kill()`` is the crash (SIGKILL to the group), ``stop()`` the clean shutdown.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
SETUP_SCRIPT = REPO / "scripts" / "setup_vllm.sh"
START_TIMEOUT_S = 600.0  # a cold start on 2 busy cores: imports, weights, KV cache, warm-up
# Server flags on top of the required ones: trainer-convention logprobs (see backends/openai_http.py)
# and hermes tool-call parsing (chat tests with tools).
DEFAULT_ARGS = ("--logprobs-mode", "processed_logprobs", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")

_python: Optional[Path] = None


class VLLMUnavailable(RuntimeError):
    """The environment could not be set up or the server did not come up; the message has the log."""


class NotInTheVLLMTier(RuntimeError):
    """A test outside the vLLM tier (``make test`` leaves the tier out) asked for ``.venv-vllm``."""


def vllm_python() -> Path:
    """The python of ``.venv-vllm``, set up by ``scripts/setup_vllm.sh`` on the first call.

    Under pytest, only a test marked ``vllm`` may ask (tests/conftest.py sets ``VA_TEST_IN_VLLM_TIER`` before
    each test's fixtures): one that is not would set up 3.6 GB in ``make test``, whose budget leaves it out."""
    global _python
    if os.environ.get("VA_TEST_IN_VLLM_TIER") == "0":
        raise NotInTheVLLMTier(f"{os.environ.get('PYTEST_CURRENT_TEST', 'this test')} needs .venv-vllm but is not "
                               "marked vllm: use a fixture named in VLLM_FIXTURES (tests/conftest.py) or add yours there")
    if _python is None:
        r = subprocess.run(["bash", str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise VLLMUnavailable(f"{SETUP_SCRIPT} failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
        _python = Path(r.stdout.strip().splitlines()[-1])
    return _python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies, so an interrupted run leaves no server.

    SIGTERM, not SIGKILL: the API server then shuts its engine-core processes down too (they are
    its children and get no signal of their own).
    """
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server --model DIR`` on loopback (see the module docstring).

    Args:
        model_dir: the Hugging Face folder to serve.
        log_path: where the server's stdout and stderr go.
        extra_args: more server flags (after ``DEFAULT_ARGS``), e.g. ``("--dtype", "float32")``.
        env: more environment variables for the server.
    """

    def __init__(self, model_dir: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 extra_args: tuple[str, ...] = (), env: Optional[dict[str, str]] = None):
        self.model_dir = str(model_dir)
        self.log_path = Path(log_path)
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VLLMServer:
        """Start the server and wait until ``/health`` answers 200; raises ``VLLMUnavailable`` with the log."""
        python = vllm_python()
        self.port = free_port()
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", **self.env)
        env.pop("PYTHONPATH", None)  # nothing of ours (or of .venv) inside vLLM's environment
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
               "--max-model-len", "2048", "--enforce-eager", "--host", "127.0.0.1", "--port", str(self.port),
               *DEFAULT_ARGS, *self.extra_args]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True, preexec_fn=_die_with_parent)
        while not self._healthy():
            if self.proc.poll() is not None:
                raise VLLMUnavailable(f"the vLLM server exited with {self.proc.returncode} before it was up; "
                                      f"log {self.log_path}:\n{self.log_tail()}")
            if time.perf_counter() - t0 > timeout_s:
                self.stop()
                raise VLLMUnavailable(f"the vLLM server was not up within {timeout_s:.0f} s; "
                                      f"log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)
        self.start_s = time.perf_counter() - t0
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def ensure_running(self) -> VLLMServer:
        """Start it again (on a new port) if it is not running, e.g. after a test killed it."""
        if not self.running:
            self.start()
        return self

    def kill(self) -> None:
        """Crash the server: SIGKILL to its whole process group, at once."""
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            self._signal_group(signal.SIGKILL)  # leftovers of the group, if any
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


# ------------------------------------------------------------------ benches

def add_bench_args(parser: argparse.ArgumentParser) -> None:
    """The options a bench uses to reach vLLM: ``--vllm-url`` (a running server) and ``--threads-bind``."""
    parser.add_argument("--vllm-url", default=None, help="use this running server (serving --model) instead of starting one")
    parser.add_argument("--threads-bind", default="auto", help="VLLM_CPU_OMP_THREADS_BIND for the started server")


def bench_server(model_dir: str, args: argparse.Namespace, work: Path) -> tuple[Optional[VLLMServer], str]:
    """(the server started here or None, its URL): ``args.vllm_url`` when given, else a float32 server
    for ``model_dir`` logging to ``work/vllm.log``. The caller stops a started server."""
    if args.vllm_url:
        return None, args.vllm_url
    server = VLLMServer(model_dir, work / "vllm.log", ("--dtype", "float32"),
                        env={"VLLM_CPU_OMP_THREADS_BIND": args.threads_bind}).start()
    print(f"vLLM server up in {server.start_s:.0f} s (log {server.log_path})", file=sys.stderr)
    return server, server.url
