"""A real JupyterLab for the browser tests, isolated from the machine's own Jupyter setup.

``lab`` starts ``jupyter lab`` from this interpreter on 127.0.0.1 with a random port, a token,
a non-default ``base_url`` (/lab-base/, as behind JupyterHub) and throwaway config, data,
settings, workspace and IPython dirs, so neither a user's config nor an earlier run leaks in.
It writes one kernelspec that runs this interpreter (the kernel must import this checkout's
neuron_lab) and pre-seeds the panel's refresh-rate setting, so the test also sees the setting
reach the kernel. ``page`` is a Playwright page in Debian's headless Chromium.

The panel under test is this checkout's build (``neuron_lab/labextension``, made by
``pip install -e .`` or ``npm run build:prod`` in extension/) when there is one: it is linked into
the throwaway data dir, and JupyterLab is told to search it before the environment's
labextensions (``JUPYTER_PREFER_ENV_PATH=0``; in a virtualenv the environment comes first).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BASE_URL = "/lab-base/"
KERNEL = "neuron-lab-e2e"
PANEL_RATE_HZ = 10
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


@dataclass
class Lab:
    url: str          # http://127.0.0.1:PORT/lab-base/
    token: str
    root: Path        # the server's root_dir
    log: Path
    kernel: str = KERNEL
    rate_hz: float = PANEL_RATE_HZ
    artifacts: Path = ARTIFACTS

    def lab_url(self, path: str) -> str:
        return f"{self.url}lab/tree/{path}?token={self.token}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labextension_installed() -> bool:
    """The built panel is where JupyterLab looks (test_extension_unit.py asks `jupyter
    labextension list` itself; this is the quick form of that check)."""
    from jupyter_core.paths import jupyter_path
    return any((Path(d) / "neuron-lab-panel" / "package.json").exists()
               for d in jupyter_path("labextensions"))


def _shutdown_kernels(url: str, token: str) -> None:
    try:
        with urllib.request.urlopen(f"{url}api/kernels?token={token}", timeout=5) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(f"{url}api/kernels/{k['id']}?token={token}", method="DELETE")
            urllib.request.urlopen(req, timeout=20).close()
    except OSError:
        pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not _labextension_installed():
        pytest.fail("neuron-lab-panel is not installed: run `bash scripts/setup.sh` "
                    "(pip install -e . builds and installs it)")
    tmp = tmp_path_factory.mktemp("lab")
    root, data, cfg = tmp / "root", tmp / "data", tmp / "config"
    for d in (root, data / "kernels" / KERNEL, cfg, tmp / "ipython", tmp / "runtime"):
        d.mkdir(parents=True)
    built = ROOT / "neuron_lab" / "labextension"
    if (built / "package.json").exists():
        (data / "labextensions").mkdir()
        (data / "labextensions" / "neuron-lab-panel").symlink_to(built, target_is_directory=True)
    (data / "kernels" / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "neuron_lab e2e", "language": "python"}))
    settings = tmp / "settings" / "neuron-lab-panel"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"refreshRate": PANEL_RATE_HZ}))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)   # no "get notified about news?" toast over the screenshots
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))

    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(cfg), "JUPYTER_DATA_DIR": str(data),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "IPYTHONDIR": str(tmp / "ipython"),
           "JUPYTER_PLATFORM_DIRS": "1", "PYTHONUNBUFFERED": "1", "JUPYTER_PREFER_ENV_PATH": "0"}
    log = tmp / "lab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.base_url={BASE_URL}",
           f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={tmp / 'settings'}",
           f"--LabApp.workspaces_dir={tmp / 'workspaces'}", "--LabApp.news_url=",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.allow_root=True"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                cwd=str(root), start_new_session=True)
    url = f"http://127.0.0.1:{port}{BASE_URL}"
    try:
        deadline = time.time() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"jupyter lab did not answer in 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Lab(url=url, token=token, root=root, log=log)
    finally:
        if proc.poll() is None:
            _shutdown_kernels(url, token)     # kernels run in their own sessions: stop them first
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} not found (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, lab):
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.console_errors = errors
    yield pg
    ctx.close()
