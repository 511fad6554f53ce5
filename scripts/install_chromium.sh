#!/bin/sh
# The browser of the page tests and the simulated labeler: Debian's chromium package, driven by Playwright
# (nothing downloads a browser at run time). Installs it when it is missing; RLHF_TOY_CHROMIUM names another.
set -e
if [ -n "$RLHF_TOY_CHROMIUM" ] || command -v chromium >/dev/null 2>&1; then exit 0; fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get install -y -q chromium >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; }
command -v chromium
