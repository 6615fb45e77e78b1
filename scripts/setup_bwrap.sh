#!/usr/bin/env bash
# Install bubblewrap (Debian package `bubblewrap`), the process isolation of the sandbox that runs
# model-written code (verl_agentic.isolation; `isolation: bwrap`, the default, refuses to run without it).
# `make setup` runs this (best effort: without root it only says what to do). Needs root (or sudo) and
# apt-get. Prints the path and version of bwrap on success, and checks that it can build a sandbox here.
set -euo pipefail

have() { command -v bwrap >/dev/null 2>&1; }

source "$(dirname "$0")/apt_install.sh"
have || apt_install setup_bwrap bubblewrap
have || { echo "setup_bwrap: bwrap still not on PATH after install" >&2; exit 1; }
# the namespaces the sandbox uses (a container may forbid them: then bwrap is installed but cannot work)
if ! bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts --unshare-cgroup \
        --die-with-parent --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
        --symlink usr/bin /bin --proc /proc --dev /dev /bin/true; then
    echo "setup_bwrap: bwrap is installed but cannot create namespaces here (see above)" >&2
    exit 1
fi
echo "bwrap: $(command -v bwrap) ($(bwrap --version 2>/dev/null || echo '?'))"
