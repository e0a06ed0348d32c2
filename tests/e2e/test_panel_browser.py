"""The side panel end to end: real JupyterLab (behind /lab-base/), real kernel, headless Chromium.

One notebook, one scenario, in the order a user meets it:

1. the panel opens from its sidebar icon and says neuron_lab is not loaded;
2. a cell imports neuron_lab, loads the extension, puts 4 MiB on `neuron` and sums a float64
   tensor: the panel (the kernel opened the comm at the load) shows the allocated bytes and the
   fallback rows with the user's line, and the refresh-rate setting reached the kernel; a
   4-second cell then grows memory while the panel shows it running, live;
3. light and dark screenshots go to test-artifacts/;
4. the kernel restarts: the panel says not loaded; its button runs `%load_ext neuron_lab`
   and the data comes back, then the cell again fills it, now with a per-cell record;
5. a second notebook: the panel follows the current notebook, and back;
6. a page reload restores the panel and reconnects to the running kernel.

A second test runs a notebook with Run All (`%load_ext` first, a sleeping cell next): the panel
is live during the sleep; the fallback row reads `Cell In[2], line 2` and clicking it scrolls the
notebook back to that cell; screenshots light and dark (test-artifacts/run-all-*.png).

The kernel side is the real one (neuron_lab.jupyter.comm); nothing is faked.
"""
from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.browser

CELL = ("import torch, neuron_lab\n"
        "%load_ext neuron_lab\n"
        "x = torch.empty(1 << 20, device='neuron')  # 4 MiB of float32\n"
        "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()  # no float64 on Trainium\n"
        "print(x.device, float(y))")
FLOAT64_LINE = 4
BUSY_CELL = ("import time\n"
             "xs = []\n"
             "for i in range(8):\n"
             "    xs.append(torch.empty(1 << 18, device='neuron'))  # +1 MiB\n"
             "    time.sleep(0.5)")

PANEL = "#neuron-lab-panel"
_RECORD_RENDERS = """() => {
  window.__nlRenders = [];
  const panel = document.querySelector('#neuron-lab-panel');
  const text = nl => panel.querySelector(`[data-nl="${nl}"]`);
  new MutationObserver(() => {
    const st = text('status'), mem = text('allocated'), el = text('elapsed');
    if (st && mem) window.__nlRenders.push([st.textContent, Number(mem.dataset.bytes), el ? el.textContent : '']);
  }).observe(panel, {childList: true, subtree: true});
}"""


def _nl(name: str) -> str:
    return f'{PANEL} [data-nl="{name}"]'


def _notebook(lab, name: str, *sources: str) -> str:
    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": lab.kernel, "display_name": "neuron_lab e2e",
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                     "outputs": [], "source": src} for i, src in enumerate(sources)]}
    (lab.root / name).write_text(json.dumps(nb))
    return name


def _tab(page, name: str):
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text=name)


def _run_cell(page, index: int) -> None:
    page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")


def _command(page, command: str, args: dict | None = None) -> None:
    """Start a JupyterLab command without waiting for it (it may open a dialog)."""
    page.evaluate("([c, a]) => { window.jupyterapp.commands.execute(c, a); }", [command, args or {}])


def _shows_data(page, expect, allocated: str) -> None:
    expect(page.locator(_nl("status"))).to_have_text("live", timeout=90_000)
    expect(page.locator(_nl("allocated"))).to_have_text(allocated, timeout=90_000)


def _shows_fallback(page, expect) -> None:
    row = page.locator(f'{_nl("fallback-row")}[data-op="aten::sum"]')
    expect(row).to_be_visible(timeout=60_000)
    where = row.locator("xpath=following-sibling::tr[1]")
    expect(where.locator('[data-nl="reason"]')).to_contain_text("float64")
    expect(where.locator('[data-nl="location"]')).to_have_text(
        re.compile(rf"^Cell In\[\d+\], line {FLOAT64_LINE}$"))
    expect(where.locator('[data-nl="source"]')).to_contain_text("dtype=torch.float64")


def test_panel_live_restart_reload(page, lab):
    from playwright.sync_api import expect

    art, rate = lab.artifacts, lab.rate_hz
    art.mkdir(exist_ok=True)
    page.goto(lab.lab_url(_notebook(lab, "e2e.ipynb", CELL, BUSY_CELL)))
    expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=90_000)
    assert "/lab-base/" in page.url

    # 1. the sidebar icon opens the panel; the fresh kernel has no neuron_lab yet
    page.locator('.jp-SideBar.jp-mod-right .lm-TabBar-tab[data-id="neuron-lab-panel"]').click()
    expect(page.locator(PANEL)).to_be_visible()
    expect(page.locator(_nl("not-loaded"))).to_be_visible(timeout=90_000)
    expect(page.locator(_nl("load"))).to_have_text("Load neuron_lab")

    # 2. the user's own cell loads it; the panel picks it up and shows the device
    _run_cell(page, 0)
    _shows_data(page, expect, "4.00 MiB")
    assert int(page.locator(_nl("allocated")).get_attribute("data-bytes")) >= 4 << 20
    _shows_fallback(page, expect)
    expect(page.locator(_nl("hello"))).to_contain_text(f"{rate:g} Hz")  # set_rate reached it
    expect(page.locator(".jp-OutputArea-output").first).to_contain_text("neuron:0 3.0")

    # a busy cell: the panel updates while it runs (memory grows, elapsed ticks). Every render is
    # recorded in the page, so the check does not depend on when this process looks.
    page.evaluate(_RECORD_RENDERS)
    _run_cell(page, 1)
    expect(page.locator(_nl("status"))).to_have_text("running", timeout=30_000)
    page.locator(PANEL).screenshot(path=str(art / "panel-running-light.png"))
    expect(page.locator(_nl("status"))).to_have_text("live", timeout=60_000)
    expect(page.locator(_nl("allocated"))).to_have_text("12.00 MiB")
    busy = [(b, e) for st, b, e in page.evaluate("window.__nlRenders") if st == "running"]
    assert any(4 << 20 < b < 12 << 20 for b, _ in busy), busy      # grew while still running
    assert len({e for _, e in busy if e}) >= 3, busy                  # several live pushes
    # two records: the rest of the cell that loaded the extension, and the busy cell (newest first)
    expect(page.locator(_nl("cell-row"))).to_have_count(2)
    expect(page.locator(_nl("cell-row")).first).to_contain_text("12.00 MiB")  # its peak

    # 3. screenshots, light and dark
    page.screenshot(path=str(art / "panel-light.png"))
    page.locator(PANEL).screenshot(path=str(art / "panel-light-sidebar.png"))
    _command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    expect(page.locator('body[data-jp-theme-light="false"]')).to_be_attached(timeout=30_000)
    page.wait_for_timeout(1000)  # theme CSS applies after the attribute flips
    page.screenshot(path=str(art / "panel-dark.png"))
    page.locator(PANEL).screenshot(path=str(art / "panel-dark-sidebar.png"))

    # 4. restart: back to not-loaded; the button loads it; the cell fills it again
    _command(page, "notebook:restart-kernel")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    expect(page.locator(_nl("not-loaded"))).to_be_visible(timeout=90_000)
    page.locator(_nl("load")).click()
    _shows_data(page, expect, "0 B")
    expect(page.locator(_nl("hello"))).to_contain_text(f"{rate:g} Hz")
    _run_cell(page, 0)
    _shows_data(page, expect, "4.00 MiB")
    _shows_fallback(page, expect)
    # loaded before this cell started, so the whole cell is recorded
    expect(page.locator(_nl("cell-row")).first).to_be_visible(timeout=30_000)
    page.locator(PANEL).screenshot(path=str(art / "panel-after-restart-dark.png"))

    # 5. a second notebook (own kernel, no neuron_lab): the panel follows the current notebook,
    #    and going back shows the first one's data at once (its model stayed connected)
    _command(page, "docmanager:open", {"path": _notebook(lab, "other.ipynb", "1 + 1")})
    expect(page.locator(_nl("notebook"))).to_have_text("other.ipynb", timeout=60_000)
    expect(page.locator(_nl("not-loaded"))).to_be_visible(timeout=90_000)
    _tab(page, "e2e.ipynb").click()
    expect(page.locator(_nl("notebook"))).to_have_text("e2e.ipynb")
    _shows_data(page, expect, "4.00 MiB")
    _tab(page, "other.ipynb").click()
    _command(page, "application:close")
    page.locator(".jp-Dialog button", has_text="Discard").click()  # lab normalised it on open
    expect(_tab(page, "other.ipynb")).to_have_count(0)
    expect(page.locator(_nl("notebook"))).to_have_text("e2e.ipynb")

    # 6. reload: the layout restorer reopens the panel; it reconnects to the same kernel
    page.reload()
    expect(_tab(page, "e2e.ipynb")).to_be_visible(timeout=90_000)
    expect(page.locator(PANEL)).to_be_visible(timeout=60_000)
    _tab(page, "e2e.ipynb").click()  # the workspace may still hold the closed notebook
    _shows_data(page, expect, "4.00 MiB")
    _shows_fallback(page, expect)

    ours = [e for e in page.console_errors if "neuron" in e.lower()]
    assert not ours, ours


RUN_ALL_CELLS = ("import time, torch, neuron_lab\n%load_ext neuron_lab",
                 "x = torch.empty(1 << 20, device='neuron')  # 4 MiB\n"
                 "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()\n"
                 "time.sleep(8)",
                 *[f"# filler {i}: a long notebook, so revealing cell 2 must scroll\n" + "\n" * 12
                   for i in range(12)])


def test_run_all_is_live_from_the_first_cell(page, lab):
    """Run All on a fresh kernel, `%load_ext` in the first cell and a sleeping cell after it:
    the kernel opens the comm, so the panel shows the device memory *during* the sleep (a
    frontend comm_open would wait behind the busy kernel until the sleep is over)."""
    from playwright.sync_api import expect

    # `reset`: a fresh workspace (the first test's notebooks are not reopened)
    page.goto(lab.lab_url(_notebook(lab, "run_all.ipynb", *RUN_ALL_CELLS)) + "&reset")
    expect(page.locator(".jp-NotebookPanel:visible")).to_have_count(1, timeout=90_000)
    _command(page, "neuron-lab:open-panel")   # (a click would close it if the workspace had it open)
    expect(page.locator(_nl("notebook"))).to_have_text("run_all.ipynb", timeout=60_000)
    expect(page.locator(_nl("not-loaded"))).to_be_visible(timeout=90_000)
    _command(page, "apputils:change-theme", {"theme": "JupyterLab Light"})  # test 1 left it dark
    expect(page.locator('body[data-jp-theme-light="true"]')).to_be_attached(timeout=30_000)
    page.evaluate(_RECORD_RENDERS)
    _command(page, "notebook:run-all-cells")
    expect(page.locator(_nl("status"))).to_have_text("running", timeout=60_000)
    expect(page.locator(_nl("allocated"))).to_have_text("4.00 MiB", timeout=30_000)
    # still inside the sleep: the second cell has no execution count yet
    prompt = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(1).locator(".jp-InputPrompt")
    expect(prompt).to_contain_text("[*]", timeout=3_000)
    page.locator(PANEL).screenshot(path=str(lab.artifacts / "panel-run-all-light.png"))
    expect(page.locator(_nl("status"))).to_have_text("live", timeout=60_000)
    busy = [b for st, b, _ in page.evaluate("window.__nlRenders") if st == "running"]
    assert any(b >= 4 << 20 for b in busy), busy

    # the fallback row names the cell as IPython does; clicking it scrolls back to that cell
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    expect(cells.nth(1).locator(".jp-InputPrompt")).to_contain_text("[2]", timeout=60_000)
    link = page.locator(f'{_nl("fallback-row")}[data-op="aten::sum"]').locator(
        "xpath=following-sibling::tr[1]").locator('a[data-nl="location"]')
    expect(link).to_have_text("Cell In[2], line 2", timeout=60_000)
    cells.last.click()                                     # the bottom of the notebook
    page.keyboard.press("Escape")
    expect(cells.nth(1)).not_to_be_in_viewport()
    link.click()
    expect(cells.nth(1)).to_be_in_viewport(timeout=10_000)
    expect(cells.nth(1)).to_have_class(re.compile(r"\bjp-mod-active\b"))
    page.locator(PANEL).screenshot(path=str(lab.artifacts / "panel-run-all-fallback-light.png"))
    page.screenshot(path=str(lab.artifacts / "run-all-light.png"))
    _command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    expect(page.locator('body[data-jp-theme-light="false"]')).to_be_attached(timeout=30_000)
    page.wait_for_timeout(1000)  # theme CSS applies after the attribute flips
    page.locator(PANEL).screenshot(path=str(lab.artifacts / "panel-run-all-fallback-dark.png"))
    page.screenshot(path=str(lab.artifacts / "run-all-dark.png"))
