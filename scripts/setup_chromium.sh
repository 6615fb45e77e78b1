#!/usr/bin/env bash
# Install headless Chromium and its WebDriver (Debian packages `chromium`, `chromium-driver`) for the
# browser tests of the report (tests/test_inspect_browser.py runs this when the binaries are missing).
# Needs root (or sudo) and apt-get. Prints the paths of both binaries on success.
set -euo pipefail

have() { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }

source "$(dirname "$0")/apt_install.sh"
have || apt_install setup_chromium chromium chromium-driver
have || { echo "setup_chromium: chromium/chromedriver still not on PATH after install" >&2; exit 1; }
echo "chromium: $(command -v chromium) ($(chromium --version 2>/dev/null || echo '?'))"
echo "chromedriver: $(command -v chromedriver)"
