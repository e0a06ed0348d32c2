"""The compile helper's CPU (``helper.py``): the priority it runs at, and the CPU time it used.

``lower_priority`` puts a just-started helper below the user's process, so a compile takes the
CPU the user's loop leaves; ``session_cpu_s`` sums the CPU time of the helper's session (it and
the compiler processes it starts), which its compile's time limit counts. Linux's interfaces
(``setpriority``, ``SCHED_IDLE``, ``/proc``); elsewhere the first does what the OS allows and
the second returns None.
"""
from __future__ import annotations

import os


def lower_priority(pid: int, nice: int) -> None:
    """Run the helper ``pid`` (and the C++ compiler it starts) ``nice`` steps below the user's
    process; at 19, the lowest priority, under ``SCHED_IDLE`` too. A compile is seconds to
    minutes of CPU that no step of the user's loop waits for, so it takes what the loop leaves.

    Measured on W3's train step (MLP + AdamW) beside a process that spins, mean ms/step:
    one core 5.39 alone, 6.50 beside it at nice 10, 5.74 under SCHED_IDLE and nice 19; two
    OpenMP threads on two cores 3.87, 5.10, 4.04. Niced, the other process still gets its
    share of each core (about a tenth at 10) in slices of milliseconds, and a parallel region
    waits for its thread that lost the core; an idle-policy task is preempted as soon as any
    other task wakes. So at the default a loop that keeps every core busy leaves the compile
    little, and the compile finishes in the loop's pauses (a notebook's between cells).

    The user's process lowers the helper as soon as it has started, before the helper imports
    torch (~4 s of CPU): niced only after its imports, the helper took half the only core from
    a user's loop for its start-up (W7 one-core: steps 3-40 at 16-22 ms against 6.4 eager).
    The helper's threads and the compiler's processes inherit its priority and policy.

    The helper runs in a session of its own, and Linux's autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``) gives each session a group whose share of
    the CPU does not depend on its processes' nice values: the helper's group then took a core
    from a user's loop on two OpenMP threads as if it were not niced (W3's step 4 ms -> ~30 ms,
    plain CPU torch's too, while a compile ran). The group is niced as well."""
    if nice <= 0:
        return
    nice = min(nice, 19)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(os.getpriority(os.PRIO_PROCESS, 0) + nice, 19))
        if nice == 19:
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):      # not permitted, or not Linux
        pass
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:                        # no autogroup (another OS, or a kernel without it)
        pass


def session_cpu_s(sid: int) -> float | None:
    """CPU seconds of the processes in session ``sid`` (the helper, which leads its own, and the
    compiler processes it starts), with their children already reaped; None without ``/proc``.
    A live process's own time is in its ``utime``/``stime``, a reaped one's in its reaper's
    ``cutime``/``cstime``: each CPU second is counted once."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:                        # ended meanwhile
            continue
        fields = stat[stat.rindex(b")") + 2:].split()      # from field 3 (state) on
        if int(fields[3]) == sid:                          # field 6: session
            ticks += sum(int(x) for x in fields[11:15])    # fields 14-17: u/s/cu/cs time
    return ticks / os.sysconf("SC_CLK_TCK")
