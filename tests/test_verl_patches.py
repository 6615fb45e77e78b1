"""The verl plugin's patches as data (verl_agentic/verl_plugin/upstream.py): one registry lists every change to
verl, vLLM and transformers; the package's source has no patch site it does not list; ``install()`` applies
them in order, each only in its mode, on its versions, unless switched off; a patch that never ran on a GPU
(the weight-sync guard) is off there unless switched on; per-turn rewards wrap verl only when a run asks;
``python -m verl_agentic.verl_plugin --patches`` prints what a process has installed. Light: no trainer, no
vLLM (its side: tests/test_verl_vllm.py)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from va_patch_sites import PKG, patch_sites, sites_in
from va_testing import QWEN25_DIR, REPO
from verl_agentic.verl_plugin import upstream

TESTS = REPO / "tests"


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_AGENTIC_", "VERL_PLATFORM"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**base, "PYTHONWARNINGS": "ignore", **env})


# --------------------------------------------------------------------------------------------
# the registry against the source


def test_every_patch_site_in_the_package_is_in_the_registry():
    """Every store into verl/vLLM/transformers/torch objects, registration into their registries and change
    of the import system that the package's source makes is listed by a patch; every listed site exists."""
    found = patch_sites()
    listed = {site: p.name for p in upstream.PATCHES for site in p.sites}
    unlisted = sorted(f"{site} (line {', '.join(map(str, found[site]))})" for site in set(found) - set(listed))
    stale = sorted(f"{site} ({listed[site]})" for site in set(listed) - set(found))
    assert not unlisted, "patch sites no registry entry lists (add them to upstream.PATCHES): " + "; ".join(unlisted)
    assert not stale, "registry sites not in the source any more: " + "; ".join(stale)


def test_the_site_scan_finds_planted_patches(tmp_path):
    """The scan is not vacuous: each kind of change is reported, and our own objects are not."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import sys\nimport verl.workers.rollout.base as base\nfrom verl.trainer.ppo import core_algos\n"
        "from transformers import AutoConfig\n\n\n"
        "def wrapper():\n    pass\n\n\nwrapper.flag = True\n\n\n"
        "def patch(trainer, module):\n"
        "    base._ROLLOUT_REGISTRY['x', 'async'] = 'y'\n"
        "    cls = module.Trainer\n    cls.__init__ = wrapper\n    trainer.total_steps = 1\n"
        "    setattr(core_algos, 'x', 1)\n    core_algos.register_adv_est('x')(wrapper)\n"
        "    workers = sys.modules.get('verl.workers.engine_workers')\n    workers.f = wrapper\n"
        "    sys.meta_path.append(object())\n    AutoConfig.register('x', wrapper)\n"
        "    config = AutoConfig.from_pretrained('x')\n    config.pad_token_id = 0\n")
    got = {expr for _, expr in sites_in(planted, "verl_plugin/planted.py")}
    assert got == {"base._ROLLOUT_REGISTRY['x', 'async']", "cls.__init__", "trainer.total_steps",
                   "setattr(core_algos, ...)", "core_algos.register_adv_est(...)", "workers.f",
                   "sys.meta_path.append(...)", "AutoConfig.register(...)"}
    # outside verl_plugin/ a function's parameters are not followed (the package's own objects)
    assert "trainer.total_steps" not in {expr for _, expr in sites_in(planted, "rollout/planted.py")}


def _test_functions(path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


def test_each_entry_says_mode_switch_versions_and_an_existing_guarding_test():
    assert len({p.name for p in upstream.PATCHES}) == len(upstream.PATCHES)
    for p in upstream.PATCHES:
        assert p.mode in (upstream.ALWAYS, upstream.CPU, upstream.OPT_IN), p.name
        assert p.change and p.switch and p.tests and p.sites, p.name
        assert (p.apply is not None) or p.trigger != upstream.INSTALL, p.name
        private = [n for n in p.names if n.attribute.startswith("_") or n.target.rpartition(".")[2].startswith("_")]
        assert not private or p.versions, f"{p.name} touches private names {private}: it must name its versions"
        for test in p.tests:
            file, _, function = test.partition("::")
            assert (REPO / file).is_file(), (p.name, test)
            assert not function or function in _test_functions(REPO / file), (p.name, test)
    # the private names the issue found unlisted
    names = {(n.target, n.attribute) for p in upstream.PATCHES for n in p.names}
    assert {("verl.workers.engine.base.EngineRegistry", "_engines"),
            ("verl.trainer.ppo.v1.trainer_separate_async.PPOTrainerSeparateAsync", "__init__"),
            ("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "total_training_steps")} <= names


def test_every_verl_name_a_patch_touches_still_exists():
    """An upgrade that moves one fails here by name (vLLM's side: tests/test_verl_vllm.py). An attribute set
    on the trainer's instances counts when the class still assigns it; a name that is gone is reported."""
    assert len(upstream.VERL) >= 12 and upstream.missing(upstream.VERL) == []
    assert upstream.missing((("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "no_such_steps", ""),
                             ("verl.no_such_module", "x", ""))) == [
        "verl.trainer.ppo.v1.trainer_base.PPOTrainer.no_such_steps", "verl.no_such_module.x"]


def test_every_apply_function_resolves():
    """The functions install() and the on-demand callers run exist (modules that import vLLM aside)."""
    import importlib

    for p in upstream.PATCHES:
        if p.apply is None or "vllm_sync" in p.apply or "vllm_replica" in p.apply:
            continue
        module, _, function = p.apply.partition(":")
        assert not function or callable(getattr(importlib.import_module(module), function)), p.name


# --------------------------------------------------------------------------------------------
# install(): modes, switches, versions, the listing


# What a verl process installs, per environment: one probe process each, shared by the tests below (each
# process imports verl, 12-15 s on 2 cores: seven probes of four environments took 105 s of make test's
# first pass, issue 37)
PROBE = ("import verl, json\nfrom verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
         "from verl_agentic.verl_plugin import upstream\n"
         "print(json.dumps({'statuses': {p.name: upstream.status(p) for p in upstream.PATCHES},\n"
         "                  'adapter': str(_ROLLOUT_REGISTRY['vllm', 'async'])}))")
SWITCHED_OFF = {"VERL_AGENTIC_MONITORS": "0", "VERL_AGENTIC_WEIGHT_SYNC_GUARD": "0", "VERL_AGENTIC_PREFLIGHT": "0",
                "VERL_AGENTIC_TURN_LOO_ROWS": "0"}
PROBE_ENVS = {"gpu": {}, "gpu_guard_on": {"VERL_AGENTIC_WEIGHT_SYNC_GUARD": "1"}, "cpu": {"VERL_PLATFORM": "cpu"},
              "cpu_switched_off": {"VERL_PLATFORM": "cpu", **SWITCHED_OFF}}


@pytest.fixture(scope="module")
def probed() -> dict[str, dict]:
    """For each of ``PROBE_ENVS``: every patch's status and the class verl's registry holds for vLLM's
    rollout, as a fresh process that imports verl (and so the plugin) sees them."""
    def probe(env: dict[str, str]) -> dict:
        out = run_python(PROBE, **env)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    return {name: probe(env) for name, env in PROBE_ENVS.items()}


def test_install_applies_each_patch_in_its_mode_only(probed):
    gpu = probed["gpu"]["statuses"]
    assert [n for n, s in gpu.items() if s == "applied"] == ["reward_managers", "task_agent", "turn_loo", "monitors",
                                                               "preflight", "turn_loo_rows"]
    assert gpu["cpu_platform"].startswith("off: not CPU mode")
    assert gpu["turn_rewards"].startswith("not applied here; applied by the task_agent loop")
    cpu = probed["cpu"]["statuses"]
    assert [n for n, s in cpu.items() if s == "applied"] == [
        "reward_managers", "task_agent", "turn_loo", "monitors", "preflight", "turn_loo_rows", "weight_sync_guard",
        "cpu_platform",
        "cpu_fsdp_engines", "cpu_process_group", "cpu_offload_no_pin", "hf_rollout", "vllm_distribution_alias",
        "cpu_vllm_replica", "cpu_separate_async"]
    off = probed["cpu_switched_off"]["statuses"]
    assert off["monitors"] == "off: VERL_AGENTIC_MONITORS=0" and off["weight_sync_guard"].startswith("off:")
    assert off["preflight"] == "off: VERL_AGENTIC_PREFLIGHT=0"
    assert off["turn_loo_rows"] == "off: VERL_AGENTIC_TURN_LOO_ROWS=0"


def test_the_weight_sync_guard_is_off_on_gpu_unless_switched_on(probed):
    """verl's vLLM adapter stays verl's where the guard never ran (a GPU run: no VERL_PLATFORM=cpu), unless
    VERL_AGENTIC_WEIGHT_SYNC_GUARD=1; in CPU mode it is ours unless =0."""
    verls, ours = "verl.workers.rollout.vllm_rollout.ServerAdapter", "verl_agentic.verl_plugin.vllm_sync.GuardedServerAdapter"
    assert probed["gpu"]["adapter"] == verls
    assert probed["gpu_guard_on"]["adapter"] == ours
    assert probed["cpu"]["adapter"] == ours
    assert probed["cpu_switched_off"]["adapter"] == verls


def test_a_patch_written_for_other_versions_is_skipped_with_one_warning(monkeypatch, capsys):
    patch = upstream.Patch("va_test_patch", "calls a test function", upstream.ALWAYS, "none", "va_patch_sites:patch_sites",
                           versions={"verl": "==0.8.0"}, sites=("x",), tests=("x",))
    monkeypatch.setitem(upstream.BY_NAME, patch.name, patch)
    monkeypatch.delenv(upstream.ANY_VERSION_ENV, raising=False)
    assert upstream.state(patch) == (False, "off: verl 0.9.1 is installed; it was written for verl==0.8.0 "
                                            f"({upstream.ANY_VERSION_ENV}=1 applies it anyway)")
    try:
        assert upstream.apply(patch.name) is False and upstream.apply(patch.name) is False
        err = capsys.readouterr().err
        assert err.count("WARNING patch va_test_patch not applied: verl 0.9.1 is installed") == 1
        monkeypatch.setenv(upstream.ANY_VERSION_ENV, "1")
        assert upstream.apply(patch.name) is True and upstream.status(patch) == "applied"
    finally:
        upstream._APPLIED.pop(patch.name, None)
        upstream._WARNED.discard(patch.name)
    on_its_version = upstream.Patch("v", "", upstream.ALWAYS, "", None, versions={"verl": "==0.9.1", "vllm": ">=0.32"})
    assert upstream.version_mismatch(on_its_version) is None  # vLLM is not installed here: not checked


def test_the_listing_command_prints_what_this_process_installed():
    def listing(**env: str) -> str:
        out = subprocess.run([sys.executable, "-m", "verl_agentic.verl_plugin", "--patches"], capture_output=True,
                             text=True, timeout=300, cwd=REPO, env={**{k: v for k, v in os.environ.items()
                                                                      if not k.startswith("VERL_PLATFORM")},
                                                                   "PYTHONWARNINGS": "ignore", **env})
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    gpu, cpu = listing(), listing(VERL_PLATFORM="cpu")
    assert "verl 0.9.1" in gpu and "CPU mode: off" in gpu and "CPU mode: on" in cpu
    for p in upstream.PATCHES:
        assert f"- {p.name} [{p.mode}]: " in gpu
    assert "- monitors [always]: applied" in gpu and "- cpu_platform [cpu]: off: not CPU mode" in gpu
    assert "- weight_sync_guard [cpu]: off: not CPU mode (VERL_PLATFORM=cpu); VERL_AGENTIC_WEIGHT_SYNC_GUARD=1" in gpu
    assert "- cpu_platform [cpu]: applied" in cpu and "verl.workers.engine.base.EngineRegistry._engines" in cpu
    bare = subprocess.run([sys.executable, "-m", "verl_agentic.verl_plugin"], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert bare.returncode == 2 and "--patches" in bare.stdout


# --------------------------------------------------------------------------------------------
# per-turn rewards: only when a run asks


TURN_REWARDS = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from test_verl_agent_loop import verl_config
import verl
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap
from verl_agentic.verl_plugin.agent_loop import TaskAgentLoop

def wrapped():
    return getattr(AgentLoopOutput.as_dict, "_verl_agentic_turn_rewards", False)

tokenizer = AutoTokenizer.from_pretrained({str(QWEN25_DIR)!r})
seen = [wrapped()]
for extra in ([], ["+agentic.turn_rewards=true"]):
    cfg = verl_config("actor_rollout_ref.model.path=/none", "+agentic.task_type=gsm8k", *extra)
    TaskAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=None, tokenizer=tokenizer, processor=None,
                  dataset_cls=None, data_config=DictConfigWrap(cfg.data))
    seen.append(wrapped())
print(seen)
"""


def test_turn_rewards_wraps_verl_only_when_a_loop_asks_for_it():
    """Importing the plugin (every verl process) leaves verl's ``AgentLoopOutput.as_dict`` alone; a
    ``task_agent`` loop without ``agentic.turn_rewards`` too; the first loop with it wraps it."""
    out = run_python(TURN_REWARDS)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[False, False, True]"


# --------------------------------------------------------------------------------------------
# the duplicated logic of issue 36 item 11, written once


def test_tied_weights_are_found_by_one_rule(tiny_qwen_dir):
    """The sync's aliases (meta-device model), the hf rollout's tied names (a loaded model) and vLLM's
    worker's tied layers come from ``weight_sync.aliases``; none of the three modules has its own loop."""
    import types

    from transformers import AutoModelForCausalLM

    from verl_agentic.verl_plugin.cpu.hf_rollout import HFRolloutServer
    from verl_agentic.verl_plugin.weight_sync import aliases, tied_aliases

    model = AutoModelForCausalLM.from_pretrained(str(tiny_qwen_dir))
    assert tied_aliases(types.SimpleNamespace(local_path=str(tiny_qwen_dir))) == {"lm_head.weight"}
    assert HFRolloutServer._tied_names(model) == {"lm_head.weight"}
    assert aliases((m, m._parameters["weight"]) for m in model.modules()
                   if m._parameters.get("weight") is not None) == [model.lm_head]
    for module in ("verl_plugin/cpu/hf_rollout.py", "verl_plugin/cpu/vllm_worker.py"):
        text = (PKG / module).read_text()
        assert "from verl_agentic.verl_plugin.weight_sync import aliases" in text, module
        assert "seen[" not in text and "owners[" not in text, module


def test_no_fault_injection_switch_in_shipped_code():
    """Fault injection lives in tests (tests/va_vllm_faults.py); the package reads no environment variable
    that makes it fail on purpose."""
    offenders = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("VERL_AGENTIC_") \
                    and "FAULT" in node.value:
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}: {node.value}")
    assert not offenders, offenders
    assert "reload_class" in (PKG / "verl_plugin/cpu/vllm_worker.py").read_text()
    faults = (TESTS / "va_vllm_faults.py").read_text()
    assert "class FailingLoadExtension(CPUWorkerExtension)" in faults and "reload_class = FailingLoad" in faults


@pytest.mark.parametrize("module", ["verl_plugin/vllm_sync.py"])
def test_the_guarded_adapter_copies_no_verl_method_body(module):
    """GuardedServerAdapter.update_weights runs verl's own (``super().update_weights``) and builds no sender
    of its own: the copy of verl's body that was there is gone."""
    tree = ast.parse((PKG / module).read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "GuardedServerAdapter")
    method = next(n for n in cls.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "update_weights")
    source = ast.unparse(method)
    assert "super().update_weights(" in source
    for copied in ("BucketedWeightSender(", "clear_kv_cache", "set_global_steps", "_has_server", "async_send_weights"):
        assert copied not in source, copied
