"""The simulated user (verl_agentic/interactions/simulated_user.py) with the embedded SmolLM2 playing it,
and its example (examples/simulated_user) with SmolLM2 as the policy too. The assertions are on the
mechanics (who says what, the stop rule, masks, token exactness), not on the 135M model's skill.
The ``openai`` backend against a real vLLM server: tests/test_vllm.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from va_testing import REPO
from verl_agentic.interfaces import ConfigError, EpisodeFailure, SamplingParams
from verl_agentic.interactions import load_interactions
from verl_agentic.interactions.simulated_user import SimulatedUserInteraction, swap_roles

EXAMPLE = REPO / "examples" / "simulated_user"
CONFIG = {"backend": "hf", "model": "embedded", "persona": "You are a person who asked a math question.",
          "instructions": "Your question left out this fact: {hidden_fact} If asked, tell it in one sentence.",
          "stop_phrase": "[DONE]", "max_rounds": 1, "scorer": "gsm8k", "max_new_tokens": 24, "temperature": 0.0}
QUESTION = [{"role": "system", "content": "You solve math word problems."},
            {"role": "user", "content": "I bought some packs of pencils. Each pack has 6 pencils. How many pencils?"}]


def _expected_reply(interaction: SimulatedUserInteraction, system: str, messages: list[dict]) -> str:
    """The user model's greedy reply, computed here from the chat template and the model directly."""
    backend = asyncio.run(interaction.user_model())
    swapped = [{"role": "system", "content": system}, *swap_roles(messages)]
    ids = backend.tokenizer.apply_chat_template(swapped, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    out = asyncio.run(backend.generate(list(ids), SamplingParams(max_new_tokens=interaction.max_new_tokens,
                                                                 temperature=0.0)))
    body = out.token_ids[:-1] if out.finish_reason == "stop" else out.token_ids
    return backend.tokenizer.decode(body, skip_special_tokens=False).strip()


def test_swap_roles_shows_the_user_model_the_conversation_from_its_side():
    msgs = [*QUESTION, {"role": "assistant", "content": "How many packs?"}, {"role": "tool", "content": "x"},
            {"role": "user", "content": "Four."}, {"role": "assistant", "content": None}]
    assert swap_roles(msgs) == [{"role": "assistant", "content": QUESTION[1]["content"]},
                                {"role": "user", "content": "How many packs?"}, {"role": "assistant", "content": "Four."},
                                {"role": "user", "content": ""}]


def test_the_user_model_replies_and_the_stop_rule_ends_the_conversation(smol_dir):
    it = load_interactions([{"class_name": "verl_agentic.interactions.simulated_user.SimulatedUserInteraction",
                             "config": CONFIG}]).by_name["simulated_user"]

    async def go():
        iid = await it.start_interaction(None, hidden_fact="I bought 4 packs.", ground_truth="24")
        state = it._instance_dict[iid]
        assert state["system"] == CONFIG["persona"] + "\n\n" + CONFIG["instructions"].format(hidden_fact="I bought 4 packs.")
        asked = [*QUESTION, {"role": "assistant", "content": "How many packs did you buy?"}]
        first = await it.generate_response(iid, asked)
        # a wrong (here: no) answer, the first round: the user model is asked, and its reply is sent
        second = await it.generate_response(iid, [*asked, {"role": "user", "content": first[1]},
                                                  {"role": "assistant", "content": "You have 6 pencils."}])
        # a right answer ends the conversation without asking the model
        before = (await it.user_model()).stats()["requests"]
        right = await it.generate_response(iid, [*asked, {"role": "assistant", "content": "24"}])
        after = (await it.user_model()).stats()["requests"]
        await it.finalize_interaction(iid)
        return state["system"], asked, first, second, right, before, after

    system, asked, first, second, right, before, after = asyncio.run(go())
    terminate, text, score, meta = first
    assert score == 0.0
    if terminate:  # the model wrote the stop phrase (its instructions allow it): the reply is not sent
        assert meta["stopped"] == "stop_phrase" and "[DONE]" in meta["reply"] and text == ""
    else:
        assert text and text == _expected_reply(it, system, asked)  # the reply is the user model's, as generated
        assert second[0] and second[3] == {"stopped": "max_rounds"} and second[2] == 0.0  # max_rounds=1
    assert right[:3] == (True, "", 1.0) and right[3] == {"stopped": "correct"} and after == before


def test_bad_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="backend must be one of"):
        SimulatedUserInteraction({**CONFIG, "backend": "vllm"})
    with pytest.raises(ConfigError, match="persona_text"):
        SimulatedUserInteraction({**CONFIG, "persona_text": "x"})
    with pytest.raises(ConfigError, match="nope"):
        SimulatedUserInteraction({**CONFIG, "scorer": "nope"})
    with pytest.raises(ConfigError, match="rollout.openai"):
        SimulatedUserInteraction({**CONFIG, "backend": "openai", "openai": {"base_url": "http://x", "nope": 1}})
    it = SimulatedUserInteraction(CONFIG)
    with pytest.raises(EpisodeFailure, match=r"\{hidden_fact\}.*\['ground_truth'\]"):
        asyncio.run(it.start_interaction(None, ground_truth="24"))


def test_the_user_model_loads_off_the_event_loop_and_closes_with_the_interaction(tiny_smol_dir):
    """The weights load in a worker thread (the event loop keeps running: a ticker ticks meanwhile); each
    interaction owns its model (no process-wide cache: two interactions, two models); ``close`` stops it (a
    request to it fails), ``Interactions.close`` closes every interaction, and a reply after a close loads
    the model again."""
    config = {**CONFIG, "model": str(tiny_smol_dir), "max_new_tokens": 4}
    interactions = load_interactions([{"name": "a", "class_name": "simulated_user", "config": config},
                                      {"name": "b", "class_name": "simulated_user", "config": config}])
    a, b = interactions.by_name["a"], interactions.by_name["b"]

    async def go():
        ticks = 0
        loading = asyncio.ensure_future(a.user_model())
        while not loading.done():
            await asyncio.sleep(0.01)
            ticks += 1
        first = await loading
        second = await b.user_model()
        reply = await a.reply("You are a user.", QUESTION[1:])
        await interactions.close()
        with pytest.raises(RuntimeError, match="closed"):
            await first.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        again = await a.user_model()
        await a.close()
        return ticks, first, second, reply, again

    ticks, first, second, reply, again = asyncio.run(go())
    assert ticks >= 3, ticks  # the loop ran while the weights loaded
    assert first is not second and again is not first
    assert isinstance(reply, str)
    assert first._closed and second._closed and again._closed


def test_the_example_with_smollm2_as_policy_and_user(smol_dir, tmp_path):
    """examples/simulated_user/run.sh on 4 problems: the user turns in the trajectories are the
    simulated user's replies (recomputed here from the model), injected with mask 0, never more
    than max_rounds of them; the drift check passes; the reward is the scorer's verdict."""
    r = subprocess.run(["bash", str(EXAMPLE / "run.sh"), "data.max_samples=4", f"output.dir={tmp_path}",
                        "output.quiet=true"], capture_output=True, text=True, timeout=900, cwd=REPO,
                       env={**__import__("os").environ, "PYTHON": sys.executable})
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["drift"]["episodes"] == 4 and summary["drift"]["episodes_ok"] == 4
    trajs = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    config = load_interactions(str(EXAMPLE / "simulated_user.yaml")).by_name["simulated_user"]
    rows = [json.loads(x) for x in (EXAMPLE / "problems.jsonl").read_text().splitlines()]
    replies = 0
    for t, row in zip(trajs, rows):
        roles = [u["role"] for u in t["turns"]]
        assert roles[0] == "assistant" and roles.count("user") <= config.max_rounds
        assert t["finish_reason"] in ("stop", "max_turns")
        for u in t["turns"]:  # the simulated user's turns: injected, never trained on
            assert set(t["response_mask"][u["start"]:u["end"]]) == ({1} if u["role"] == "assistant" else {0})
        k = 0
        for i, m in enumerate(t["messages"][2:], 2):
            if m["role"] == "user":  # recompute the reply from what the user model saw
                fact = row["extra_info"]["interaction_kwargs"]["hidden_fact"]
                system = config.persona + "\n\n" + config.instructions.format(hidden_fact=fact)
                assert m["content"] == _expected_reply(config, system, t["messages"][:i])
                k += 1
        replies += k
        last = [m for m in t["messages"] if m["role"] == "assistant"][-1]["content"]
        from verl_agentic.tasks.gsm8k.answer import extract_answer

        assert t["reward"] == float(extract_answer(last) == row["answer"])
        assert t["score"] == t["reward"]  # the naive reward manager, gsm8k's rule: the same verdict
    assert replies >= 2  # the conversations went on: the user model spoke


def test_main_ppo_trains_a_policy_against_the_simulated_user(smol_dir, tmp_path):
    """One GRPO step of a tiny policy against the example's simulated user (SmolLM2): the user's turns
    are the user model's replies and carry mask 0 in what the trainer trains on."""
    from verl_agentic.main_rollout import load_config
    from verl_agentic.models.tiny import make_tiny_model
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([f"model.path={make_tiny_model(str(smol_dir))}", "task_type=tool_agent",
                       f"data.path={EXAMPLE / 'problems.jsonl'}", "data.max_samples=2",
                       f"task.tool_agent.interaction={EXAMPLE / 'simulated_user.yaml'}", "rollout.n=2",
                       "trainer.batch_size=2", "trainer.total_steps=1", "rollout.max_turns=3", "rollout.max_new_tokens=12",
                       "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=4", "actor.entropy_coeff=0.01",
                       f"output.dir={tmp_path}", "output.quiet=true", "trainer.save_hf_model=false"], config_name="ppo")
    (m,) = PPOTrainer(cfg).fit()
    assert m["actor/updated_rows"] > 0  # a real update on these episodes
    config = load_interactions(str(EXAMPLE / "simulated_user.yaml")).by_name["simulated_user"]
    rows = [json.loads(x) for x in (EXAMPLE / "problems.jsonl").read_text().splitlines()]
    episodes = [json.loads(x) for x in (tmp_path / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    users = 0
    for e in episodes:
        fact = rows[e["index"]]["extra_info"]["interaction_kwargs"]["hidden_fact"]
        system = config.persona + "\n\n" + config.instructions.format(hidden_fact=fact)
        for u in e["turns"]:
            assert set(e["response_mask"][u["start"]:u["end"]]) == ({1} if u["role"] == "assistant" else {0})
        for i, msg in enumerate(e["messages"][2:], 2):
            if msg["role"] == "user":
                assert msg["content"] == _expected_reply(config, system, e["messages"][:i])
                users += 1
    assert users >= 2
