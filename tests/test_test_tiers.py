"""The vLLM tier: ``make test`` leaves out every test that needs ``.venv-vllm`` (marked ``vllm`` by
tests/conftest.py from the fixtures it uses); ``make test-vllm`` runs them, ``make test-all`` runs both. And
the serial pass: a launch of verl's trainer runs alone, the cheap tests of its module in the first pass."""

from __future__ import annotations

import subprocess
import sys

import pytest

import va_vllm
from va_testing import REPO


def _collected(*args: str) -> set[str]:
    """The names of the tests ``pytest --collect-only`` selects with ``args`` (marks, modules)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {line.split("::")[1] for line in proc.stdout.splitlines() if "::" in line}


def test_the_tests_that_use_a_vllm_fixture_are_the_vllm_tier_and_the_rest_of_their_modules_stay():
    tier = _collected("-m", "vllm", "tests/test_vllm.py", "tests/test_verl_vllm.py")
    # every test of test_vllm.py starts a vLLM server; verl's vLLM run and the in-engine reload need .venv-vllm
    assert {"test_same_multiturn_rollout_through_hf_and_vllm", "test_server_killed_mid_rollout",
            "test_verl_trains_with_its_vllm_rollout_on_cpu", "test_vllm_run_dump_is_token_exact_with_aligned_masks",
            "test_every_vllm_side_private_name_the_plugin_touches_still_exists"} <= tier
    # these run in this package's own environment: make test keeps them
    assert not tier & {"test_no_vllm_in_the_environment_is_a_clear_error_with_the_setup_command",
                       "test_launch_script_vllm_overrides_fit_verls_config_and_leave_the_gpu_run_alone",
                       "test_settings_vllms_cpu_engine_refuses_are_one_error_naming_each"}
    assert len(tier) == 17, sorted(tier)


def test_the_tests_that_use_a_launch_fixture_are_serial_and_the_rest_of_their_modules_run_in_the_first_pass():
    modules = ("tests/test_verl_cpu.py", "tests/test_verl_two_nodes.py")
    # test_verl_user_tasks.py: a module of one launch, serial as a whole
    serial = _collected("-m", "serial", *modules, "tests/test_verl_user_tasks.py")
    parallel = _collected("-m", "not serial", *modules)
    # the three launches of verl's trainer (verl_run) and the Ray nodes (cluster): alone
    assert {"test_verl_trains_on_cpu_steps_validation_and_checkpoints", "test_colocate_async_resumes_from_its_checkpoint",
            "test_a_step_on_two_nodes_with_the_task_module_shipped_by_runtime_env",
            "test_a_task_module_missing_on_the_nodes_is_one_error_naming_it_and_the_fix",
            "test_a_users_task_folder_through_main_rollout_and_verls_trainer"} <= serial
    assert len(serial) == 12, sorted(serial)
    # probes in a process of their own, an in-process server, the launch script's --print-overrides
    assert {"test_cpu_mode_is_opt_in", "test_hf_server_aborts_parks_and_resumes_like_verls_vllm_server",
            "test_launch_script_cpu_overrides_fit_verls_config",
            "test_the_warning_is_printed_only_in_verls_trainer_process"} <= parallel
    assert not serial & parallel


def test_a_test_outside_the_tier_that_asks_for_the_vllm_environment_fails_by_name(monkeypatch):
    monkeypatch.setenv("VA_TEST_IN_VLLM_TIER", "0")
    monkeypatch.setattr(va_vllm, "SETUP_SCRIPT", REPO / "no-such-script.sh")  # were it run, the error would differ
    with pytest.raises(va_vllm.NotInTheVLLMTier, match="is not marked vllm.*VLLM_FIXTURES"):
        va_vllm.vllm_python()


def test_this_test_is_outside_the_tier():
    """conftest sets the flag before each test's fixtures: this one is not marked vllm."""
    import os

    assert os.environ["VA_TEST_IN_VLLM_TIER"] == "0"
