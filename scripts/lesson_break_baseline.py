#!/usr/bin/env python
"""The lesson's 'break-baseline' exercise over several seeds: `cartpole lesson break-baseline` (flags: --help)."""

import sys

from cartpole.cli import console_main

if __name__ == "__main__":
    console_main(["lesson", "break-baseline", *sys.argv[1:]])
