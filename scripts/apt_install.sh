# Sourced by the setup_*.sh scripts: `apt_install WHO PACKAGE...` installs Debian packages with apt-get as
# root (or through passwordless sudo), updating the package lists once if the first try fails. Exits 1 with
# a message naming WHO and the packages when that is not possible.
apt_install() {
    local who="$1"
    shift
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "$who: apt-get not found; install $* yourself" >&2
        exit 1
    fi
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo="sudo -n"
        else
            echo "$who: need root (or passwordless sudo) to apt-get install $*" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be stale or missing: update once and retry.
    if ! $sudo apt-get install -y -q --no-install-recommends "$@"; then
        $sudo apt-get update -q && $sudo apt-get install -y -q --no-install-recommends "$@" || {
            echo "$who: 'apt-get install $*' failed (see above)" >&2
            exit 1
        }
    fi
}
