"""Process isolation for model-written code: one engine for the ``python`` tool, the swedev
repository service (``verl_agentic.sandbox``) and the code scorers.

::

    from verl_agentic.isolation import SandboxLimits, run_python, run_python_sync

    res = await run_python("print(sum(range(10)))")              # -> SandboxResult
    res.stdout, res.exit_code, res.error_type                      # '45\\n', 0, None
    res = run_python_sync("while True: pass", limits=SandboxLimits(wall_timeout_s=2))
    res.timed_out, res.error_type                                  # True, 'timeout'

Modules, lowest first: ``limits`` (``SandboxLimits``, ``SandboxResult``), ``bwrap`` (the
bubblewrap command line, ``IsolationUnavailable``), ``cgroups`` (per-run pids cgroups),
``child`` (between fork and exec), ``engine`` (``run_python``). Nothing here imports from other
layers of verl_agentic but ``interfaces``.

``isolation: bwrap`` (the default). What the code CANNOT do (each tried for real by
``tests/test_isolation.py``, as root on Linux):

* see, signal, kill or ptrace any process outside its sandbox, its caller included: its own PID
  namespace (``/proc`` lists only its processes; the caller has no pid in it);
* read, create, change or delete any file outside its work dir: a fresh mount namespace whose
  root holds only read-only ``/usr`` (+ ``/bin``, ``/lib*``, ``/sbin``), a few ``/etc`` files,
  the interpreter's prefix and venv, and ``readonly_paths``; the host's ``/root``, ``/home``,
  ``/work``, outputs, checkpoints and datasets do not exist there; ``/tmp`` and ``/dev/shm``
  are private tmpfs (``tmp_mb`` each), not the host's;
* read the caller's environment (API keys): it gets a fixed minimal environment;
* reach the network, the host's loopback or abstract Unix sockets: its own network namespace
  (``network: false``, the default); filesystem Unix sockets of the host are not mounted;
* gain privileges: uid/gid 65534 in a user namespace, no capabilities, ``no_new_privs``, no
  further user namespaces (``--disable-userns``), its rlimits' hard values set;
* keep processes alive after its call: the run's process group, its pids cgroup and its PID
  namespace are killed when the call returns, times out, floods its output or is cancelled,
  and when the caller dies (``--die-with-parent``, ``PR_SET_PDEATHSIG``);
* exhaust the machine: wall time (``wall_timeout_s``), CPU (``RLIMIT_CPU``), address space per
  process (``RLIMIT_AS`` = ``memory_mb``), tasks (``max_processes``: a pids cgroup as root,
  ``RLIMIT_NPROC`` otherwise), bytes per written file (``RLIMIT_FSIZE``), output
  (``max_output_bytes`` per stream), private ``/tmp`` + ``/dev/shm`` (``tmp_mb`` each).

What it CAN do: read the interpreter, its standard library and the venv's packages (and
``readonly_paths``), import them, write inside its work dir (the ``python`` tool's episode dir,
a swedev repository checkout), use its private ``/tmp``, run the programs of ``/usr/bin``.

What is NOT contained (known limits):

* The sandbox's uid 65534 maps to the caller's uid (root here) outside its user namespace:
  files it writes in its work dir belong to the caller, and a kernel bug that let it escape
  its namespaces would leave it with that uid (without capabilities).
* The work dir's size: only each file is capped (``file_size_mb``), not their number; memory
  is capped per process (``RLIMIT_AS``), not per sandbox (no memory cgroup); no I/O or CPU
  share limit. The kernel is shared (as with any container).
* The result's ``exit_code``: a program that calls ``sys.exit(128 + N)`` reads as killed by
  signal N (bwrap reports signals that way).

``isolation: none`` (explicit only; a warning is logged at every start of a tool or service that
uses it, and at the first such run of a process, e.g. a scorer's): the old, weaker sandbox: rlimits, pids
cgroup, network namespace and dropped capabilities as root, but the code runs as the caller on
the caller's filesystem and sees its processes. Where bwrap is missing, ``isolation: bwrap``
refuses to run (``IsolationUnavailable``, which says how to install it:
``apt-get install -y bubblewrap`` or ``scripts/setup_bwrap.sh``).
"""

from verl_agentic.isolation.bwrap import IsolationUnavailable
from verl_agentic.isolation.engine import (
    NO_ISOLATION_WARNING,
    check_isolation,
    run_python,
    run_python_sync,
    sandbox_support,
    write_files,
)
from verl_agentic.isolation.limits import ISOLATION_MODES, SandboxLimits, SandboxResult

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_python_sync", "sandbox_support",
           "check_isolation", "write_files", "IsolationUnavailable", "ISOLATION_MODES", "NO_ISOLATION_WARNING"]
