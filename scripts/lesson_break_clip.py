#!/usr/bin/env python
"""The lesson's 'break-clip' exercise over several seeds: `cartpole lesson break-clip` (flags: --help)."""

import sys

from cartpole.cli import console_main

if __name__ == "__main__":
    console_main(["lesson", "break-clip", *sys.argv[1:]])
