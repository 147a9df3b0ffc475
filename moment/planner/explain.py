"""Say in words why the recommended layout beats each usual layout, from the solved LPs.

Every layout's LP solution has saturated links or devices (utilisation >= 99.9%): they set its epoch
time. For a usual layout, the ones that are saturated there and not in the recommended layout are
why it is slower; each is named with its capacity, the GPUs whose reads cross it (by slot, which
means the same thing in every layout) and what those GPUs get, beside the same link's load in the
recommended layout. SSD reads and SSD slot links are counted as groups (one per SSD), not listed one
by one; a GPU fed by several full links is named once, with the tightest.
"""

from __future__ import annotations

from dataclasses import dataclass

from moment.planner.contracts import Evaluation, Explanation, Limit, LinkUse
from moment.topology.devices import populate
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

    def depth(self, node: str) -> int:
        """How many nodes lie above `node` (the socket is 0)."""
        n = 0
        while (node := self.topo.node(node).parent) is not None:
            n += 1
        return n

    def ssd_slot(self, nid: str) -> str | None:
        """The slot of the SSD that `nid` is or holds (an SSD outside a slot: itself), else None."""
        if not self.topo.has(nid):
            return None
        n = self.topo.node(nid)
        if n.kind == Kind.ssd:
            return n.parent if n.parent and self.topo.node(n.parent).kind == Kind.slot else nid
        holds = n.kind == Kind.slot and any(self.topo.node(k).kind == Kind.ssd for k in self.topo.children(nid))
        return nid if holds else None


def _gpus_phrase(lay: _Layout, gpus: list[str]) -> str:
    names = ", ".join(lay.gpu_name(g) for g in gpus)
    if len(gpus) == len(lay.gpus) and len(gpus) > 4:
        return f"all {len(gpus)} GPUs"
    if len(gpus) == len(lay.gpus):
        return {1: f"its GPU ({names})", 2: f"both GPUs ({names})"}.get(len(gpus), f"all {len(gpus)} GPUs ({names})")
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
    limit in another layout (SSD reads are one group whatever the SSDs are called). SSDs are counted
    once each, however many of their links are full (the SSD's own and its slot's); a GPU, or a set of
    GPUs, that several full links feed has one limit: the tightest of them (`_tightness`)."""
    necks = [lu for lu in lay.ev.links if lu.bottleneck]
    out: list[tuple[str, Limit]] = []
    reads = [lu for lu in necks if lu.kind == "ssd" and lu.id.endswith(":read")]
    ssd_links = [lu for lu in necks if lu not in reads and lu.kind == "pcie"
                 and (lay.ssd_slot(lu.src) or lay.ssd_slot(lu.dst))]
    everyone = lay.gpus
    total = sum(1 for n in lay.topo.nodes if n.kind == Kind.ssd)
    if reads:
        cap = max(lu.capacity_gbps for lu in reads)
        who, many = _ssds(len(reads), total)
        out.append(("ssd-read", Limit(link=reads[0].id, kind="ssd-read", count=len(reads), capacity_gbps=cap,
                                      gpus=[lay.gpu_name(g) for g in everyone], gpu_gbps=_gbps(lay, everyone),
                                      text=f"{who} {'are' if many else 'is'} read at {'their' if many else 'its'} "
                                           f"limit ({cap:.2f} GB/s{' each' if many else ''})")))
    if ssd_links:
        slots = {lay.ssd_slot(lu.src) or lay.ssd_slot(lu.dst) for lu in ssd_links}
        cap = max(lu.capacity_gbps for lu in ssd_links)
        child = _tree_link(lay, ssd_links[0])
        what = lay.topo.node(child[0]).link.describe() if child and lay.topo.node(child[0]).link else "PCIe"
        who, many = _ssds(len(slots), total)
        out.append(("ssd-link", Limit(link=ssd_links[0].id, kind="ssd-link", count=len(slots), capacity_gbps=cap,
                                      gpus=[lay.gpu_name(g) for g in everyone], gpu_gbps=_gbps(lay, everyone),
                                      text=f"the link{'s' if many else ''} of {who} {'are' if many else 'is'} full "
                                           f"({what}, {cap:.2f} GB/s{' each' if many else ''})")))
    fed: dict[tuple[str, ...], tuple[int, tuple[float, int]]] = {}  # GPUs -> (index in out, tightness)
    for lu in necks:
        if lu in reads or lu in ssd_links:
            continue
        lim, tree = _one(lay, lu), _tree_link(lay, lu)
        if tree is None or not tree[2] or not lim.gpus:
            out.append((lu.id, lim))
            continue
        key, tight = tuple(lim.gpus), _tightness(lay, lu, tree[0])
        if key not in fed:
            fed[key] = (len(out), tight)
            out.append((lu.id, lim))
        elif tight < fed[key][1]:
            fed[key] = (fed[key][0], tight)
            out[fed[key][0]] = (lu.id, lim)
    return out


def _tightness(lay: _Layout, lu: LinkUse, child: str) -> tuple[float, int, int]:
    """Order of the full links that feed the same GPUs: the narrowest first, then the one nearest the
    GPUs (the switch they share rather than the one above it), a card's own link after its slot's."""
    depth = lay.depth(child)
    card = child in lay.gpus
    return round(lu.capacity_gbps, 6), -(depth - card), depth


def _ssds(n: int, total: int) -> tuple[str, bool]:
    """`n` of a layout's `total` SSDs in words, and whether the words are plural."""
    if n == total:
        return ("the only SSD", False) if n == 1 else (f"all {n} SSDs", True)
    return f"{n} of its {total} SSDs", n > 1


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
        if len(gpus) == 1 and gbps > cap:  # what a GPU gets counts its own cache's hits (contracts.INLET_HELP)
            text += ", its own cache's hits included"
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
    # a baseline's limit is 'the same' as one of the recommended layout's, or as any link full there
    rec_sigs = {sig for sig, _ in _limits(rec)} | {lu.id for lu in rec.ev.links if lu.bottleneck}
    out = [_recommended(rec)]
    for name, ev in baselines:
        out.append(_baseline(_Layout(name, populate(bare, ev.placement, check=False), ev), rec, rec_sigs))
    return out


def bottleneck_summary(plan, shown: int = SHOWN) -> str:
    """A plan's bottlenecks in a few words, from its recommended layout's limits (`explain`): SSD
    reads and SSD slots counted, other links named (at most `shown`, then how many more)."""
    limits = plan.explanation[0].limits if plan.explanation else []
    parts, other = [], []
    for lim in limits:
        many = lim.count > 1
        if lim.kind == "ssd-read":
            parts.append(f"{lim.count} SSD read{'s' if many else ''} at the drive's limit")
        elif lim.kind == "ssd-link":
            parts.append(f"{lim.count} SSD slot{'s' if many else ''}' links ({lim.capacity_gbps:.1f} GB/s)"
                         if many else f"1 SSD slot's link ({lim.capacity_gbps:.1f} GB/s)")
        else:
            other.append(lim.link)
    parts += other[:shown]
    if len(other) > shown:
        parts.append(f"+{len(other) - shown} more link{'s' if len(other) - shown > 1 else ''}")
    return ", ".join(parts)
