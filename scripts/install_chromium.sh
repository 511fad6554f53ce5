#!/bin/sh
# The browser of the page tests and the simulated labeler: Debian's chromium package, driven by Playwright
# (nothing downloads a browser at run time). Installs it when it is missing; RLHF_TOY_CHROMIUM names another.
# Another apt-get or dpkg running holds the package lock: this waits for it (RLHF_TOY_APT_WAIT seconds, default
# 600) instead of failing at once.
set -e
if [ -n "$RLHF_TOY_CHROMIUM" ] || command -v chromium >/dev/null 2>&1; then exit 0; fi
WAIT="${RLHF_TOY_APT_WAIT:-600}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
        echo "installing Debian's chromium needs root: running apt-get through sudo" >&2
    else
        echo "error: installing Debian's chromium needs root (apt-get) and there is no sudo; run this script as" \
             "root, or install a Chromium yourself and set RLHF_TOY_CHROMIUM to it" >&2
        exit 2
    fi
fi
APT="$SUDO apt-get -o DPkg::Lock::Timeout=$WAIT -y -q"
echo "installing Debian's chromium (apt-get; if another package manager is running, waiting up to $WAIT s for" \
     "its lock)" >&2
$APT install chromium >/dev/null || { $APT update >/dev/null && $APT install chromium >/dev/null; } || {
    echo "error: apt-get could not install chromium (above: its reason; a lock still held after $WAIT s means" \
         "another package manager is still running: wait for it, or raise RLHF_TOY_APT_WAIT)" >&2
    exit 2
}
command -v chromium || echo /usr/bin/chromium
