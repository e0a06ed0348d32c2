"""IPython magics: ``%neuron``, ``%neuron_mode``, ``%neuron_profile``/``%%neuron_profile``,
``%neuron_memory``, ``%neuron_fallbacks``, ``%neuron_regions``, ``%neuron_advise``,
``%neuron_compile``, ``%neuron_reset``.

Each returns a rich object (``views.Table``/``views.Text``) so the notebook renders HTML and a
terminal gets text; every option is a ``magic_arguments`` argument with help.
"""
from __future__ import annotations

import contextlib
import re
import time

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import distributed, runtime
from ..compile import outcomes as compile_outcomes
from ..device import executor, memory, tracking
from ..telemetry import profile as _profile
from ..telemetry import store
from ..telemetry.advise import advise
from ..telemetry.overview import _fmt_bytes
from .views import Table, Text


def _fallback_rows(fallbacks: list[dict]) -> list[dict]:
    return [{"op": f["op"], "reason": f["reason"], "count": f["count"],
             "where": f["locations"][:3],
             "code": f["source"].get(f["locations"][0], "") if f["locations"] else ""}
            for f in fallbacks]


def fallback_table() -> Table:
    rows = _fallback_rows(tracking.fallback_ops())
    return Table("neuron fallbacks (newest first)", rows, ["op", "reason", "count", "where", "code"],
                 note="" if rows else "no op fell back to the host")


def _region_rows(regions: list[dict]) -> list[dict]:
    return [{"id": r["id"], "ops": r["ops"], "hits": r["hits"], "status": r["status"],
             "per_op_us": r["per_op_us"], "fused_us": r["fused_us"], "compile_s": r["compile_s"],
             "first ops": r["first_ops"][:3]} for r in regions]


def region_table() -> Table:
    rows = _region_rows(runtime.regions())
    s = runtime.stats()
    return Table("neuron region cache", rows, note=(
        f"{s['regions']} regions, hit rate {s['hit_rate']:.1%}, fused share {s['fused_share']:.1%},"
        f" compiles pending {s['compiles_pending']}, failed {s['compiles_failed']}"))


def compile_table() -> Table:
    tc = compile_outcomes.snapshot()
    programs = [{"graph": p["graph_id"], "kind": p["kind"], "ops": p["nodes"],
                 "compile_s": p["seconds"], "opaque ops": p["opaque_ops"]}
                for p in tc["recent_programs"][-10:]]
    breaks = [{"where": b["location"], "reason": b["reason"], "count": b["count"]}
              for b in tc["graph_break_sites"]]
    recompiles = [{"function": r["function"], "where": r["location"], "failed guard": r["failed_guard"]}
                  for r in tc["recent_recompiles"][-10:]]
    failures = [{"where": f["location"], "error": f["error"], "ran": f["fallback"]}
                for f in tc["recent_failures"][-10:]]
    return Table("torch.compile on neuron: compiled programs (newest last)", programs,
                 ["graph", "kind", "ops", "compile_s", "opaque ops"],
                 note=(f"{tc['frames']} frames, {tc['programs']} programs, {tc['recompiles']} "
                       f"recompiles, {tc['graph_breaks']} graph breaks, {tc['failures']} failures, "
                       f"{tc['dynamo_compile_seconds']:.1f} s compiling"),
                 sections=[Table("graph breaks", breaks, ["where", "reason", "count"]),
                           Table("recompiles", recompiles, ["function", "where", "failed guard"]),
                           Table("compile failures (ran eagerly)", failures, ["where", "error", "ran"])])


@contextlib.contextmanager
def _as_outer_cell(shell):
    """Compile a nested ``run_cell`` under the number of the cell it is part of, so locations
    in a ``%%neuron_profile`` body read ``Cell In[N], line M`` with the N the user sees (IPython
    would otherwise name it after the next count)."""
    outer = getattr(getattr(shell.displayhook, "exec_result", None), "execution_count", None)
    saved = shell.execution_count
    if outer is not None:
        shell.execution_count = outer
    try:
        yield
    finally:
        shell.execution_count = saved


_TOKEN = re.compile(r"""\s*("[^"]*"|'[^']*'|\S+)""")
_VALUE_OPTIONS = ("--top", "--export")


def split_options(line: str) -> tuple[str, str]:
    """Split ``%neuron_profile``'s line into its leading options and the statement, verbatim.

    argparse would otherwise read the statement too (``(x * -2).sum()`` is "an unknown option
    -2"); options are only recognised before the statement, and ``--`` ends them.
    """
    opts, pos = [], 0
    while True:
        m = _TOKEN.match(line, pos)
        if m is None or not m.group(1).startswith("-"):
            break
        tok = m.group(1)
        pos = m.end()
        if tok == "--":
            break
        opts.append(tok)
        if tok in _VALUE_OPTIONS:
            v = _TOKEN.match(line, pos)
            if v is not None:
                opts.append(v.group(1))
                pos = v.end()
        elif tok.split("=", 1)[0] not in _VALUE_OPTIONS + ("-h", "--help"):
            opts.pop()                      # not ours: the statement starts here (``-x + 1``)
            pos = m.start()
            break
    return " ".join(opts), line[pos:].strip()


def _rank_line(d: dict) -> str:
    if d["world_size"] <= 1 and not d["backend"]:
        return "no process group (single process)"
    return (f"rank {d['rank']} of {d['world_size']} ({d['backend'] or 'no group now'}), "
            f"{d['collectives']} collectives, {_fmt_bytes(d['collective_bytes'])}")


@magics_class
class NeuronMagics(Magics):
    @line_magic
    def neuron(self, line: str = ""):
        """Status: device, executor, mode, memory, region cache."""
        s = runtime.stats()
        rows = [{"item": k, "value": v} for k, v in (
            ("device", "neuron:0 (emulated Trainium2)"), ("executor", executor.executor_name()),
            ("mode", runtime.get_mode()),
            ("memory", f"{_fmt_bytes(memory.memory_allocated())} allocated, "
                       f"{_fmt_bytes(memory.max_memory_allocated())} peak of "
                       f"{_fmt_bytes(memory.capacity())}"),
            ("ops", tracking.counters()["ops"]), ("fallbacks", len(tracking.fallback_ops())),
            ("regions", f"{s['regions']} (hit rate {s['hit_rate']:.1%})"),
            ("fused share", f"{s['fused_share']:.1%}"),
            ("compiles", f"{s['compiles_done']} done, {s['compiles_pending']} pending, "
                         f"{s['compiles_failed']} failed"),
            ("distributed", _rank_line(distributed.summary())))]
        return Table("neuron", rows, ["item", "value"])

    @magic_arguments()
    @argument("mode", choices=("eager", "adaptive"), help="execution mode for the device")
    @line_magic
    def neuron_mode(self, line: str = ""):
        """Switch between per-op (eager) and adaptive execution."""
        args = parse_argstring(self.neuron_mode, line)
        runtime.set_mode(args.mode)
        return Text(f"neuron mode: {runtime.get_mode()}")

    @magic_arguments()
    @argument("--top", type=int, default=10, help="how many ops to list (by count)")
    @argument("--export", default=None, help="directory for the Chrome trace and launch tables")
    @argument("statement", nargs="*", help="statement to profile (line magic), after the options")
    @line_cell_magic
    def neuron_profile(self, line: str = "", cell: str | None = None):
        """Profile a statement or cell: top ops, launches, compile time, fallbacks, peak memory."""
        options, statement = split_options(line)
        args = parse_argstring(self.neuron_profile, options)
        code = cell if cell is not None else statement
        before = tracking.executed_ops()
        fb_before = {(f["op"], f["reason"]): f["count"] for f in tracking.fallback_ops()}
        hits_before = {r["id"]: r["hits"] for r in runtime.regions()}
        rs0 = runtime.stats()
        memory.reset_peak_memory_stats()
        t0 = time.perf_counter()
        with _profile(args.export or "neuron_profile", trace=bool(args.export),
                      tables=bool(args.export)) as prof, _as_outer_cell(self.shell):
            # a cell body keeps its line numbers: the %%neuron_profile line is line 1 (a comment
            # stands in for it; IPython drops leading blank lines)
            self.shell.run_cell(code if cell is None else "# %%neuron_profile\n" + code,
                                store_history=False)
        wall = time.perf_counter() - t0
        after = tracking.executed_ops()
        rs1 = runtime.stats()
        ops = sorted(((k, v - before.get(k, 0)) for k, v in after.items()
                      if v - before.get(k, 0) > 0), key=lambda kv: -kv[1])[: args.top]
        rows = [{"op": k, "count": v} for k, v in ops]
        fbs = [f for f in tracking.fallback_ops()
               if f["count"] > fb_before.get((f["op"], f["reason"]), 0)]
        mod = prof.modelled
        host_launch_s = sum(r.get("seconds", 0.0) for r in prof.launches)
        note = (f"wall {wall * 1e3:.1f} ms; host in launches {host_launch_s * 1e3:.2f} ms | "
                f"modelled {prof.chip} {mod.get('modelled_s', 0.0) * 1e3:.3f} ms "
                f"({mod.get('launches', 0)} launches for {mod.get('ops', 0)} ops, "
                f"{_fmt_bytes(mod.get('bytes', 0))} moved, {mod.get('flops', 0.0) / 1e9:.2f} GFLOP; "
                f"a model, not a measurement); launches {len(prof.launches)} "
                f"(fused {rs1['launches_fused'] - rs0['launches_fused']}); compile "
                f"{rs1['compile_seconds'] - rs0['compile_seconds']:.2f} s; peak memory "
                f"{_fmt_bytes(memory.max_memory_allocated())}; fallbacks: "
                + ("; ".join(f"{f['op']} at {', '.join(f['locations'][:2])}" for f in fbs) or "none"))
        if args.export:
            note += f"; trace: {prof.trace_path}; launches: {prof.launches_path}"
        touched = [dict(r, hits=r["hits"] - hits_before.get(r["id"], 0)) for r in runtime.regions()
                   if r["id"] not in hits_before or r["hits"] != hits_before[r["id"]]]
        sections = [Table("regions run (hits in this profile)", _region_rows(touched)[: args.top])]
        if fbs:
            sections.append(Table("fallbacks in this profile", _fallback_rows(fbs),
                                  ["op", "reason", "count", "where", "code"]))
        return Table("neuron profile: top ops", rows, ["op", "count"], note=note,
                     sections=sections)

    @line_magic
    def neuron_memory(self, line: str = ""):
        """Device memory summary (like torch.cuda.memory_summary)."""
        return Text(memory.memory_summary())

    @line_magic
    def neuron_fallbacks(self, line: str = ""):
        """Ops that fell back to the host, with the source line that issued them."""
        return fallback_table()

    @line_magic
    def neuron_regions(self, line: str = ""):
        """The adaptive runtime's region cache."""
        return region_table()

    @magic_arguments()
    @argument("--chip", default="trn2", help="the modelled chip the costs are priced on")
    @argument("--top", type=int, default=10, help="how many findings to list")
    @line_magic
    def neuron_advise(self, line: str = ""):
        """Bottlenecks found in what was recorded, ranked by their modelled cost on the chip."""
        args = parse_argstring(self.neuron_advise, line)
        found = advise(args.chip)
        rows = [{"kind": f["kind"], "where": f["where"],
                 f"{args.chip} cost": f"{f['modelled_s'] * 1e3:.3f} ms", "message": f["message"],
                 "fix": f["fix"]} for f in found[: args.top]]
        return Table(f"neuron advice (ranked by modelled {args.chip} cost; a model)", rows,
                     ["kind", "where", f"{args.chip} cost", "message", "fix"],
                     note="" if rows else "nothing to advise: no hot sync, fallback, unfused "
                                          "region, recompile, memory pressure or host-bound cell")

    @line_magic
    def neuron_compile(self, line: str = ""):
        """What torch.compile did on neuron: programs, graph breaks, recompiles, failures."""
        return compile_table()

    @magic_arguments()
    @argument("--cache", action="store_true", help="also forget cached regions")
    @line_magic
    def neuron_reset(self, line: str = ""):
        """Clear op tracking, per-cell records and the memory peak."""
        args = parse_argstring(self.neuron_reset, line)
        tracking.clear_op_tracking()
        store.clear()
        memory.reset_peak_memory_stats()
        if args.cache:
            runtime.reset()
        return Text("neuron: tracking reset" + (" (and region cache)" if args.cache else ""))
