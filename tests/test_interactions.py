"""Interactions: the verl-compatible lifecycle, the YAML registry, and the built-ins."""

import asyncio

import pytest

from verl_agentic.interactions import BaseInteraction, load_interactions, register_interaction
from verl_agentic.tasks.gsm8k.interactions import DEFAULT_VERIFY, CodeVerifyInteraction, Gsm8kInteraction
from verl_agentic.interfaces import ConfigError


def conv(answer: str) -> list[dict]:
    return [{"role": "user", "content": "What is 6*7?"}, {"role": "assistant", "content": answer}]


async def test_gsm8k_interaction_terminates_on_right_and_asks_again_on_wrong():
    it = Gsm8kInteraction({})
    iid = await it.start_interaction(ground_truth="42")
    assert await it.generate_response(iid, conv("#### 41")) == (
        False, "Your response is incorrect! You need to reflect on your answer and try again.", 0.0, {})
    term, msg, score, _ = await it.generate_response(iid, conv("so #### 42"))
    assert term and score == 1.0 and "correct" in msg
    assert await it.calculate_score(iid) == 1.0
    await it.finalize_interaction(iid)
    assert iid not in it._instance_dict


async def test_code_verify_asks_for_python_then_closes():
    it = CodeVerifyInteraction({"max_rounds": 2, "terminate_message": "Done."})
    iid = await it.start_interaction(ground_truth="42")
    term, msg, score, _ = await it.generate_response(iid, conv("#### 42"))
    assert (term, msg, score) == (False, DEFAULT_VERIFY, 1.0)
    assert msg == "Are you sure? Can you write Python code to verify?"
    term, msg, score, _ = await it.generate_response(iid, conv("#### 41"))
    assert (term, msg, score) == (True, "Done.", 0.0)  # the flip is visible in the score


async def test_instance_ids_are_unique_under_concurrency():
    it = Gsm8kInteraction({})
    ids = await asyncio.gather(*(it.start_interaction(ground_truth="1") for _ in range(200)))
    assert len(set(ids)) == 200
    with pytest.raises(ValueError, match="already exists"):
        await it.start_interaction(ids[0])


def test_registry_names_defaults_duplicates_and_unknown():
    got = load_interactions({"interaction": [
        {"class_name": "gsm8k"},  # name generated: "gsm8k"
        {"class_name": "verl_agentic.tasks.gsm8k.interactions.CodeVerifyInteraction"},  # -> "code_verify"
        {"name": "verify3", "class_name": "code_verify", "config": {"max_rounds": 3}},
    ]})
    assert got.names() == ["code_verify", "gsm8k", "verify3"]
    assert got.by_name["verify3"].config["max_rounds"] == 3 and got.by_name["verify3"].name == "verify3"
    assert got.select({})[0] == "gsm8k"  # the compatible default
    assert got.select({"name": "verify3"})[0] == "verify3"
    with pytest.raises(ConfigError, match="unknown interaction 'nope'; configured: code_verify, gsm8k, verify3"):
        got.select({"name": "nope"})
    with pytest.raises(ConfigError, match="configured twice"):
        load_interactions([{"class_name": "gsm8k"}, {"name": "gsm8k", "class_name": "code_verify"}])
    with pytest.raises(ConfigError, match="unknown interaction class 'nope'"):
        load_interactions([{"class_name": "nope"}])
    with pytest.raises(ConfigError, match="needs 'class_name'"):
        load_interactions([{"name": "x"}])


def test_yaml_file_and_custom_class(tmp_path):
    @register_interaction("test_echo")
    class Echo(BaseInteraction):
        async def generate_response(self, instance_id, messages, **kwargs):
            return False, "echo: " + self.last_assistant_content(messages), 0.5, {}

    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - class_name: test_echo\n    config: {x: 1}\n")
    got = load_interactions(str(path))
    assert got.names() == ["test_echo"] and got.select({})[0] == "test_echo"  # the only one: the default
    it = got.by_name["test_echo"]
    iid = asyncio.run(it.start_interaction())
    assert asyncio.run(it.generate_response(iid, conv("hi")))[1] == "echo: hi"
    with pytest.raises(ConfigError, match="does not exist"):
        load_interactions(str(tmp_path / "missing.yaml"))


def test_unknown_config_keys_of_an_interaction_are_errors():
    """Built-in interactions declare the keys they read: a misspelt key is a ConfigError naming it (it
    used to be ignored); a class that declares none (e.g. ported from verl) still takes any key."""
    with pytest.raises(ConfigError, match=r"interaction 'verify' \(CodeVerifyInteraction\) config keys \['max_round'\]"):
        load_interactions([{"name": "verify", "class_name": "code_verify", "config": {"max_round": 3}}])
    with pytest.raises(ConfigError, match=r"\['retry_msg'\]; known: \['name', 'method', 'retry_message'\]"):
        load_interactions([{"class_name": "gsm8k", "config": {"retry_msg": "again"}}])
    ok = load_interactions([{"name": "verify", "class_name": "code_verify", "config": {"max_rounds": 3}}])
    assert ok.select({"name": "verify"})[1].config["max_rounds"] == 3

    class Ported(BaseInteraction):
        pass

    assert Ported({"anything": 1, "name": "p"}).config["anything"] == 1
