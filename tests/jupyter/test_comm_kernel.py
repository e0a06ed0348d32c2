"""The side panel's comm against a real kernel: live pushes while a cell is still running."""
import re
import time
import uuid

from neuron_lab.jupyter import protocol as P


def _execute(kc, code, timeout=120):
    msg_id = kc.execute(code)
    reply = kc.get_shell_msg(timeout=timeout)
    assert reply["content"]["status"] == "ok", reply["content"]
    return msg_id


def _open_comm(kc):
    comm_id = uuid.uuid4().hex
    msg = kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": P.TARGET, "data": {}})
    kc.shell_channel.send(msg)
    return comm_id


def _send(kc, comm_id, data):
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": data}))


def _collect(kc, until, timeout=60, comms=None):
    """iopub messages until ``until(msgs)`` is true; returns the comm payloads (of the comms
    in ``comms`` if given: the kernel opens one of its own too) with the busy state at arrival."""
    out, busy = [], False
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if m["msg_type"] == "status":
            busy = m["content"]["execution_state"] == "busy"
        if m["msg_type"] == "comm_msg" and (comms is None or m["content"]["comm_id"] in comms):
            out.append((m["content"]["data"], busy))
        if until(out, m):
            break
    return out


def test_comm_pushes_memory_and_fallbacks_while_cell_runs(kernel):
    kc = kernel
    _execute(kc, "import torch, time, neuron_lab\n%load_ext neuron_lab")
    comm_id = _open_comm(kc)
    mine = {comm_id}
    first = _collect(kc, lambda o, m: any(d["type"] == P.SNAPSHOT for d, _ in o), comms=mine)
    types = [d["type"] for d, _ in first]
    assert types[:2] == [P.HELLO, P.SNAPSHOT] and first[0][0]["v"] == P.VERSION
    assert first[0][0]["push_hz"] == P.DEFAULT_PUSH_HZ

    kc.execute("x = torch.empty(4096, device='neuron')\ntime.sleep(1.0)\n"
               "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()\ntime.sleep(1.5)\n")
    msgs = _collect(kc, lambda o, m: any(d["type"] == P.CELL for d, _ in o), timeout=90, comms=mine)
    live_mem = [d for d, busy in msgs if d["type"] == P.MEMORY and busy]
    assert any(d["allocated"] >= 16384 for d in live_mem), live_mem[-3:]
    live_fb = [d for d, busy in msgs if d["type"] == P.FALLBACK and busy]
    assert live_fb, [d["type"] for d, _ in msgs]
    row = next(r for d in live_fb for r in d["rows"] if r["op"] == "aten::sum")
    assert "float64" in row["reason"] and re.fullmatch(r"Cell In\[\d+\], line 3", row["locations"][0])
    assert any(d["type"] == P.RUNNING and busy and d["cell_id"] for d, busy in msgs)
    cell = next(d["record"] for d, _ in msgs if d["type"] == P.CELL)
    assert cell["wall_s"] >= 2.5 and cell["fallbacks"] >= 1 and cell["peak_bytes"] >= 16384

    _send(kc, comm_id, {"type": P.SET_RATE, "hz": 50})
    _send(kc, comm_id, {"type": "execute", "code": "1/0"})
    _send(kc, comm_id, {"type": P.REQUEST, "what": "snapshot"})
    replies = _collect(kc, lambda o, m: sum(d["type"] in (P.HELLO, P.ERROR, P.SNAPSHOT)
                                             for d, _ in o) >= 3, comms=mine)
    kinds = {d["type"]: d for d, _ in replies}
    assert kinds[P.HELLO]["push_hz"] == P.MAX_PUSH_HZ          # clamped
    assert "unsupported request type" in kinds[P.ERROR]["message"]  # never runs code
    assert kinds[P.SNAPSHOT]["memory"]["allocated"] >= 16384


IDLE_WORK = """import threading
def later():
    time.sleep(0.8)
    globals()['late'] = torch.empty(1 << 15, device='neuron')
    time.sleep(0.3)
    torch.zeros(2, device='neuron', dtype=torch.float64).mean()
threading.Thread(target=later).start()
"""


def test_two_frontends_idle_pushes_and_restart(kernel, kernel_manager):
    kc = kernel
    _execute(kc, "import torch, time, neuron_lab\n%load_ext neuron_lab\n"
                 "s = torch.ones(3, device='neuron', dtype=torch.float64).sum()")
    mine = {_open_comm(kc), _open_comm(kc)}
    hellos = _collect(kc, lambda o, m: sum(d["type"] == P.SNAPSHOT for d, _ in o) >= 2, comms=mine)
    assert sum(d["type"] == P.HELLO for d, _ in hellos) == 2

    # work done by a user thread after the cell ended: pushed on change while idle, to both
    _execute(kc, IDLE_WORK)

    def done(o, m):
        return sum(d["type"] == P.SNAPSHOT and not busy and d["memory"]["allocated"] >= 1 << 17
                   for d, busy in o) >= 2 and any(
            d["type"] == P.FALLBACK and not busy and any(r["op"] == "aten::mean" for r in d["rows"])
            for d, busy in o)
    msgs = _collect(kc, done, timeout=30, comms=mine)
    snaps = [d for d, busy in msgs if d["type"] == P.SNAPSHOT and not busy
             and d["memory"]["allocated"] >= 1 << 17]
    assert len(snaps) >= 2, [d["type"] for d, _ in msgs]     # one per frontend
    fb = [d for d, busy in msgs if d["type"] == P.FALLBACK and not busy]
    ops = {r["op"] for d in fb for r in d["rows"]}
    assert "aten::mean" in ops and "aten::sum" not in ops    # only new/changed rows
    mean = next(r for d in fb for r in d["rows"] if r["op"] == "aten::mean")
    assert re.fullmatch(r"Cell In\[\d+\], line 6", mean["locations"][0]), mean          # the thread's line in the cell

    # restart: a new process, fresh state; the panel opens a new comm after %load_ext
    kernel_manager.restart_kernel(now=True)
    kc.wait_for_ready(timeout=120)
    _execute(kc, "%load_ext neuron_lab")
    fresh = _collect(kc, lambda o, m: any(d["type"] == P.SNAPSHOT for d, _ in o),
                     comms={_open_comm(kc)})
    snap = next(d for d, _ in fresh if d["type"] == P.SNAPSHOT)
    assert snap["fallbacks"] == [] and snap["memory"]["allocated"] == 0
    assert len(snap["cells"]) <= 1                           # at most the %load_ext cell


def test_autoload_through_ipython_config(kernel_manager, start_client, tmp_path):
    """The documented setup: ``c.InteractiveShellApp.extensions = ["neuron_lab"]`` in the
    profile's ipython_config.py registers the comm target at kernel start, no %load_ext."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_config.py").write_text('c.InteractiveShellApp.extensions = ["neuron_lab"]\n')
    kc = start_client(kernel_manager, tmp_path, env={"IPYTHONDIR": str(tmp_path / "ipython")})
    try:
        mine = {_open_comm(kc)}
        first = _collect(kc, lambda o, m: any(d["type"] == P.SNAPSHOT for d, _ in o), timeout=60,
                         comms=mine)
        assert [d["type"] for d, _ in first][:2] == [P.HELLO, P.SNAPSHOT]
        _execute(kc, "import torch\nx = torch.empty(1024, device='neuron')")
        cell = _collect(kc, lambda o, m: any(d["type"] == P.CELL for d, _ in o), comms=mine)
        assert any(d["type"] == P.CELL and d["record"]["peak_bytes"] >= 4096 for d, _ in cell)
    finally:
        kc.stop_channels()
        kernel_manager.shutdown_kernel(now=True)


def _kernel_comm_msgs(kc, until, timeout=60):
    """iopub comm traffic as (comm_id, msg_type, data, busy) until ``until(rows)``."""
    rows, busy = [], False
    deadline = time.time() + timeout
    while time.time() < deadline and not until(rows):
        try:
            m = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if m["msg_type"] == "status":
            busy = m["content"]["execution_state"] == "busy"
        elif m["msg_type"] in ("comm_open", "comm_msg"):
            c = m["content"]
            rows.append((c["comm_id"], m["msg_type"], c.get("data", {}), busy))
    return rows


def test_kernel_opens_the_comm_live_through_run_all(kernel):
    """Run All: a first cell loads the extension and keeps running, the next cell is queued
    behind it. The kernel opens the comm itself (comm_open on iopub, ``hello`` as its data), and
    memory pushes reach it while the same cell and then the next one are busy; no frontend
    comm_open (which would wait behind the busy cells) is needed."""
    kc = kernel
    kc.execute("import torch, time, neuron_lab\n%load_ext neuron_lab\n"
               "a = torch.empty(1 << 16, device='neuron')\ntime.sleep(1.5)")
    kc.execute("b = torch.empty(1 << 17, device='neuron')\ntime.sleep(1.5)\nb.sum()")
    rows = _kernel_comm_msgs(kc, lambda r: sum(d.get("type") == P.CELL for _, _, d, _ in r) >= 2,
                             timeout=120)
    opens = [(cid, d) for cid, kind, d, _ in rows if kind == "comm_open"]
    assert len(opens) == 1, rows[:5]
    cid, hello = opens[0]
    assert hello["type"] == P.HELLO and hello["v"] == P.VERSION
    mine = [(d, busy) for c, kind, d, busy in rows if c == cid and kind == "comm_msg"]
    assert mine[0][0]["type"] == P.SNAPSHOT
    live = [d["allocated"] for d, busy in mine if d["type"] == P.MEMORY and busy]
    assert any(a == 1 << 18 for a in live), live            # during the loading cell's sleep
    assert any(a == (1 << 18) + (1 << 19) for a in live), live   # during the next cell's sleep
    cells = [d["record"] for d, _ in mine if d["type"] == P.CELL]
    assert cells[0]["peak_bytes"] >= 1 << 18 and cells[0]["wall_s"] >= 1.4
    assert cells[1]["peak_bytes"] >= (1 << 18) + (1 << 19)
