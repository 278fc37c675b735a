"""Terminal output that never cuts a value a user must paste (ids, URLs)."""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` at its natural width, wider than the terminal if it must be.

    Rich otherwise shrinks a table to the terminal, folding or ellipsizing cells; a
    delivery id cut to ``dlv_3f0c…`` cannot be passed to the next command. Unwrapped lines
    are left to the terminal, whose soft wrap copies back as one line.
    """
    options = console.options.update(max_width=100_000)
    natural = Measurement.get(console, options, table).maximum
    if natural <= console.width:
        console.print(table)
        return
    # ``Console.print(width=...)`` never exceeds the terminal; a console as wide as the table does.
    wide = Console(
        file=console.file,
        width=natural,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
        no_color=console.no_color,
        highlight=False,
    )
    wide.print(table, crop=False)
