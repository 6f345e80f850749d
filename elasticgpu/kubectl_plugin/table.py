"""kubectl's plain table: upper-case headers, columns left-aligned, three spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The table as text, one line per row, each ending in a newline; blank cells print as `<none>`."""
    cells = [list(header), *([cell or "<none>" for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "".join(line + "\n" for line in lines)
