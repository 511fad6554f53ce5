#!/usr/bin/env python
"""The lesson's exercise 'build' over several seeds: see cartpole/lesson.py. Example:

    python scripts/lesson_build.py --seeds 5 --out runs/lesson
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cartpole.lesson_cli import script_main  # noqa: E402

if __name__ == "__main__":
    script_main("build")
