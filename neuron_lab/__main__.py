"""``python -m neuron_lab run SCRIPT.py [args] [--json FILE]``: run a script on the device;
``python -m neuron_lab analyze TRACE.parquet``: advise()'s findings from a trace file
(``telemetry/analyze.py``).

The script runs as ``__main__`` the way ``python SCRIPT.py`` would run it (``sys.argv`` is the
script and its arguments, the script's folder is ``sys.path[0]``), after ``import neuron_lab``
has registered the device. Under ``torchrun`` every rank runs it: each prints its own report
(its header names the rank) and ``--json m.json`` writes ``m.rank<N>.json`` per rank. At exit the adaptive queue is flushed, the metrics report is printed
on stderr (stdout stays the script's) and optionally saved as JSON; the process exits with the
script's own exit code: ``sys.exit(n)`` -> n, ``sys.exit("msg")`` -> the message and 1, an
uncaught exception -> its traceback and 1, Ctrl-C -> 130. While fused programs compile in the
background a progress line is shown on stderr (rewritten in place on a terminal, one line per
change otherwise, so logs stay readable). Options for ``run`` go before the script name.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import threading
import traceback

PROGRESS_POLL_S = 0.5


def progress_line(stats: dict) -> str | None:
    """The line to show for the compile queue, or None when nothing is compiling."""
    pending = stats.get("compiles_pending", 0)
    if not pending:
        return None
    return (f"[neuron_lab] compiling {pending} fused program(s) in the background "
            f"({stats.get('compiles_done', 0)} ready, {stats.get('compiles_failed', 0)} failed; "
            f"running per-op meanwhile)")


def _progress(stop: threading.Event, stream=sys.stderr) -> None:
    from . import runtime
    tty = stream.isatty()
    last = None
    while not stop.wait(PROGRESS_POLL_S):
        line = progress_line(runtime.stats())
        if line == last:
            continue
        if line is not None:
            print(("\r\033[K" if tty else "") + line, end="" if tty else "\n", file=stream,
                  flush=True)
        elif last is not None:
            s = runtime.stats()
            done = (f"[neuron_lab] fused programs ready ({s.get('compiles_done', 0)} done, "
                    f"{s.get('compiles_failed', 0)} failed)")
            print(("\r\033[K" if tty else "") + done, file=stream, flush=True)
        last = line
    if tty and last is not None:
        print(file=stream)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)              # what python does with sys.exit("message")
    return 1


def _per_rank(path: str) -> str:
    """Under a launcher with several ranks (torchrun), each rank writes its own report:
    ``m.json`` -> ``m.rank0.json``, ``m.rank1.json``..."""
    from .distributed import rank_info
    info = rank_info()
    if info.world_size <= 1:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{info.rank}{ext or '.json'}"


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m neuron_lab run",
                                description="Run a script on the neuron device and report.")
    p.add_argument("--json", help="also write metrics() to this JSON file")
    p.add_argument("--quiet", action="store_true", help="do not print the report")
    p.add_argument("script", help="the Python script to run as __main__")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    a = p.parse_args(argv)
    if not os.path.isfile(a.script):
        print(f"python -m neuron_lab run: can't open file {a.script!r}", file=sys.stderr)
        return 2
    import neuron_lab
    stop = threading.Event()
    progress = threading.Thread(target=_progress, args=(stop,), name="neuron_lab-progress",
                                daemon=True)
    progress.start()
    sys.argv = [a.script] + a.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    code = 0
    try:
        runpy.run_path(a.script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            neuron_lab.sync("exit")
        except Exception:
            traceback.print_exc()
            code = code or 1
        stop.set()
        progress.join(2.0)
        if not a.quiet:
            print(neuron_lab.metrics_report(), file=sys.stderr)
        if a.json:
            with open(_per_rank(a.json), "w") as f:
                json.dump(neuron_lab.metrics(), f, indent=1, default=str)
    return code


def analyze(argv: list[str]) -> int:
    """``analyze TRACE.parquet [--json]``: advise()'s findings from a trace file alone."""
    p = argparse.ArgumentParser(prog="python -m neuron_lab analyze",
                                description="The advisor's findings from a neuron_lab trace file "
                                            "(neuron_lab.profile(out_dir) writes "
                                            "out_dir/trace.parquet).")
    p.add_argument("trace", help="the trace file (trace.parquet, or trace.csv without pyarrow)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    a = p.parse_args(argv)
    if not os.path.isfile(a.trace):
        print(f"python -m neuron_lab analyze: no such file {a.trace!r}", file=sys.stderr)
        return 2
    from .telemetry import analyze as _analyze
    try:
        if a.json:
            print(json.dumps(_analyze.analyze(a.trace), indent=1))
        else:
            print(_analyze.summary(a.trace))
    except ValueError as e:
        print(f"python -m neuron_lab analyze: {e}", file=sys.stderr)
        return 2
    return 0


COMMANDS = {"run": run, "analyze": analyze}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m neuron_lab run [--json FILE] [--quiet] SCRIPT.py [args]\n"
              "       python -m neuron_lab analyze TRACE.parquet [--json]\n"
              "       python -m neuron_lab.bench [--quick] [--json FILE] [--plot FILE.png]",
              file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
