"""The test run's clean-up of shared memory (tests/conftest.py): a segment a dead process left is removed
after the module, one a live process holds is not."""

import subprocess
import sys
from multiprocessing import shared_memory

from va_testing import SHM, remove_orphan_shm, shm_segments

LEAVE_ONE = """
from multiprocessing import resource_tracker, shared_memory
shm = shared_memory.SharedMemory(create=True, size=1 << 20)
resource_tracker.unregister(shm._name, "shared_memory")  # as vLLM's engine does: nobody unlinks it
print(shm.name)
"""


def test_orphans_go_and_held_segments_stay():
    before = shm_segments()
    orphan = subprocess.run([sys.executable, "-c", LEAVE_ONE], capture_output=True, text=True, check=True).stdout.strip()
    held = shared_memory.SharedMemory(create=True, size=1 << 20)  # this process maps it
    try:
        assert (SHM / orphan).exists() and {orphan, held.name} <= shm_segments()
        assert remove_orphan_shm(before) == [orphan]
        assert not (SHM / orphan).exists() and (SHM / held.name).exists()
    finally:
        held.close()
        held.unlink()
