"""protocol.ts mirrors protocol.py: same target, version, message type names and rate limits.

The Python module is the source of truth (it says so, and names this check); the TypeScript
union is read as text, which is enough for the constants both sides must agree on.
"""
from __future__ import annotations

import re
from pathlib import Path

from neuron_lab.jupyter import protocol as P

TS = (Path(__file__).resolve().parents[2] / "extension" / "src" / "protocol.ts").read_text()


def _const(name: str) -> str:
    m = re.search(rf"export const {name}\b[^=]*=\s*([^;]+);", TS)
    assert m, f"protocol.ts has no `export const {name}`"
    return m.group(1).strip()


def _names(const: str) -> tuple[str, ...]:
    return tuple(re.findall(r"'([a-z_]+)'", _const(const)))


def test_target_and_version():
    assert _const("TARGET") == f"'{P.TARGET}'"
    assert int(_const("VERSION")) == P.VERSION


def test_message_types_both_directions():
    assert _names("KERNEL_TYPES") == P.KERNEL_TYPES
    assert _names("FRONTEND_TYPES") == P.FRONTEND_TYPES
    for t in P.KERNEL_TYPES + P.FRONTEND_TYPES:   # each has an interface in the union
        assert re.search(rf"extends IEnvelope<'{t}'>", TS), t


def test_rate_limits():
    assert float(_const("DEFAULT_PUSH_HZ")) == P.DEFAULT_PUSH_HZ
    assert float(_const("MIN_PUSH_HZ")) == P.MIN_PUSH_HZ
    assert float(_const("MAX_PUSH_HZ")) == P.MAX_PUSH_HZ
