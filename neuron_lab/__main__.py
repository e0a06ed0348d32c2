"""``python -m neuron_lab run SCRIPT.py [args] [--json FILE]``: run a script on the device.

The script runs as ``__main__`` with ``sys.argv`` set to the script and its arguments, after
``import neuron_lab``; at exit the metrics report is printed (stderr) and optionally saved as
JSON; the process exits with the script's own exit code (an uncaught exception: 1, with its
traceback). While fused programs compile, a progress line is shown on stderr.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
import threading
import traceback


def _progress(stop: threading.Event) -> None:
    from . import runtime
    shown = False
    while not stop.wait(1.0):
        n = runtime.stats()["compiles_pending"]
        if n:
            print(f"\r[neuron_lab] compiling {n} fused program(s)...", end="", file=sys.stderr)
            shown = True
        elif shown:
            print("\r[neuron_lab] fused programs ready.          ", file=sys.stderr)
            shown = False


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m neuron_lab run",
                                description="Run a script on the neuron device and report.")
    p.add_argument("--json", help="also write metrics() to this JSON file")
    p.add_argument("--quiet", action="store_true", help="do not print the report")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    import neuron_lab
    stop = threading.Event()
    threading.Thread(target=_progress, args=(stop,), daemon=True).start()
    sys.argv = [a.script] + a.args
    code = 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        stop.set()
        neuron_lab.sync("exit")
        if not a.quiet:
            print(neuron_lab.metrics_report(), file=sys.stderr)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(neuron_lab.metrics(), f, indent=1, default=str)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "run":
        print("usage: python -m neuron_lab run SCRIPT.py [args] [--json FILE]\n"
              "       python -m neuron_lab.bench [--quick] [--json FILE] [--plot FILE.png]",
              file=sys.stderr)
        return 2
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
