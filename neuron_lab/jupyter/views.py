"""Rich outputs for the magics: one ``Table`` type with ``_repr_html_`` and a text fallback."""
from __future__ import annotations

import html


class Table:
    """Rows of dicts shown as an HTML table in notebooks and as aligned text in terminals."""

    def __init__(self, title: str, rows: list[dict], columns: list[str] | None = None,
                 note: str = "", sections: list["Table"] | None = None) -> None:
        self.title, self.rows, self.note = title, rows, note
        self.columns = columns or (list(rows[0]) if rows else [])
        self.sections = sections or []      # further tables shown below (``%neuron_profile``)

    def _cells(self, r):
        out = []
        for c in self.columns:
            v = r.get(c, "")
            if isinstance(v, float):
                v = f"{v:.4g}"
            elif isinstance(v, (list, tuple)):
                v = ", ".join(map(str, v))
            out.append("" if v is None else str(v))
        return out

    def __repr__(self) -> str:
        rows = [self._cells(r) for r in self.rows]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(self.columns)]
        line = lambda cells: "  ".join(x.ljust(w) for x, w in zip(cells, widths))  # noqa: E731
        body = [line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in rows]
        text = [self.title] + (body if rows else ["(none)"])
        if self.note:
            text.append(self.note)
        return "\n\n".join(["\n".join(text)] + [repr(t) for t in self.sections])

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in self._cells(r)) + "</tr>"
                       for r in self.rows) or f"<tr><td colspan={len(self.columns) or 1}>(none)</td></tr>"
        note = f"<p>{e(self.note)}</p>" if self.note else ""
        more = "".join(t._repr_html_() for t in self.sections)
        return (f"<div class='neuron-lab'><b>{e(self.title)}</b><table><thead><tr>{head}</tr>"
                f"</thead><tbody>{body}</tbody></table>{note}{more}</div>")


class Text:
    """Preformatted text (memory summary, reports) that renders as <pre> in notebooks."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.text)}</pre>"
