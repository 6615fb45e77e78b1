"""Issue 41: verl's trainer on a Ray cluster of two nodes, with a user's task module shipped to both.

The cluster: a head and a second node on this machine, each with its own raylet, object store and one
logical GPU (``ray.cluster_utils.Cluster``: what ``ray start --head`` and ``ray start --address`` make on
two machines). The run: ``DEVICE=cpu NNODES=2 RAY_ADDRESS=<head> scripts/run_gsm8k_multiturn.sh``, so verl
places one training worker (FSDP2 over gloo, world size 2) and one ``hf`` rollout replica on each node,
and two agent-loop workers, one a node. The user's task module (``where_tasks``, written by the test into
a project folder) reaches the workers through Ray's runtime_env (``working_dir``), not through the
driver's working directory (the driver runs from another folder) or ``PYTHONPATH`` (the tests folder is
taken off it, and the nodes are started without it). Each episode's ``start`` records the Ray node it ran
on and the file its module was loaded from.

Then the same run without the ``working_dir``: the workers cannot import the module, and the error names
the module, the node and the runtime_env fix. About 3 minutes on 2 cores (marked ``slow``).

Before anything starts, verl's trainer process warns when it joins a cluster with a task module found only
through this machine's paths (``verl_plugin/cluster_imports.py``; the fast tests at the end).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pandas as pd
import pytest

from va_testing import REPO
from va_user_tasks import user_env

from verl_agentic.inspect.runs import read_verl_metrics

SCRIPT = REPO / "scripts" / "run_gsm8k_multiturn.sh"

WHERE_TASKS = '''
import json
import os

import ray

from verl_agentic.interfaces import EpisodeResult, EpisodeState, Observation
from verl_agentic.tasks import register_task

LOG = {log!r}


@register_task("where_task")
class WhereTask:
    """One assistant turn; records where it ran."""

    def start(self, row, ctx):
        record = {{"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(), "file": __file__}}
        with open(LOG, "a") as f:
            f.write(json.dumps(record) + "\\n")
        return EpisodeState(row=row, messages=list(row["prompt"]), ctx=ctx)

    def obs(self, state, gen_out):
        return Observation(done=True)

    def end(self, state):
        return EpisodeResult(reward=min(1.0, len(state.last_assistant_text) / 100))
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes on this machine, started without the tests folder on their ``PYTHONPATH``."""
    from ray.cluster_utils import Cluster

    with mock.patch.dict(os.environ, user_env(), clear=True):
        node = {"num_cpus": 8, "num_gpus": 1, "object_store_memory": 1 << 30}
        nodes = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        try:
            nodes.add_node(**node)
            nodes.wait_for_nodes()
        except BaseException:
            nodes.shutdown()
            raise
    try:
        yield nodes
    finally:
        nodes.shutdown()


def _node_ids(address: str) -> set[str]:
    """The cluster's live nodes, asked from a separate driver (this process stays out of Ray)."""
    code = ("import json, ray; ray.init(address=%r, logging_level='ERROR'); "
            "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive']]))" % address)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _project(root: Path) -> tuple[Path, Path, Path]:
    """The user's project folder (the task module), the data folder and the episodes' node log."""
    project, data, log = root / "my_project", root / "data", root / "where.jsonl"
    project.mkdir(parents=True)
    (project / "where_tasks.py").write_text(WHERE_TASKS.format(log=str(log)))
    rows = [{"data_source": "where", "ability": "demo", "task_type": "where_task", "agent_name": "task_agent",
             "prompt": [{"role": "user", "content": f"Count to {i + 3}."}],
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": i}}
            for i in range(8)]
    data.mkdir()
    pd.DataFrame(rows).to_parquet(data / "train.parquet")
    pd.DataFrame(rows[:4]).to_parquet(data / "test.parquet")
    return project, data, log


def _launch(address: str, model: str, root: Path, data: Path, out: Path,
            *overrides: str) -> subprocess.CompletedProcess:
    """One GRPO step of 4 prompts x 2 on the cluster, the driver started from ``root`` (not the project).
    The model: a tiny random one with SmolLM2's tokenizer (what is tested is where things run; with the
    real SmolLM2 each node's training worker and rollout server took the machine to 19 GB of 24)."""
    env = user_env(DEVICE="cpu", NNODES="2", RAY_ADDRESS=address, OUT=str(out), DATA_DIR=str(data),
                   MODEL_PATH=str(model), PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        ["bash", str(SCRIPT), "+agentic.imports=[where_tasks]", *overrides, "agentic.max_new_tokens=16",
         "data.train_batch_size=4", "data.val_max_samples=4", "data.shuffle=false",
         "actor_rollout_ref.rollout.agent.num_workers=2",  # verl spreads agent-loop workers over the nodes
         "actor_rollout_ref.actor.use_kl_loss=false",  # no reference model
         # an entropy bonus moves the weights even when a group's rewards tie: the push after the update
         # must show a change on both nodes
         "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.entropy_coeff=0.01",
         "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
         "trainer.save_freq=-1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    out.mkdir(parents=True, exist_ok=True)
    (out / "launch.log").write_text(proc.stdout + proc.stderr)
    return proc


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # verl's trainer on two Ray nodes: not in make test-fast
@pytest.mark.timeout(1800)
def test_a_step_on_two_nodes_with_the_task_module_shipped_by_runtime_env(cluster, tiny_smol_dir, tmp_path):
    nodes = _node_ids(cluster.address)
    assert len(nodes) == 2
    project, data, log = _project(tmp_path)
    out = tmp_path / "run"
    proc = _launch(cluster.address, tiny_smol_dir, tmp_path, data, out,
                   f"+ray_kwargs.ray_init.runtime_env.working_dir={project}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]

    # the step finished and trained
    metrics = read_verl_metrics(out / "metrics.jsonl")
    assert metrics[1]["training/global_step"] == 1 and "actor/pg_loss" in metrics[1], sorted(metrics)

    # training and rollout on both nodes: each replica's server took every push from a training worker on
    # its own node, the two replicas on the two nodes, and the update of step 1 reached both
    pushes = _lines(out / "weight_pushes.jsonl")
    by_replica = {r: [p for p in pushes if p["replica"] == r] for r in (0, 1)}
    assert all(by_replica.values()) and len(by_replica) == len({p["replica"] for p in pushes})
    for replica, rows in by_replica.items():
        assert {p["node"] for p in rows} == {p["sender_node"] for p in rows}, rows
        assert len({p["node"] for p in rows}) == 1
        after = [p for p in rows if p["global_steps"] == 1]
        assert after and after[0]["missing"] == 0 and after[0]["max_abs_change"] > 0, rows
    assert {by_replica[0][0]["node"], by_replica[1][0]["node"]} == nodes

    # the episodes ran the user's task on both nodes, from the module Ray shipped (not the project folder)
    where = _lines(log)
    assert len(where) == 8 and {w["node"] for w in where} == nodes, where
    for w in where:
        assert "working_dir_files" in w["file"] and not w["file"].startswith(str(project)), w["file"]
    episodes = _lines(out / "rollouts" / "step_000000.jsonl")
    assert len(episodes) == 8 and {e["task_type"] for e in episodes} == {"where_task"}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_task_module_missing_on_the_nodes_is_one_error_naming_it_and_the_fix(cluster, tiny_smol_dir, tmp_path):
    _, data, _ = _project(tmp_path)
    proc = _launch(cluster.address, tiny_smol_dir, tmp_path, data, tmp_path / "run")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    message = "agentic.imports: cannot import 'where_tasks' (on Ray node "
    assert message in output, output[-6000:]
    assert "+ray_kwargs.ray_init.runtime_env.working_dir=<the folder>" in output


# --------------------------------------------------------------------------------------------
# the warning at the start (verl_plugin/cluster_imports.py)


def test_joining_a_cluster_with_a_module_found_only_here_warns_with_the_override_that_ships_it(tmp_path, monkeypatch):
    from verl_agentic.verl_plugin.cluster_imports import unshipped_imports

    project, _, _ = _project(tmp_path)
    monkeypatch.syspath_prepend(str(project))  # as the driver's working directory would put it
    argv = ["+agentic.imports=[where_tasks, json]", "trainer.nnodes=2"]
    [line] = unshipped_imports(argv, {"RAY_ADDRESS": "10.0.0.1:6379"})  # json: the standard library
    assert "'where_tasks' is found here at " + str(project / "where_tasks.py") in line
    assert line.endswith(f"+ray_kwargs.ray_init.runtime_env.working_dir={project}")
    # shipped, or not joining a cluster (verl starts Ray here: its workers find what the driver finds)
    assert unshipped_imports([*argv, f"+ray_kwargs.ray_init.runtime_env.working_dir={project}"],
                             {"RAY_ADDRESS": "10.0.0.1:6379"}) == []
    assert unshipped_imports(argv, {}) == []
    # an installed package (this one, editable) and a name that is not found at all: no warning here
    assert unshipped_imports(["+agentic.imports=[verl_agentic.tasks, no_such_module_x]"],
                             {"RAY_ADDRESS": "auto"}) == []


def test_the_warning_is_printed_only_in_verls_trainer_process(tmp_path, monkeypatch, capsys):
    from verl_agentic.verl_plugin.cluster_imports import warn_unshipped_imports

    project, _, _ = _project(tmp_path)
    monkeypatch.syspath_prepend(str(project))
    env = {"RAY_ADDRESS": "auto"}
    warn_unshipped_imports(["/opt/venv/lib/python3.11/site-packages/verl/trainer/main_ppo.py",
                            "+agentic.imports=[where_tasks]"], env)
    assert capsys.readouterr().err.startswith("[verl-agentic] WARNING agentic.imports: 'where_tasks' is found")
    warn_unshipped_imports(["/usr/lib/python3/site-packages/ray/_private/workers/default_worker.py",
                            "+agentic.imports=[where_tasks]"], env)  # a Ray worker: nothing
    assert capsys.readouterr().err == ""
