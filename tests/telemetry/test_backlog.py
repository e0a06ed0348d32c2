"""metrics()'s event lists include what happened before telemetry was first imported.

Telemetry is imported by the first ``metrics()`` call; compiles, fallbacks and OOMs before it
used to be missing from ``compiles``, ``fallback_events`` and the store's OOM list. Run in a
fresh interpreter, so nothing has imported telemetry yet.
"""
import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, sys, torch, neuron_lab
    assert "neuron_lab.telemetry" not in sys.modules
    x = torch.ones(8, device="neuron")
    (x.double() * 2).sum().item()                  # float64: a fallback
    try:
        torch.empty(1 << 28, device="neuron")      # 1 GiB on a 0.5 GiB device
    except torch.OutOfMemoryError:
        pass
    for _ in range(4):                              # a region queued for a compile
        (x * 2 + 1).sin().cos().sum().item()
    assert "neuron_lab.telemetry" not in sys.modules
    m = neuron_lab.metrics()
    from neuron_lab.telemetry import store
    print("M " + json.dumps({"compiles": [c["outcome"] for c in m["compiles"]],
                             "fallbacks": [f["op"] for f in m["fallback_events"]],
                             "ooms": len(store.oom),
                             "stamped": all("t" in c for c in m["compiles"])}))
""")


def test_events_before_the_first_metrics_call_are_kept(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NEURON_LAB_SYNC_COMPILE"}
    env = dict(env, NEURON_LAB_HBM_GB="0.5", NEURON_LAB_EXIT_WAIT_S="0",
               NEURON_LAB_CACHE_DIR=str(tmp_path / "cache"), TORCHINDUCTOR_COMPILE_THREADS="1")
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("M ")][0][2:])
    assert "queued" in m["compiles"]
    assert any("_to_copy" in op or "mul" in op for op in m["fallbacks"]), m
    assert m["ooms"] == 1
    assert m["stamped"]
