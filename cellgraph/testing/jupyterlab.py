"""A real JupyterLab server and Debian's Chromium, for the browser tests and the GraphView benchmark.

``jupyter_lab(root)`` starts JupyterLab on 127.0.0.1 (a port the OS picks, a
token, settings and runtime files under ``root``, notebooks in
``root/notebooks``) and stops it at the end. ``chromium(playwright)`` launches
the system Chromium (Playwright's own browser download does not work on
these machines) with the flags that keep it off the network. The page
helpers run cells as a person does (a click, then Shift+Enter) and wait for
the kernel with deadlines.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
START_TIMEOUT_S = 90.0  # JupyterLab's first start builds its page settings: slow on a loaded machine
STEP_TIMEOUT_MS = 60_000  # the deadline of each wait on the page


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab: its base URL, token and notebook folder."""

    url: str
    token: str
    notebooks: Path

    def page_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}?token={self.token}&reset"


def chromium_path() -> str | None:
    """The system Chromium, or None where it is not installed."""
    return shutil.which("chromium")


def chromium(playwright: Any) -> Any:
    """Launch the system Chromium through Playwright's ``sync_api`` object."""
    path = chromium_path()
    if path is None:
        raise RuntimeError("Debian's chromium is not installed (apt-get install chromium)")
    return playwright.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)


def write_settings(root: Path, plugin: str, values: dict[str, Any]) -> None:
    """Set a JupyterLab plugin's user settings (``"@jupyterlab/apputils-extension:notification"``) before
    ``jupyter_lab(root)`` starts: they go where it points JUPYTERLAB_SETTINGS_DIR."""
    package, name = plugin.split(":")
    path = root / "settings" / package / f"{name}.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(values))


@contextmanager
def jupyter_lab(root: Path, env: Mapping[str, str] | None = None) -> Iterator[Lab]:
    """A JupyterLab server on 127.0.0.1, its files under ``root``; stopped (and killed if need be) at the end.

    ``env`` adds to (or overrides) this process's environment, for the server and the kernels it starts.
    """
    token = secrets.token_hex(16)
    environ = {**os.environ, **(env or {})}
    # Settings, workspaces and runtime files in the temporary root: nothing of the user's is read or written.
    for var, sub in [
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
        ("JUPYTER_CONFIG_DIR", "config"),
    ]:
        environ[var] = str(root / sub)
    notebooks = root / "notebooks"
    notebooks.mkdir(exist_ok=True)
    log = open(root / "lab.log", "w")  # closed in the finally below, after the server
    proc = subprocess.Popen(  # noqa: S603 - this interpreter running JupyterLab, with our own arguments
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            "--port=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={notebooks}",
            "--allow-root",  # CI containers run as root
            "--ServerApp.terminals_enabled=False",
            "--LabApp.extension_manager=readonly",  # no PyPI queries from an offline machine
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=environ,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield Lab(_wait_started(proc, root, token), token, notebooks)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _wait_started(proc: subprocess.Popen[bytes], root: Path, token: str) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {proc.returncode}; see {root / 'lab.log'}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"JupyterLab did not start within {START_TIMEOUT_S:g} s; see {root / 'lab.log'}")
        for info in (root / "runtime").glob("jpserver-*.json"):
            port = json.loads(info.read_text()).get("port")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                    return f"http://127.0.0.1:{port}"
            except OSError:
                pass
        time.sleep(0.2)


def server_pid(lab: Lab) -> int:
    """The JupyterLab server's process id, from its runtime file: its children are the kernels it started."""
    [info] = (lab.notebooks.parent / "runtime").glob("jpserver-*.json")
    return int(json.loads(info.read_text())["pid"])


def kernels(lab: Lab) -> list[dict[str, Any]]:
    """The server's kernels (``/api/kernels``); empty while the server answers 500 (a kernel still starting)."""
    try:
        # Our own server's http://127.0.0.1 URL.
        with urllib.request.urlopen(f"{lab.url}/api/kernels?token={lab.token}", timeout=5) as reply:  # noqa: S310
            return list(json.loads(reply.read()))
    except OSError:
        return []


def shutdown_kernels(lab: Lab, timeout_s: float = 60.0) -> None:
    """Shut every kernel of the server down (``DELETE /api/kernels/<id>``, which answers once it is gone)."""
    for kernel in kernels(lab):
        # Our own server's http://127.0.0.1 URL.
        url = f"{lab.url}/api/kernels/{kernel['id']}?token={lab.token}"
        with urllib.request.urlopen(urllib.request.Request(url, method="DELETE"), timeout=timeout_s):  # noqa: S310
            pass


def wait_kernel(lab: Lab, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """Until the page's kernel is connected and idle: the notebook's own indicator says 'idle' before that."""
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        if any(k.get("connections", 0) >= 1 and k.get("execution_state") == "idle" for k in kernels(lab)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the notebook's kernel was not connected and idle within {timeout_ms / 1000:.0f} s")


def wait_idle(lab: Lab, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
    """Until every kernel of the server is idle (the cells sent to it have run), with a deadline."""
    deadline = time.monotonic() + timeout_ms / 1000
    time.sleep(0.5)  # the cell's execute request reaches the kernel first
    while time.monotonic() < deadline:
        found = kernels(lab)
        if found and all(k.get("execution_state") == "idle" for k in found):
            return
        time.sleep(0.25)
    raise TimeoutError(f"the kernel was still busy after {timeout_ms / 1000:.0f} s")


def until(check: Any, what: str, timeout_s: float = STEP_TIMEOUT_MS / 1000) -> Any:
    """Until ``check()`` returns something true (a hang guard, not a timing); fail with its last value.

    What a page shows settles over several frames on a loaded machine (a view
    drawn again as its layout arrives): a reading is taken again until it holds.

    Examples
    --------
    >>> seen = iter([[], [""], ["rgb(0, 114, 178)"]])
    >>> until(lambda: [f for f in next(seen) if f], "a band's fill")
    ['rgb(0, 114, 178)']
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last saw {value!r}")
        time.sleep(0.2)


def run_cell(page: Any, index: int) -> None:
    """Select cell ``index`` and run it with Shift+Enter, as a person would."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def wait_ran(page: Any, index: int, timeout_ms: int = STEP_TIMEOUT_MS) -> int:
    """Until cell ``index``, sent to the kernel for the first time, has run (its prompt goes from ``[ ]:`` through
    ``[*]:`` to ``[n]:``); return its execution count ``n``."""
    prompt = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputPrompt")
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        text = prompt.inner_text(timeout=timeout_ms).strip()
        ran = re.fullmatch(r"\[(\d+)\]:", text)
        if ran:
            return int(ran.group(1))
        if time.monotonic() > deadline:
            raise TimeoutError(f"cell {index} had not run after {timeout_ms / 1000:.0f} s: its prompt shows {text!r}")
        time.sleep(0.1)


def restart_kernel(page: Any, lab: Lab) -> None:
    """Kernel > Restart Kernel…, confirmed in its dialog, as a person does; until the new kernel is idle."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
    page.locator(".lm-Menu-itemLabel", has_text="Restart Kernel…").first.click()
    page.locator(".jp-Dialog-button", has_text="Restart").click()
    # The old kernel reads idle until the restart begins: wait to see it begin (a short wait, then go on).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(k.get("execution_state") in ("restarting", "starting") for k in kernels(lab)):
            break
        time.sleep(0.1)
    wait_kernel(lab)


def open_notebook(page: Any, lab: Lab, notebook: str) -> None:
    """Open ``notebook`` in JupyterLab and wait until its kernel is connected and idle."""
    page.goto(lab.page_url(notebook), timeout=STEP_TIMEOUT_MS)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=STEP_TIMEOUT_MS)
    wait_kernel(lab)
