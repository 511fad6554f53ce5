"""Headless Chromium through Playwright (the 'browser' extra), and a simulated labeler that drives the labeling
page with the keyboard as a person would, letting a judge choose.

The browser is the system's (Debian's `chromium` package, or `$RLHF_TOY_CHROMIUM`): nothing is downloaded. It
starts with the background-networking features off, since this machine's network is closed.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlhf_toy.errors import UserError

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
Judge = Callable[[list[str], list[str]], list[float]]  # (prompts, responses) -> scores


def chromium_path() -> str:
    """The system's Chromium: `$RLHF_TOY_CHROMIUM`, else the first of chromium, chromium-browser, google-chrome."""
    given = os.environ.get("RLHF_TOY_CHROMIUM")
    found = given or next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if not found:
        raise UserError("no Chromium found: install Debian's 'chromium' package, or set RLHF_TOY_CHROMIUM to a browser")
    return found


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Playwright `Browser` on the system's Chromium, closed afterwards."""
    # playwright is the optional 'browser' extra: imported only here
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise UserError("a headless browser needs the 'browser' extra: pip install -e '.[browser]'") from None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def shown_pair(page) -> dict[str, str]:
    """The pair on screen: its id, prompt and the two replies, as the page shows them."""
    return page.evaluate(
        """() => ({
            pair_id: document.getElementById("pair").dataset.pairId,
            prompt: document.getElementById("prompt").textContent,
            left: document.getElementById("left").textContent,
            right: document.getElementById("right").textContent,
        })"""
    )


def press_and_wait(page, key: str, before: str, timeout_ms: float = 30_000) -> None:
    """Press `key` and wait until the page shows another pair than `before` (a pair id)."""
    page.keyboard.press(key)
    page.wait_for_function(
        "(before) => document.getElementById('pair').dataset.pairId !== before", arg=before, timeout=timeout_ms
    )


def wait_for_pair(page, timeout_ms: float = 60_000) -> dict[str, str]:
    page.wait_for_function("() => document.getElementById('pair').dataset.pairId !== ''", timeout=timeout_ms)
    return shown_pair(page)


@dataclass
class Labeling:
    """What a simulated labeler did: the keys pressed and the page's own key-to-next-pair timings (ms)."""

    keys: list[str] = field(default_factory=list)
    timings_ms: list[float] = field(default_factory=list)

    def latency(self) -> dict[str, float]:
        t = sorted(self.timings_ms)
        return {
            "median_ms": statistics.median(t),
            "p95_ms": t[min(len(t) - 1, int(0.95 * len(t)))],
            "max_ms": t[-1],
            "n": len(t),
        }


def choice_key(judge: Judge, pair: dict[str, str]) -> str:
    """1 when the judge scores the left reply higher, 2 the right, 3 (tie) when equal."""
    left, right = judge([pair["prompt"]] * 2, [pair["left"], pair["right"]])
    return "1" if left > right else "2" if right > left else "3"


def simulate_labeler(page, url: str, judge: Judge, n: int) -> Labeling:
    """Open the labeling page at `url` and label `n` pairs with the keyboard, each as `judge` prefers."""
    page.goto(url)
    done = Labeling()
    for _ in range(n):
        pair = wait_for_pair(page)
        key = choice_key(judge, pair)
        press_and_wait(page, key, pair["pair_id"])
        done.keys.append(key)
    done.timings_ms = page.evaluate("() => window.labelTimings")
    return done


@dataclass
class LabelProcess:
    """`rlhf-toy label` running as its own process, and the page's address it printed."""

    proc: subprocess.Popen
    url: str

    def stop(self, timeout: float = 30) -> str:
        """Ctrl-C, as a person stops it; returns what it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=timeout)
        return err

    def kill(self) -> None:
        """SIGKILL: a crash at any moment."""
        self.proc.kill()
        self.proc.communicate()


def start_label(run_dir: str | os.PathLike[str], *flags: str) -> LabelProcess:
    """Start `python -m rlhf_toy.lm label --run_dir RUN_DIR --port 0 FLAGS` on one thread and wait for its address."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["label", "--run_dir", str(run_dir), "--port", "0", "--threads", "1", "--progress", "False", *flags]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlhf_toy.lm", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("labeling page: "):
        _, err = proc.communicate()
        raise RuntimeError(f"label did not start: {(line + err).strip()[-500:]}")
    return LabelProcess(proc, line.split(": ", 1)[1].strip())
