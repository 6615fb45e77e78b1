"""TextArena's Guess the Number as an agent task: the game talks, the policy guesses, through the gateway.

    python -m verl_agentic.main_rollout imports=[guess_the_number] task_type=guess_the_number \
        data.path=examples/agents/games.jsonl rollout.max_turns=10      # with PYTHONPATH=examples/agents

Each row of games.jsonl is one game: its `seed` picks the number (its question and answer only label it).
"""

import textarena as ta

from verl_agentic.tasks import register_task
from verl_agentic.tasks.agent import agent_task


async def guess_the_number(row, client):
    env = ta.make("GuessTheNumber-v0-raw")  # a number in 1..20, 10 guesses, hints "higher" / "lower"
    env.reset(num_players=1, seed=int((row.get("extra_info") or row).get("seed", 0)))  # a dataset row's extra
    messages, done = [], False
    while not done:
        _, observation = env.get_observation()
        said = "\n".join(text for who, text, _ in observation if who != 0)  # not our own move, echoed
        messages.append({"role": "user", "content": said})
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=32)
        move = reply.choices[0].message.content
        messages.append({"role": "assistant", "content": move})
        done, _ = env.step(action=move)
    rewards, info = env.close()
    return {"reward": float((rewards or {}).get(0, 0.0)),  # TextArena's own: 1 for a win, less for a miss
            "metrics": {"guesses": info[0]["turn_count"], "invalid_move": float(info[0]["invalid_move"])}}


register_task("guess_the_number", agent_task(guess_the_number))
