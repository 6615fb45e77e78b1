"""The child side of a run: what runs in the forked child between ``fork`` and ``exec``.

``make_preexec`` returns the ``preexec_fn``: join the run's pids cgroup (first: nothing may fork
before it is in it), die with the caller (``PR_SET_PDEATHSIG``), set the rlimits, and, for
``isolation: none`` only, a private network namespace and dropping every capability with
``no_new_privs`` (under ``bwrap`` those are bwrap's job: it needs its capabilities to build the
namespaces, and drops them for the code itself). CPython documents that ``preexec_fn`` is not
safe in the presence of threads in general; the function here only makes system calls through
objects prepared beforehand (no imports, no locks, no logging), the safe subset.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Optional

_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _load_libc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


LIBC = _load_libc()


def _cap_last() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 40


def probe_netns() -> tuple[bool, str]:
    """Whether a child can get its own network namespace (tried once, in a real child)."""
    if LIBC is None:
        return False, "not Linux / no libc"

    def pre():
        if LIBC.unshare(_CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        _loopback_up()

    argv = ["/bin/true"] if os.path.exists("/bin/true") else [sys.executable, "-S", "-c", ""]
    try:
        subprocess.run(argv, preexec_fn=pre, check=True, timeout=30)
        return True, ""
    except (subprocess.SubprocessError, OSError) as e:  # "Exception occurred in preexec_fn.", or exec failed
        return False, f"{type(e).__name__}: {e}"


def _loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING))
    finally:
        s.close()


def make_preexec(cgroup_procs: Optional[str], netns: bool, rlimits: list, drop_caps: bool):
    libc = LIBC
    cap_last = _cap_last() if drop_caps else 0
    cap_header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    cap_data = (_CapData * 2)()  # all zero: no capability in any set

    def preexec() -> None:
        if cgroup_procs is not None:  # first: nothing may fork before it is in its cgroup
            fd = os.open(cgroup_procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # die with the caller
        if netns:
            if libc.unshare(_CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
            _loopback_up()
        for res, value in rlimits:
            resource.setrlimit(res, value)
        if drop_caps:
            for cap in range(cap_last + 1):
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
            libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
            if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.capset(ctypes.byref(cap_header), cap_data) != 0:
                raise OSError(ctypes.get_errno(), "capset (dropping capabilities) failed")

    return preexec


