"""Repository sandboxes for SWE-style tasks (the ``swedev`` task).

- ``runtime``: what a sandbox does to its work directory (confined paths, file sets, changes,
  shell commands under the Python sandbox's isolation, hidden tests). No HTTP.
- ``server``: the service, ``python -m verl_agentic.sandbox.server`` (aiohttp): sandboxes by
  instance id, commands, files, hidden tests, idle reaping, a cap with 429, and the reward protocol.
- ``client``: ``SandboxClient``, its async client with typed ``SandboxError``s and retries.
- ``tools``: the model's tools (view / write / edit file, run command, run tests) on one sandbox.

The submodules are imported where used: the scorer needs only ``runtime`` (no aiohttp).
"""
