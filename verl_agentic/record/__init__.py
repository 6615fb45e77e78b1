"""Record and replay of episodes: every answer an episode receives from outside, on a tape.

``tape.py`` (the doors and the per-episode tape), ``backend.py`` (the generation backend's door),
``store.py`` (the files beside a run's trajectories), ``probe.py`` (the tokenizer's fingerprint in the
header). The replay itself is ``verl_agentic.replay``.
"""

from verl_agentic.record.backend import (
    NoChatModel,
    NoModel,
    TapedBackend,
    TapedChatBackend,
    has_native_chat,
    prompt_request,
    taped,
)
from verl_agentic.record.store import (
    RecordingError,
    RecordingWriter,
    RecordingWriters,
    find_episode,
    has_recording,
    read_episodes,
    read_header,
    recording_header,
)
from verl_agentic.record.tape import DOORS, LIVE_DOORS, ReplayDivergence, Tape, current, digest, door, note, using

__all__ = ["DOORS", "LIVE_DOORS", "NoChatModel", "NoModel", "TapedChatBackend", "has_native_chat", "taped", "RecordingError", "RecordingWriter", "RecordingWriters", "ReplayDivergence", "Tape",
           "TapedBackend", "current", "digest", "door", "find_episode", "has_recording", "note", "prompt_request",
           "read_episodes", "read_header", "recording_header", "using"]
