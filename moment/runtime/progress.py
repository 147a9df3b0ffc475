"""Rank 0's progress bar and run summary (rich, on stderr); the only output of the training entry point.

The bar shows seeds/s and MB/s per storage tier so a user sees at a glance which tier feeds the run.
Rates are rank 0's, scaled by the world size (every rank reads its equal share).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Self

from rich.console import Console
from rich.markup import escape

from moment.outputs import console_width

# Imports inside functions: rich's progress bar loads only on rank 0, when it shows one.


class Reporter:
    def __init__(self, *, enabled: bool, world_size: int, total_epochs: int):
        self.enabled, self.world_size, self.total_epochs = enabled, world_size, total_epochs
        self.console = Console(stderr=True, width=console_width(sys.stderr), emoji=False)
        self._bar = None
        self._task = None
        self._t0 = time.perf_counter()
        self._last = 0.0

    def __enter__(self) -> Self:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[rates]}"), console=self.console,
                                 transient=False)
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def notice(self, text: str) -> None:
        """Something the user must see even with --quiet (a restart, lost progress)."""
        self.console.print("[yellow]note:[/] " + escape(text), highlight=False, soft_wrap=True)

    def lines(self, lines: list[str]) -> None:
        if self.enabled:
            from rich.markup import escape

            for line in lines:
                self.console.print(escape(line), highlight=False)

    def start_epoch(self, epoch: int, steps: int, done: int) -> None:
        if self._bar is None:
            return
        self._t0 = time.perf_counter()
        self._bar.remove_task(self._task) if self._task is not None else None
        self._task = self._bar.add_task(f"epoch {epoch + 1}/{self.total_epochs}", total=steps, completed=done,
                                        rates="")

    def step(self, seeds: int, tiers: dict[str, Any]) -> None:
        if self._bar is None:
            return
        now = time.perf_counter()
        self._bar.advance(self._task)
        if now - self._last < 0.5:
            return
        self._last = now
        dt = max(now - self._t0, 1e-9)
        w = self.world_size
        mb = "  ".join(f"{k} {v * w / 1e6 / dt:,.0f}" for k, v in tiers["bytes"].items() if v)
        self._bar.update(self._task, rates=f"{seeds * w / dt:,.0f} seeds/s | MB/s {mb}")

    def end_epoch(self, epoch: int, acc: float | None, loss: float, metric: str = "accuracy") -> None:
        """`acc` None: a data-only run's epoch (no model, so no loss or validation score)."""
        if self.enabled and acc is None:
            self.console.print(f"epoch {epoch + 1}: data only (no model step)")
        elif self.enabled:
            self.console.print(f"epoch {epoch + 1}: loss {loss:.4f}  val {metric} {acc:.4f}")

    def summary(self, m: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._bar is not None:  # its last state stays above the summary, not drawn again below it
            self._bar.stop()
            self._bar = None
        st = m["stage_seconds"]
        stages = "  ".join(f"{k} {v:.2f}s" for k, v in st.items())
        tiers = "  ".join(f"{k} {v / 1e6:,.1f} MB" for k, v in m["tier_bytes"].items() if v)
        if m.get("data_only"):  # a feed rate is what data-only measures: the train epochs' alone
            rate = m.get("tier_mb_per_s", {})
            tiers += "; feed rate in the train epochs: " + "  ".join(
                f"{k} {v:,.1f} MB/s" for k, v in rate.items() if m["tier_bytes"].get(k))
        self.console.print(
            f"done: {m['epochs']} epochs, " + ("data only (no model step), " if m.get("data_only") else
                                               f"val {m['val_metric']} {m['val_' + m['val_metric']]:.4f}, ")
            + f"{m['seeds_per_s']:,.0f} seeds/s "
            f"on {m['world_size']} rank(s)\n  stages (mean per rank): {stages}; limiting: {m['limiting_stage']}\n"
            f"  read: {tiers}; I/O backend {m['backend']}")
        machines = m.get("machines") or []
        for x in machines:
            if line := disks_line(x.get("disks") or []):
                name = f"node {x['node_rank']} " if len(machines) > 1 else ""
                self.console.print(f"  {name}SSDs: {line}", highlight=False, soft_wrap=True)
        if any(x["remote_rows"] or x["remote_served_rows"] for x in machines):
            self.console.print("  machines: " + "; ".join(map(_machine_line, machines)), highlight=False,
                               soft_wrap=True)


def disks_line(disks: list[dict[str, Any]]) -> str:
    """The devices under a machine's SSD files over the epochs (moment.io.diskstats), those that read at all:
    busy share and rate while busy, which say whether the disks or the CPU side set the feed rate."""
    parts = [f"{d['device']} ({', '.join(d['files'])}) busy {d['busy_share']:.0%} of the epochs, "
             f"{d['read_MB_per_s_busy']:,.0f} MB/s while busy" for d in disks if d["read_MB_per_s_busy"]]
    return "; ".join(parts)


def _machine_line(x: dict[str, Any]) -> str:
    """One machine's remote reads in the summary (`moment.runtime.train.machines_of`)."""
    name = f"node {x['node_rank']}" + (f" ({x['machine']})" if x["machine"] else "")
    return (f"{name}: {x['remote_rows']:,} rows ({x['remote_bytes'] / 1e6:,.1f} MB, {x['remote_share']:.1%}) from the "
            f"others, {x['remote_served_rows']:,} served to them")
