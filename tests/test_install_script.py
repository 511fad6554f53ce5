"""The setup's browser step survives a busy machine: `scripts/install_chromium.sh` waits for another package
manager's lock instead of failing (apt-get's exit 100), and says what it waits for."""

import fcntl
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = Path("/var/lib/dpkg/lock-frontend")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("apt-get") is None or not Path("/usr/bin/chromium").exists(),
        reason="needs root, apt-get and Debian's chromium (as .ci/run has)",
    ),
]


def path_without_chromium(tmp_path: Path) -> str:
    """A PATH with every command of /usr/bin and /bin but chromium, so the script takes its install path (apt-get
    then finds the package installed: nothing is downloaded)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in (Path("/usr/sbin"), Path("/usr/bin"), Path("/sbin"), Path("/bin")):
        for tool in folder.iterdir():
            if tool.name != "chromium" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    return str(bin_dir)


def test_the_install_waits_for_a_held_package_lock(tmp_path):
    held = 6.0
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running apt-get or dpkg holds
    release = threading.Timer(held, lambda: (fcntl.lockf(fd, fcntl.LOCK_UN), os.close(fd)))
    release.start()
    try:
        env = {**os.environ, "PATH": path_without_chromium(tmp_path), "RLHF_TOY_APT_WAIT": "120"}
        env.pop("RLHF_TOY_CHROMIUM", None)
        t0 = time.monotonic()
        p = subprocess.run(["sh", ROOT / "scripts" / "install_chromium.sh"], capture_output=True, text=True, env=env,
                           timeout=300)  # fmt: skip
        waited = time.monotonic() - t0
    finally:
        release.join()
    assert p.returncode == 0, p.stderr
    assert waited > held - 1, waited  # it waited for the lock instead of failing at once
    assert "waiting up to 120 s for its lock" in p.stderr and "chromium" in p.stdout


def test_a_present_chromium_installs_nothing():
    p = subprocess.run(["sh", ROOT / "scripts" / "install_chromium.sh"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == ""
