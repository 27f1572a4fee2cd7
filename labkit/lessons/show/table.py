"""A small HTML table for evidence results."""

from __future__ import annotations

import html


def html_table(title: str, header: list[str], rows: list[list], note: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
                   for row in rows)
    return (f"<b>{html.escape(title)}</b><table><tr>{head}</tr>{body}</table>"
            + (f"<i>{html.escape(note)}</i>" if note else ""))
