"""A real headless Chromium (Debian's ``chromium``) opening a local page: its DOM after
scripts ran, and a screenshot. Each call has its own profile directory and its own session,
which is killed (by its process group) if the browser outlives the timeout."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# --no-sandbox: the sandbox cannot start as root (the tests' user); --disable-gpu: no GPU
# in the test machines; --hide-scrollbars keeps scrollbars out of the screenshot.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio")


def _chromium(page: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="phalanx-chromium-") as profile:
        proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            # The browser's helpers (zygote, renderer) share its process group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def dump_dom(page: Path, timeout: float = 60) -> str:
    """The page's DOM, serialized after its scripts ran."""
    done = _chromium(page, "--dump-dom", timeout=timeout)
    if done.returncode != 0 or "<html" not in done.stdout:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def screenshot(
    page: Path, png: Path, size: tuple[int, int] = (1200, 600), timeout: float = 60
) -> Path:
    """A PNG of the page in a window of ``size`` (width, height) CSS pixels."""
    done = _chromium(
        page, f"--screenshot={png}", f"--window-size={size[0]},{size[1]}",
        "--force-device-scale-factor=1", timeout=timeout,
    )  # fmt: skip
    if not png.is_file():
        raise RuntimeError(
            f"chromium --screenshot failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return png
