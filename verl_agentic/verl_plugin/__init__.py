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

Every change it makes to verl and vLLM is one entry of one registry (``verl_plugin/upstream.py``:
target, versions, mode, switch, guarding test), applied here in the registry's order by
``upstream.install()``; ``python -m verl_agentic.verl_plugin --patches`` prints them with their state in
that process. Besides the registrations above:

- the reward-hacking and collapse monitors wrap verl's (v1) trainer's step metrics
  (``verl_plugin/monitors.py``, settings ``+agentic.monitors.*``; ``VERL_AGENTIC_MONITORS=0`` leaves
  verl's trainer unwrapped);
- the preflight wraps verl's (v1) trainer's ``PPOTrainer.init``: the ``agentic`` settings, the tasks'
  sections and their tools are checked in the trainer's process before any worker starts
  (``verl_plugin/preflight.py``; ``VERL_AGENTIC_PREFLIGHT=0`` leaves it unwrapped);
- per-turn rewards (``verl_plugin/turn_rewards.py``) wrap verl's agent-loop output only when a run asks
  for them (``+agentic.turn_rewards=true``);
- with ``VERL_PLATFORM=cpu`` it switches verl's trainer to the CPU (``verl_plugin/cpu``: the platform, FSDP
  engines for "cpu", two patches, the ``hf`` rollout, verl's vLLM rollout on vLLM's CPU build), and puts
  verl's vLLM adapter with a weight sync that fails instead of hanging in verl's rollout registry
  (``verl_plugin/vllm_sync.py``). None of these is applied on a GPU run: none has run on a GPU. The
  weight-sync guard may be switched on there (``VERL_AGENTIC_WEIGHT_SYNC_GUARD=1``; ``=0`` switches it off
  everywhere).

In verl's trainer process it first checks the command line for verl <= 0.7 keys that verl 0.9.1 no
longer has (``verl_plugin/removed_keys.py``) and stops with their replacements, and warns when a run joins a
Ray cluster with task modules that only this machine has (``verl_plugin/cluster_imports.py``).

Keep this module small: it runs in every process that imports verl.
"""

from verl_agentic.verl_plugin import removed_keys as _removed_keys

_removed_keys.check_command_line()  # verl 0.7's keys that 0.9.1 lacks: their replacement, not hydra's "not in struct"

from verl_agentic.verl_plugin import cluster_imports as _cluster_imports  # noqa: E402

_cluster_imports.warn_unshipped_imports()  # RAY_ADDRESS with +agentic.imports found here only: ship them

from verl_agentic.verl_plugin import upstream as _upstream  # noqa: E402

_upstream.install()
