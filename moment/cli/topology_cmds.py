"""`moment plan`, `moment scan`, `moment compare`, `moment schema`, `moment profiles`."""

from __future__ import annotations

import json

import typer

from moment.cli import app, console


@app.command("profiles")
def profiles_cmd(json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    """List the built-in machine profiles (use them with --profile NAME)."""
    from moment.topology.profiles import builtin_names, load_profile

    rows = []
    for name in builtin_names():
        t = load_profile(name)
        rows.append({"name": name, "description": t.description or "", "counts": t.counts()})
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table(title="built-in profiles")
    table.add_column("name")
    table.add_column("description")
    for r in rows:
        table.add_row(r["name"], r["description"])
    console.print(table)
