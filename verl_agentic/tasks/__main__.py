"""``python -m verl_agentic.tasks``: list the registered tasks, where they come from, and their data helpers."""

from verl_agentic.tasks.data import PREPROCESS_DATASET, PROMPT_GENERATOR
from verl_agentic.tasks import TASKS


def main() -> None:
    names = TASKS.names()
    print(f"{len(names)} registered task(s):")
    for name in names:
        spec = TASKS.get(name)
        extras = [label for label, reg in (("prompt", PROMPT_GENERATOR), ("preprocess", PREPROCESS_DATASET))
                  if name in reg]
        print(f"  {name:<16} loop={spec.loop.__name__:<16} data=[{', '.join(extras) or '-'}]  {TASKS.source(name)}")


if __name__ == "__main__":
    main()
