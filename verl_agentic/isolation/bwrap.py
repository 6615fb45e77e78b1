"""The bubblewrap command line a sandboxed run starts under, and whether bubblewrap works here.

``bwrap_argv(...) + [python, ...]`` runs the interpreter in new user, PID, mount, network, IPC,
UTS and cgroup namespaces (``--unshare-user --unshare-pid ...``; no further user namespaces
inside: ``--disable-userns``), as uid/gid 65534 with every capability dropped (``--cap-drop
ALL``; bwrap also sets ``no_new_privs``), in its own session (``--new-session``: no TIOCSTI into
the caller's terminal), killed when its parent dies (``--die-with-parent``). Its root is a fresh
tmpfs holding only:

* read-only: ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin`` links or directories), a few
  files of ``/etc`` that programs need to start (``ETC_FILES``), the interpreter's prefixes and
  any other ``readonly`` path (the venv, extra site-packages the config allows);
* ``/proc`` of its own PID namespace (only its own processes), a minimal ``/dev``;
* private tmpfs ``/tmp`` and ``/dev/shm`` of ``tmp_bytes`` each;
* read-write: its work dir, at the same path as on the host.

Everything else of the host (``/root``, ``/home``, ``/work``, ``/var``, ``/sys``, the host's
``/tmp`` and ``/dev/shm``, the run's outputs, checkpoints and datasets) does not exist inside.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from verl_agentic.interfaces import ConfigError

SANDBOX_UID = 65534  # "nobody" inside the user namespace
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "localtime",
             "hosts", "alternatives")
NETWORK_ETC_FILES = ("resolv.conf", "ssl", "ca-certificates", "gai.conf", "services", "protocols")
INSTALL_HINT = ("install bubblewrap: `apt-get install -y bubblewrap` as root (or `bash scripts/setup_bwrap.sh`, "
                "which `make setup` runs); to run model-written code WITHOUT isolation, set `isolation: none` "
                "explicitly (unsafe: it can then read, change and delete the run's files and kill its processes)")


class IsolationUnavailable(ConfigError):
    """``isolation: bwrap`` (the default) was asked for and bubblewrap does not work on this machine."""


def find_bwrap() -> Optional[str]:
    return shutil.which("bwrap")


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_argv(bwrap: str, workdir: str, readonly: Iterable[str] = (), *, network: bool = False,
               tmp_bytes: Optional[int] = None) -> list[str]:
    """The ``bwrap`` options (ending in ``--``) for a run in ``workdir``; see the module docstring."""
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup",
            "--disable-userns", "--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--hostname", "sandbox"]
    if not network:
        argv.append("--unshare-net")
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for name in ETC_FILES + (NETWORK_ETC_FILES if network else ()):
        if os.path.lexists(f"/etc/{name}"):
            argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for d in ("/tmp", "/dev/shm"):
        if tmp_bytes is not None:
            argv += ["--size", str(int(tmp_bytes))]
        argv += ["--tmpfs", d]
    seen: set[str] = set()
    for p in readonly:
        for q in dict.fromkeys((os.path.abspath(p), os.path.realpath(p))):
            if q in seen or q == "/" or _under(q, SYSTEM_DIRS) or not os.path.exists(q):
                continue
            seen.add(q)
            argv += ["--ro-bind", q, q]
    wd = os.path.abspath(workdir)
    argv += ["--bind", wd, wd, "--chdir", wd, "--"]
    return argv


def interpreter_paths(python: str) -> list[str]:
    """What ``python`` needs to start, read-only: its prefix, and a venv's base interpreter prefix."""
    out = []
    for exe in dict.fromkeys((os.path.abspath(python), os.path.realpath(python))):
        prefix = Path(exe).parent.parent
        out.append(str(prefix))
        cfg = prefix / "pyvenv.cfg"
        if cfg.is_file():  # a venv: "home = <base prefix>/bin"
            for line in cfg.read_text(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    out.append(str(Path(value.strip()).parent))
    return list(dict.fromkeys(out))


@functools.lru_cache(maxsize=8)
def probe(bwrap: Optional[str]) -> tuple[bool, str]:
    """Whether ``bwrap`` starts a sandbox here (tried once per path, in a real child): (ok, reason)."""
    if bwrap is None:
        return False, "bwrap not found on PATH"
    wd = tempfile.mkdtemp(prefix="va_bwrap_probe_")
    try:
        r = subprocess.run(bwrap_argv(bwrap, wd) + ["/bin/sh", "-c", "exit 0"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode == 0:
            return True, ""
        return False, f"bwrap failed (exit {r.returncode}): {r.stderr.strip()[-500:]}"
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(wd, ignore_errors=True)


def require_bwrap() -> str:
    """The path of a working ``bwrap``, or ``IsolationUnavailable`` saying how to install it."""
    path = find_bwrap()
    ok, why = probe(path)
    if not ok:
        raise IsolationUnavailable(f"process isolation (isolation: bwrap) is not available here: {why}. "
                                   f"To fix it, {INSTALL_HINT}")
    return path
