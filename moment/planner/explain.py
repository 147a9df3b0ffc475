"""Say in words why the recommended layout beats each usual layout, from the solved LPs.

Every layout's LP solution has saturated links or devices (utilisation >= 99.9%): they set its epoch
time. For a usual layout, the ones that are saturated there and not in the recommended layout are
why it is slower; each is named with its capacity, the GPUs whose reads cross it (by slot, which
means the same thing in every layout) and what those GPUs get, beside the same link's load in the
recommended layout. SSD reads and SSD slot links are counted as groups, not listed one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from moment.planner.contracts import Evaluation, Explanation, Limit, LinkUse
from moment.topology.devices import find_model, populate
from moment.topology.model import Kind, Topology

_SOCKET_KINDS = {"upi": "UPI", "qpi": "QPI", "xgmi": "xGMI"}
#: epoch times within this ratio are "as fast"
SAME = 1.005
#: limits spelled out per layout; the rest are counted
SHOWN = 3


@dataclass
class _Layout:
    name: str
    topo: Topology  # populated
    ev: Evaluation

    def __post_init__(self) -> None:
        p = self.ev.predicted
        self.inlet = dict(zip(p.gpus, p.per_gpu_inlet_gbps))
        self.util = {lu.id: lu.utilisation for lu in self.ev.links}
        self.gpus = list(p.gpus)

    def gpu_name(self, gpu: str) -> str:
        """A GPU by its slot (the same in every layout); an SXM module by its id."""
        parent = self.topo.node(gpu).parent
        return parent if parent and self.topo.node(parent).kind == Kind.slot else gpu

    def under(self, node: str) -> set[str]:
        out, stack = set(), [node]
        while stack:
            n = stack.pop()
            out.add(n)
            stack.extend(self.topo.children(n))
        return out

    def holds_ssd(self, nid: str) -> bool:
        if not self.topo.has(nid):
            return False
        n = self.topo.node(nid)
        return n.kind == Kind.ssd or (n.kind == Kind.slot and any(
            self.topo.node(k).kind == Kind.ssd for k in self.topo.children(nid)))


def _gpus_phrase(lay: _Layout, gpus: list[str]) -> str:
    names = ", ".join(lay.gpu_name(g) for g in gpus)
    if len(gpus) == len(lay.gpus) and len(gpus) > 4:
        return f"all {len(gpus)} GPUs"
    if len(gpus) == len(lay.gpus):
        return f"all {len(gpus)} GPUs ({names})" if len(gpus) > 1 else f"its GPU ({names})"
    return f"its GPU{'s' if len(gpus) > 1 else ''} in {names}"


def _gbps(lay: _Layout, gpus: list[str]) -> float | None:
    vals = [lay.inlet[g] for g in gpus if g in lay.inlet]
    return min(vals) if vals else None


def _tree_link(lay: _Layout, lu: LinkUse):
    """(child, parent, downstream?) when `lu` is a PCIe tree link, else None."""
    t = lay.topo
    if not (t.has(lu.src) and t.has(lu.dst)):
        return None
    if t.node(lu.dst).parent == lu.src:
        return lu.dst, lu.src, True
    if t.node(lu.src).parent == lu.dst:
        return lu.src, lu.dst, False
    return None


def _limits(lay: _Layout) -> list[tuple[str, Limit]]:
    """(signature, limit) for every saturated thing in a layout; the signature says what is 'the same'
    limit in another layout (SSD reads are one group whatever the SSDs are called)."""
    necks = [lu for lu in lay.ev.links if lu.bottleneck]
    out: list[tuple[str, Limit]] = []
    reads = [lu for lu in necks if lu.kind == "ssd" and lu.id.endswith(":read")]
    ssd_links = [lu for lu in necks if lu not in reads and (lay.holds_ssd(lu.src) or lay.holds_ssd(lu.dst))
                 and lu.kind == "pcie"]
    everyone = lay.gpus
    if reads:
        cap = max(lu.capacity_gbps for lu in reads)
        total = sum(1 for n in lay.topo.nodes if n.kind == Kind.ssd)
        out.append(("ssd-read", Limit(link=reads[0].id, kind="ssd-read", count=len(reads), capacity_gbps=cap,
                                      gpus=[lay.gpu_name(g) for g in everyone], gpu_gbps=_gbps(lay, everyone),
                                      text=f"{_count(len(reads), total)} SSDs are read at their limit "
                                           f"({cap:.2f} GB/s each)")))
    if ssd_links:
        cap = max(lu.capacity_gbps for lu in ssd_links)
        child = _tree_link(lay, ssd_links[0])
        what = lay.topo.node(child[0]).link.describe() if child and lay.topo.node(child[0]).link else "PCIe"
        out.append(("ssd-link", Limit(link=ssd_links[0].id, kind="ssd-link", count=len(ssd_links), capacity_gbps=cap,
                                      gpus=[lay.gpu_name(g) for g in everyone], gpu_gbps=_gbps(lay, everyone),
                                      text=f"the links of {len(ssd_links)} SSDs are full ({what}, "
                                           f"{cap:.2f} GB/s each)")))
    for lu in necks:
        if lu in reads or lu in ssd_links:
            continue
        out.append((lu.id, _one(lay, lu)))
    return out


def _count(n: int, total: int) -> str:
    return f"all {n}" if n == total else f"{n} of its {total}"


def _one(lay: _Layout, lu: LinkUse) -> Limit:
    t = lay.topo
    cap = lu.capacity_gbps
    tree = _tree_link(lay, lu)
    if lu.kind in _SOCKET_KINDS:
        gpus = [g for g in lay.gpus if t.socket_of(g) == lu.dst]
        text = (f"reads crossing from {lu.src} to {lu.dst} fill the {_SOCKET_KINDS[lu.kind]} link "
                f"{lu.src}→{lu.dst} ({cap:.1f} GB/s)")
    elif lu.kind == "memory":
        gpus = list(lay.gpus)
        text = f"CPU memory of {lu.dst} is read at its limit ({cap:.1f} GB/s)"
    elif tree is not None:
        child, parent, down = tree
        node = t.node(child)
        what = f"{node.link.describe()}, " if node.link else ""
        owner = {Kind.switch: f"switch {child}'s uplink", Kind.slot: f"slot {child}'s link"}.get(
            node.kind, "the link")
        inside = lay.under(child)
        if down:
            gpus = [g for g in lay.gpus if g in inside]
            text = f"read through {owner} {lu.src}→{lu.dst} ({what}{cap:.1f} GB/s)"
        else:
            gpus = [g for g in lay.gpus if g not in inside]
            ssds = sum(1 for n in inside if t.node(n).kind == Kind.ssd)
            src = f"the {ssds} SSD{'s' if ssds > 1 else ''} under {child}" if ssds else child
            text = f"reads from {src} leave through {owner} {lu.src}→{lu.dst} ({what}{cap:.1f} GB/s)"
    else:
        gpus = [lu.dst] if lu.dst in lay.inlet else list(lay.gpus)
        text = f"{lu.id} ({lu.kind}, {cap:.1f} GB/s) is saturated"
    gbps = _gbps(lay, gpus)
    if tree is not None and tree[2] and gpus:
        verb = "share" if len(gpus) > 1 else "reads through"
        text = f"{_gpus_phrase(lay, gpus)} {verb} " + text.removeprefix("read through ")
        text += f", which caps {'them' if len(gpus) > 1 else 'it'} at {gbps:.2f} GB/s{' each' if len(gpus) > 1 else ''}"
    elif gpus and gbps is not None:
        text += f", which caps {_gpus_phrase(lay, gpus)} at {gbps:.2f} GB/s{' each' if len(gpus) > 1 else ''}"
    return Limit(link=lu.id, kind=lu.kind, capacity_gbps=cap, gpus=[lay.gpu_name(g) for g in gpus],
                 gpu_gbps=gbps, text=text)


def _join(limits: list[Limit]) -> str:
    shown = "; ".join(lim.text for lim in limits[:SHOWN])
    more = len(limits) - SHOWN
    return shown + (f"; and {more} more saturated link{'s' if more > 1 else ''}" if more > 0 else "")


def _recommended(rec: _Layout) -> Explanation:
    limits = [lim for _, lim in _limits(rec)]
    p = rec.ev.predicted
    lo = min(p.per_gpu_inlet_gbps) if p.per_gpu_inlet_gbps else 0.0
    idle = sorted((lu for lu in rec.ev.links if not lu.bottleneck and lu.kind != "ssd"),
                  key=lambda lu: (-lu.utilisation, lu.id))
    head = f"the recommended layout reads an epoch in {p.epoch_read_s:.2f} s, every GPU getting ≥ {lo:.2f} GB/s"
    text = head + (f"; it is limited by: {_join(limits)}" if limits else "")
    if idle:
        text += f"; the busiest link that is not a limit is {idle[0].id} at {idle[0].utilisation:.0%}"
    return Explanation(layout="recommended", epoch_read_s=p.epoch_read_s, slower_by=1.0, limits=limits, text=text)


def _baseline(lay: _Layout, rec: _Layout, rec_sigs: set[str]) -> Explanation:
    t_b, t_r = lay.ev.predicted.epoch_read_s, rec.ev.predicted.epoch_read_s
    ratio = t_b / t_r if t_r > 0 else 1.0
    found = _limits(lay)
    new = [lim for sig, lim in found if sig not in rec_sigs]
    limits = new or [lim for _, lim in found]
    for lim in limits:
        if lim.kind not in ("ssd-read", "ssd-link"):
            lim.recommended_utilisation = rec.util.get(lim.link)
            u = lim.recommended_utilisation
            lim.text += (f" (in the recommended layout {lim.link} runs at {u:.0%})" if u is not None
                         else f" (in the recommended layout {lim.link} carries no reads)")
    if ratio < SAME:
        text = f"{lay.name} is as fast ({t_b:.2f} s)" + (f": limited the same way, {_join(limits)}" if limits else "")
    else:
        lo = min(lay.ev.predicted.per_gpu_inlet_gbps)
        lo_r = min(rec.ev.predicted.per_gpu_inlet_gbps)
        text = (f"{lay.name} is {ratio:.2f}× slower ({t_b:.2f} s vs {t_r:.2f} s, its slowest GPU gets "
                f"{lo:.2f} GB/s vs {lo_r:.2f}): " + (_join(limits) if limits else "no link is saturated"))
    return Explanation(layout=lay.name, epoch_read_s=t_b, slower_by=ratio, limits=limits, text=text)


def explain(bare: Topology, recommended: Evaluation, baselines: list[tuple[str, Evaluation]]) -> list[Explanation]:
    """The recommended layout's limits, then one explanation per baseline, in the order given."""
    rec = _Layout("recommended", populate(bare, recommended.placement, check=False), recommended)
    rec_sigs = {sig for sig, _ in _limits(rec)}
    out = [_recommended(rec)]
    for name, ev in baselines:
        out.append(_baseline(_Layout(name, populate(bare, ev.placement, check=False), ev), rec, rec_sigs))
    return out


def bottleneck_summary(plan, shown: int = SHOWN) -> str:
    """A plan's bottlenecks in a few words: SSD reads and SSD slot links counted, other links named
    (at most `shown`, then how many more)."""
    ssd_slots = {s for s, m in plan.placement.items() if find_model(m).kind == Kind.ssd}
    necks = [lu for lu in plan.links if lu.bottleneck]
    reads = [lu for lu in necks if lu.kind == "ssd"]
    slot_links = [lu for lu in necks if lu.kind != "ssd" and ({lu.src, lu.dst} & ssd_slots)]
    other = [lu.id for lu in necks if lu not in reads and lu not in slot_links]
    parts = []
    if reads:
        parts.append(f"{len(reads)} SSD read{'s' if len(reads) > 1 else ''} at the drive's limit")
    if slot_links:
        cap = max(lu.capacity_gbps for lu in slot_links)
        parts.append(f"{len(slot_links)} SSD slot link{'s' if len(slot_links) > 1 else ''} ({cap:.1f} GB/s)")
    parts += other[:shown]
    if len(other) > shown:
        parts.append(f"+{len(other) - shown} more link{'s' if len(other) - shown > 1 else ''}")
    return ", ".join(parts)
