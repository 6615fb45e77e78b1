"""verl plugin entry point (group ``verl.plugins``; ``import verl`` imports this module).

Importing it registers verl_agentic's reward managers in verl's reward loop registry
(``verl.experimental.reward_loop.reward_manager``), so a verl trainer selects them with
``reward.reward_manager.name=agentic_naive|prime|swedev`` (see ``verl_plugin/reward.py`` for
the settings under ``+reward.agentic.*``), and the ``task_agent`` agent loop in verl's agent-loop
registry, which runs any verl_agentic task inside verl's rollout
(``actor_rollout_ref.rollout.agent.default_agent_loop=task_agent``, settings under
``+agentic.*``; see ``verl_plugin/agent_loop.py``), and the ``turn_loo`` advantage estimator in
verl's ``core_algos`` registry (``algorithm.adv_estimator=turn_loo``; ``verl_plugin/turn_advantage.py``).

verl imports every ``verl.plugins`` entry point inside ``import verl`` (in the driver and in
every Ray worker) and swallows their errors at debug level; set
``VERL_USE_EXTERNAL_PLUGINS=none`` to switch plugins off, or ``=verl_agentic`` to load only
this one. If the names are missing, ``python -c "import verl_agentic.verl_plugin"`` shows the
real import error.

It also puts verl's vLLM rollout adapter with a weight sync that fails instead of hanging, and that
loads tied weights whatever the bucket size, in verl's rollout registry (``verl_plugin/vllm_sync.py``;
``VERL_AGENTIC_WEIGHT_SYNC_GUARD=0`` keeps verl's own), on GPU and CPU alike.

It feeds each training step of verl's (v1) trainer to the reward-hacking and collapse monitors
(``verl_plugin/monitors.py``, settings ``+agentic.monitors.*``; ``VERL_AGENTIC_MONITORS=0`` leaves
verl's trainer unwrapped).

With ``VERL_PLATFORM=cpu`` it also switches verl's trainer to the CPU (``verl_plugin/cpu``:
the platform, FSDP engines for "cpu", two patches and the ``hf`` rollout); otherwise that code
is not even imported.

In verl's trainer process it first checks the command line for verl <= 0.7 keys that verl 0.9.1 no
longer has (``verl_plugin/removed_keys.py``) and stops with their replacements.

Keep this module small: it runs in every process that imports verl.
"""

import os

from verl_agentic.verl_plugin import removed_keys as _removed_keys

_removed_keys.check_command_line()  # verl 0.7's keys that 0.9.1 lacks: their replacement, not hydra's "not in struct"

from verl_agentic.verl_plugin import reward  # noqa: F401  (registers the reward managers)
from verl_agentic.verl_plugin import agent_loop  # noqa: F401  (registers the task_agent agent loop)
from verl_agentic.verl_plugin import turn_advantage  # noqa: F401  (registers the turn_loo advantage estimator)
from verl_agentic.verl_plugin import cpu as _cpu
from verl_agentic.verl_plugin import turn_rewards as _turn_rewards

_turn_rewards.install()  # per-turn rewards into verl's token-level scores, for outputs that carry them

if os.environ.get("VERL_AGENTIC_WEIGHT_SYNC_GUARD", "1") != "0":
    from verl.workers.rollout import base as _rollout_base

    # verl's rollout registry is a private dict (verl/workers/rollout/base.py:89; upstream.VERL)
    _rollout_base._ROLLOUT_REGISTRY[("vllm", "async")] = "verl_agentic.verl_plugin.vllm_sync.GuardedServerAdapter"
if os.environ.get("VERL_AGENTIC_MONITORS", "1") != "0":
    from verl_agentic.verl_plugin import monitors as _monitors

    _monitors.install_on_import()  # wraps verl's PPOTrainer._compute_metrics when the trainer imports it
if _cpu.cpu_mode_requested():
    _cpu.activate()
