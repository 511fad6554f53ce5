#!/usr/bin/env python
"""The lesson's 'build' exercise over several seeds: `cartpole lesson build` (flags: --help)."""

import sys

from cartpole.cli import console_main

if __name__ == "__main__":
    console_main(["lesson", "build", *sys.argv[1:]])
