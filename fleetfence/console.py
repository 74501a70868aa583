"""Tables the command line prints, kept readable in an 80-column terminal.

Rich shrinks a table that does not fit by cutting cells to `ARRIV…`, and two alert types then read
the same. So the CLI's tables draw no vertical rules (each saves three columns), and a long
identifier is broken deliberately, at the underscore nearest its middle, onto two lines.
"""

from __future__ import annotations

from rich import box
from rich.table import Table

# Names longer than this are printed on two lines.
NAME_WIDTH = 13


def two_lines(name: str, width: int = NAME_WIDTH) -> str:
    """`name` whole, or broken after the underscore nearest its middle (`ARRIVAL_BACK_\\nON_TIME`)."""
    if len(name) <= width or "_" not in name:
        return name
    cuts = [i + 1 for i, ch in enumerate(name[:-1]) if ch == "_"]
    cut = min(cuts, key=lambda i: (max(i, len(name) - i), -i))
    return f"{name[:cut]}\n{name[cut:]}"


def compact_table(title: str) -> Table:
    """A table with a header rule and no vertical rules, its title on the left."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
