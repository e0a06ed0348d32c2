"""The side panel's comm against a real kernel: live pushes while a cell is still running."""
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


def _collect(kc, until, timeout=60):
    """iopub messages until ``until(msgs)`` is true; returns (comm payloads with arrival
    state, all messages)."""
    out, busy = [], False
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            m = kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if m["msg_type"] == "status":
            busy = m["content"]["execution_state"] == "busy"
        if m["msg_type"] == "comm_msg":
            out.append((m["content"]["data"], busy))
        if until(out, m):
            break
    return out


def test_comm_pushes_memory_and_fallbacks_while_cell_runs(kernel):
    kc = kernel
    _execute(kc, "import torch, time, neuron_lab\n%load_ext neuron_lab")
    comm_id = _open_comm(kc)
    first = _collect(kc, lambda o, m: any(d["type"] == P.SNAPSHOT for d, _ in o))
    types = [d["type"] for d, _ in first]
    assert types[:2] == [P.HELLO, P.SNAPSHOT] and first[0][0]["v"] == P.VERSION
    assert first[0][0]["push_hz"] == P.DEFAULT_PUSH_HZ

    kc.execute("x = torch.empty(4096, device='neuron')\ntime.sleep(1.0)\n"
               "y = torch.ones(3, device='neuron', dtype=torch.float64).sum()\ntime.sleep(1.5)\n")
    msgs = _collect(kc, lambda o, m: any(d["type"] == P.CELL for d, _ in o), timeout=90)
    live_mem = [d for d, busy in msgs if d["type"] == P.MEMORY and busy]
    assert any(d["allocated"] >= 16384 for d in live_mem), live_mem[-3:]
    live_fb = [d for d, busy in msgs if d["type"] == P.FALLBACK and busy]
    assert live_fb, [d["type"] for d, _ in msgs]
    row = next(r for r in live_fb[-1]["rows"] if r["op"] == "aten::sum")
    assert "float64" in row["reason"] and row["locations"][0].endswith(":3")
    assert any(d["type"] == P.RUNNING and busy and d["cell_id"] for d, busy in msgs)
    cell = next(d["record"] for d, _ in msgs if d["type"] == P.CELL)
    assert cell["wall_s"] >= 2.5 and cell["fallbacks"] >= 1 and cell["peak_bytes"] >= 16384

    _send(kc, comm_id, {"type": P.SET_RATE, "hz": 50})
    _send(kc, comm_id, {"type": "execute", "code": "1/0"})
    _send(kc, comm_id, {"type": P.REQUEST, "what": "snapshot"})
    replies = _collect(kc, lambda o, m: sum(d["type"] in (P.HELLO, P.ERROR, P.SNAPSHOT)
                                             for d, _ in o) >= 3)
    kinds = {d["type"]: d for d, _ in replies}
    assert kinds[P.HELLO]["push_hz"] == P.MAX_PUSH_HZ          # clamped
    assert "unsupported request type" in kinds[P.ERROR]["message"]  # never runs code
    assert kinds[P.SNAPSHOT]["memory"]["allocated"] >= 16384


def test_two_frontends_both_receive(kernel):
    kc = kernel
    _execute(kc, "import torch, neuron_lab\n%load_ext neuron_lab")
    _open_comm(kc)
    _open_comm(kc)
    hellos = _collect(kc, lambda o, m: sum(d["type"] == P.SNAPSHOT for d, _ in o) >= 2)
    assert sum(d["type"] == P.HELLO for d, _ in hellos) == 2
