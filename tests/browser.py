"""Headless Chromium for the tests that check a page in a real browser (Debian's package,
/usr/bin/chromium; .ci/run installs it where it is missing).

Each run gets a fresh, empty profile and a session of its own; afterwards that process
group alone is killed (Chromium may leave children behind), never any other process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
SKIP_REASON = (f"{CHROMIUM} is absent: install Debian's chromium package (.ci/run does) to "
               "check pages in a browser")


def chromium(*args: str, timeout_s: float = 300) -> str:
    """Run headless Chromium with ``args`` (e.g. ``--dump-dom URL``); its stdout. Raises
    AssertionError, with the end of its stderr, when it fails."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        proc = subprocess.Popen([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)      # its own group: ours alone
            proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err[-2000:]}"
    return out


def dump_dom(page: Path) -> str:
    """The page's DOM once Chromium has loaded it (after any script ran)."""
    dom = chromium("--dump-dom", Path(page).resolve().as_uri())
    assert "</html>" in dom, dom[-2000:]
    return dom


def screenshot(page: Path, png: Path, *, width: int = 1200, height: int = 1600) -> Path:
    """A PNG of the page's first ``width`` x ``height`` pixels."""
    chromium(f"--screenshot={Path(png).resolve()}", f"--window-size={width},{height}",
             "--hide-scrollbars", Path(page).resolve().as_uri())
    return Path(png)
