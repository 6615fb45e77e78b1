"""Shared fixtures: real tokenizers (Qwen2.5, Qwen3, SmolLM2) and small real models."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from va_testing import QWEN3_DIR, QWEN25_DIR, release_memory, remove_orphan_shm, shm_segments

pytest_plugins = ["va_serial_split"]  # scripts/run_tests.sh's split into its two passes


# ---------------------------------------------------------------------------------------------
# the suite's peak memory, printed at the end (issue 37: at most 16 GB)

def _machine_used_gb() -> float:
    """MemTotal - MemAvailable: what the machine cannot give back (processes, shared memory)."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 2**20


def _tree_pss_gb(root: int) -> float:
    """The proportional set size of ``root`` and every process below it (shared pages counted once)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # the process ended while we looked
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:  # ended, or not ours to read
            continue
    return total / 2**20


class _MemoryPeak:
    def __init__(self, interval_s: float = 2.0):
        self.start_gb = _machine_used_gb()
        self.machine_gb = self.start_gb
        self.tree_gb = 0.0
        self.where = ""
        self.current = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True, name="memory-peak")
        self._thread.start()

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            machine, tree = _machine_used_gb(), _tree_pss_gb(os.getpid())
            if tree > self.tree_gb:
                self.tree_gb, self.where = tree, self.current
            self.machine_gb = max(self.machine_gb, machine)

    def stop(self) -> None:
        self._stop.set()


_PEAK: list[_MemoryPeak] = []


def pytest_sessionstart(session) -> None:
    # an xdist worker's processes are below the controller's, which samples them (and gets each test's start)
    if os.environ.get("VA_MEMORY_PEAK", "1") != "0" and not os.environ.get("PYTEST_XDIST_WORKER"):
        _PEAK.append(_MemoryPeak())


def pytest_runtest_logstart(nodeid, location) -> None:
    if _PEAK:
        _PEAK[0].current = nodeid


def pytest_terminal_summary(terminalreporter) -> None:
    if _PEAK:
        p = _PEAK[0]
        p.stop()
        terminalreporter.write_line(
            f"peak memory: {p.tree_gb:.1f} GB in the test processes (PSS of pytest and every process below it, "
            f"sampled every 2 s; at {p.where or 'start'}); the machine's used memory peaked at {p.machine_gb:.1f} "
            f"GB ({p.start_gb:.1f} GB before the tests)")


# ---------------------------------------------------------------------------------------------
# make test-fast: everything but the tests marked slow (in their module, or listed in slow_tests.txt)

SLOW_LIST = Path(__file__).with_name("slow_tests.txt")


def slow_test_ids() -> set[str]:
    return {line.split()[1] for line in SLOW_LIST.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


# make test runs the suite in two passes (scripts/run_tests.sh): the tests not marked serial on two worker
# processes, then the serial ones alone. Serial: the tests that launch verl's trainer or vLLM (they need
# most of the machine's memory): whole modules (SERIAL_MODULES), or in a module with cheap tests beside its
# launches, the tests that use a fixture that launches (SERIAL_FIXTURES; the rest of the module, guards that
# run a probe process or an in-process server, stays in the first pass), and single tests marked in their
# module because they start a Ray cluster (two local clusters at once can find each other's address) or
# measure a time that two busy cores would skew. test_verl_async.py is not serial: it runs verl's client
# against our server in its own process, with a tiny model, and starts no Ray.
SERIAL_MODULES = {"test_verl_user_tasks.py", "test_verl_vllm.py", "test_vllm.py"}
SERIAL_FIXTURES = {"verl_run", "cluster"}  # test_verl_cpu.py's three launches, test_verl_two_nodes.py's Ray nodes
# The vLLM tier (make test-vllm; make test leaves it out): every test that needs .venv-vllm, i.e. uses one of
# these fixtures (directly or through another fixture). DEVLOG, twenty-fifth session: why it is a tier.
VLLM_FIXTURES = {"vllm_py", "smol_server", "tiny_server"}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before the test's fixtures: tell ``va_vllm.vllm_python`` whether this test is in the vLLM tier."""
    os.environ["VA_TEST_IN_VLLM_TIER"] = "1" if item.get_closest_marker("vllm") else "0"


def pytest_collection_modifyitems(config, items) -> None:
    slow = slow_test_ids()
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.path.name in SERIAL_MODULES or SERIAL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.serial)
        if VLLM_FIXTURES & fixtures:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(autouse=True, scope="module")
def _no_orphan_shared_memory():
    """After each test module: remove the shared-memory segments it left that nothing holds (vLLM's, when
    Ray kills its engine), and give the memory its models used back to the OS, so neither crowds the
    verl runs after it (Ray kills workers at 95% of the machine's memory)."""
    before = shm_segments()
    yield
    remove_orphan_shm(before)
    release_memory()


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN25_DIR)


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN3_DIR)


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    from verl_agentic.models.embedded import embedded_model_dir

    return embedded_model_dir(quiet=True)


@pytest.fixture(scope="session")
def smol_tokenizer(smol_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="session")
def tiny_qwen_dir() -> Path:
    """A tiny random Qwen2 model carrying the real Qwen2.5 tokenizer (fast generation)."""
    from verl_agentic.models.tiny import make_tiny_model

    return Path(make_tiny_model(str(QWEN25_DIR)))


@pytest.fixture(scope="session")
def tiny_smol_dir(smol_dir) -> str:
    """A tiny random Qwen2 with SmolLM2's tokenizer (49k vocab: cheap logits), for the trainer's tests."""
    from verl_agentic.models.tiny import make_tiny_model

    return make_tiny_model(str(smol_dir))


@pytest.fixture(scope="session")
def tiny_llama_dir(smol_dir) -> str:
    """A tiny random Llama (SmolLM2's architecture: no q/k/v biases) with SmolLM2's tokenizer: the engine's
    tests of both model families, at a tiny model's cost."""
    from verl_agentic.models.tiny import make_tiny_model

    return make_tiny_model(str(smol_dir), architecture="llama")
