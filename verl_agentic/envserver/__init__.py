"""Environments over HTTP: the environment service and its client.

``python -m verl_agentic.envserver`` serves any registered task's environment side (its start /
obs / end) over ``POST /start``, ``/step``, ``/end`` (see ``server.py`` for the protocol);
``EnvClient`` (``client.py``) talks to it with timeouts and safe retries. The ``gen_chat`` task
(``verl_agentic.tasks.gen_chat``) runs a chat-speaking policy against such a service.
"""

from verl_agentic.envserver.client import EnvClient, EnvServiceError
from verl_agentic.envserver.server import EnvService, ServiceError, make_app, serve

__all__ = ["EnvClient", "EnvServiceError", "EnvService", "ServiceError", "make_app", "serve"]
