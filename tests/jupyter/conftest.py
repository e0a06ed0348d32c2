"""Real kernels started from this interpreter (throwaway kernelspec pointing at sys.executable).

``kernel_manager``: an unstarted KernelManager (nbclient starts it); ``kernel``: a started
kernel's client for tests that talk to the channels directly; the ``start_client`` fixture is
``start_client(km, cwd, env)`` to start one by hand (e.g. with an IPython profile that
auto-loads the extension). ``ip``: an in-process IPython shell with the extension loaded
(per module).
"""
import json
import os
import sys

import pytest
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


@pytest.fixture
def kernel_manager(tmp_path):
    spec = tmp_path / "kernels" / "neuron-lab-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "neuron_lab test", "language": "python"}))
    return KernelManager(kernel_name="neuron-lab-test",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def start_client(km, cwd, env=None):
    km.start_kernel(cwd=str(cwd), env={**os.environ, **(env or {})})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return kc


@pytest.fixture(name="start_client")
def start_client_fixture():
    return start_client


@pytest.fixture
def kernel(kernel_manager, tmp_path):
    kc = start_client(kernel_manager, tmp_path)
    yield kc
    kc.stop_channels()
    kernel_manager.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "neuron_lab")
    yield shell
    shell.run_line_magic("unload_ext", "neuron_lab")
