#!/usr/bin/env bash
# Install headless Chromium and its WebDriver (Debian packages `chromium`, `chromium-driver`) for the
# browser tests of the report (tests/test_inspect_browser.py runs this when the binaries are missing).
# Needs root (or sudo) and apt-get. Prints the paths of both binaries on success.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

if ! have; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "setup_chromium: apt-get not found; install chromium and chromedriver yourself" >&2
        exit 1
    fi
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            SUDO="sudo -n"
        else
            echo "setup_chromium: need root (or passwordless sudo) to apt-get install chromium chromium-driver" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    install() { $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver; }
    # The package lists may be stale or missing: update once and retry.
    if ! install; then
        $SUDO apt-get update -q && install || {
            echo "setup_chromium: 'apt-get install chromium chromium-driver' failed (see above)" >&2
            exit 1
        }
    fi
fi
have || { echo "setup_chromium: chromium/chromedriver still not on PATH after install" >&2; exit 1; }
echo "chromium: $(command -v chromium) ($(chromium --version 2>/dev/null || echo '?'))"
echo "chromedriver: $(command -v chromedriver)"
