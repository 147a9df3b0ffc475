"""`moment plan --diagram`: a picture a person reads at 100% zoom, for every built-in machine."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import pytest

from moment.planner.contracts import LinkUse
from moment.planner.diagram import MAX_WIDTH, plan_scene, scene, to_png, to_svg
from moment.planner.diagram.scene import Rect, Text
from moment.planner.diagram.style import MIN_FONT
from moment.planner.diagram.text import text_width
from moment.planner.plan import make_plan
from moment.topology.devices import Inventory, populate, strip
from moment.topology.model import Kind
from moment.topology.profiles import builtin_names, load_profile
from moment.workload.spec import WorkloadSpec


def _inventory(topo):
    """4 GPUs and 8 SSDs, or just the SSDs where the GPUs are built in (SXM modules stay after strip)."""
    return Inventory.simple(0 if strip(topo)[0].of_kind(Kind.gpu) else 4, 8, "A100-PCIe-40GB", "P5510")


@pytest.fixture(scope="module", params=builtin_names())
def planned(request):
    topo = load_profile(request.param)
    plan = make_plan(topo, _inventory(topo), WorkloadSpec())
    return topo, plan, plan_scene(topo, plan)


def _overlap(a, b, slack=0.5) -> bool:
    return a[0] < b[2] - slack and b[0] < a[2] - slack and a[1] < b[3] - slack and b[1] < a[3] - slack


def test_readable_size_and_legend(planned):
    _, _, sc = planned
    assert sc.width <= MAX_WIDTH
    texts = list(sc.items(Text))
    assert min(t.size for t in texts) >= MIN_FONT >= 12
    svg = to_svg(sc)
    ET.fromstring(svg)  # well-formed
    assert '<g id="legend"' in svg and "Legend" in svg
    sizes = [float(s) for s in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes and min(sizes) >= 12


def test_every_device_named_in_full_and_gpu_inlet_shown(planned):
    topo, plan, sc = planned
    texts = [t.text for t in sc.items(Text)]
    pop = populate(strip(topo)[0], plan.placement)
    for n in pop.nodes:
        if n.kind in (Kind.gpu, Kind.ssd, Kind.nic):
            name = f"{n.id}  {getattr(n, 'model', None) or n.label}"
            assert name in texts, name
    for gpu, gbps in zip(plan.predicted.gpus, plan.predicted.per_gpu_inlet_gbps):
        assert any(t.startswith(f"in {gbps:.2f} GB/s") for t in texts), gpu


def test_no_label_overprints_another_or_leaves_its_box(planned):
    _, _, sc = planned
    texts = list(sc.items(Text))
    rects = [r for r in sc.group("boxes").items if isinstance(r, Rect)]
    for a, b in itertools.combinations(texts, 2):
        assert not _overlap(a.bbox(), b.bbox()), (a.text, b.text)
    for t in texts:
        tb = t.bbox()
        for r in rects:
            rb = (r.x, r.y, r.x + r.w, r.y + r.h)
            inside = rb[0] <= tb[0] and tb[2] <= rb[2] and rb[1] <= tb[1] and tb[3] <= rb[3]
            assert inside or not _overlap(tb, rb), (t.text, r.cls)
        if t.owner is not None:  # a box's own text fits in it: nothing cut
            assert any(r.x <= tb[0] and tb[2] <= r.x + r.w and r.y <= tb[1] and tb[3] <= r.y + r.h for r in rects)


@pytest.mark.slow
def test_width_estimate_is_never_short_of_the_real_font(planned):
    matplotlib = pytest.importorskip("matplotlib")
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    del matplotlib
    seen = set()
    for t in planned[2].items(Text):
        if (t.text, t.bold) in seen:
            continue
        seen.add((t.text, t.bold))
        real = TextPath((0, 0), t.text, size=t.size,
                        prop=FontProperties(family="DejaVu Sans", weight="bold" if t.bold else "normal"))
        assert text_width(t.text, t.size, t.bold) >= real.get_extents().width, t.text


def test_bottlenecks_are_marked(planned):
    topo, plan, sc = planned
    svg = to_svg(sc)
    ssd_reads = [lu for lu in plan.links if lu.bottleneck and lu.kind == "ssd"]
    assert svg.count('class="box ssd limit"') == len(ssd_reads)
    tree_necks = [lu for lu in plan.links if lu.bottleneck and lu.kind == "pcie"]
    lines = [ln for ln in sc.items() if getattr(ln, "cls", "").startswith("link") and "bottleneck" in ln.cls]
    # a saturated PCIe link is drawn red with the class and a ⚠ label (both directions share one line,
    # and a card is drawn with its slot, so the card's link and the slot's are one line too)
    slot_of = {dev: slot for slot, dev in plan.devices.items()}

    def line_of(lu: LinkUse) -> frozenset:
        for end in (lu.src, lu.dst):
            if end in slot_of:
                return frozenset((slot_of[end], topo.node(slot_of[end]).parent))
        return frozenset((lu.src, lu.dst))

    assert len(lines) == len({line_of(lu) for lu in tree_necks}) or not tree_necks
    if tree_necks:
        assert any(t.text.startswith("⚠ ") and "100% of" in t.text for t in sc.items(Text))
    assert plan.bottlenecks  # every plan is limited by something, and the picture says what
    assert "limited by" in next(t.text for t in sc.items(Text) if t.cls == "subtitle")


@pytest.mark.slow
def test_png_is_drawn_at_the_scene_size(planned, tmp_path):
    _, _, sc = planned
    out = tmp_path / "p.png"
    to_png(sc, out)
    head = out.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert (w, h) == (round(sc.width), round(sc.height))


def test_nvlink_is_one_fabric_bar_not_a_line_per_link():
    topo = load_profile("hgx-a100-8gpu")
    plan = make_plan(topo, Inventory.simple(0, 8, "A100-PCIe-40GB", "P5510"), WorkloadSpec())
    sc = plan_scene(topo, plan)
    assert sum(1 for it in sc.items() if getattr(it, "cls", "") == "fabric") == 1
    assert sum(1 for it in sc.items() if getattr(it, "cls", "").startswith("link nvlink")) == 8  # one per GPU
    assert any(t.text == "NVLink fabric" for t in sc.items(Text))


def test_saturated_tree_link_gets_a_marker_on_a_hand_made_load():
    topo = populate(strip(load_profile("paper-machine-b"))[0], {"sw1-x16a": "A100-PCIe-40GB", "rc0-bay0": "P5510"})
    links = [LinkUse(id="sw0->sw1", src="sw0", dst="sw1", kind="pcie", capacity_gbps=27.1, load_gbps=27.1,
                     utilisation=1.0, bottleneck=True)]
    sc = scene(topo, links, "t", inlet={"gpu0": 7.97})
    svg = to_svg(sc)
    assert svg.count('class="link bottleneck"') == 1
    assert re.search(r'class="edge-label"[^>]*font-weight="bold"[^>]*>⚠ [^<]*100% of 27.1 GB/s<', svg)
    assert "in 7.97 GB/s" in svg


def test_direct_gpu_links_are_brackets_right_of_the_devices():
    topo = load_profile("paper-machine-b", ["links+={a: rc0-x16, b: rc1-x16a, kind: nvlink, count: 4}"])
    plan = make_plan(topo, Inventory.simple(2, 2, "A100-PCIe-40GB", "P5510"), WorkloadSpec())
    sc = plan_scene(topo, plan)
    peers = [ln for ln in sc.items() if getattr(ln, "cls", "").startswith("link peer")]
    right = max(r.x + r.w for r in sc.group("boxes").items if isinstance(r, Rect))
    assert {"rc0-x16", "rc1-x16a"} <= set(plan.placement)  # the bridged pair is worth taking
    assert len(peers) == 1 and not peers[0].dashed  # drawn once, loaded (solid)
    for ln in peers:
        assert min(x for x, _ in ln.pts) >= right - 0.5  # never across a box


def test_text_xml_cannot_hold_is_replaced_so_the_svg_stays_readable():
    """A machine named with a control character ("bad\\x01name", a profile's `name` or a request's) made
    `moment plan --diagram` write an SVG no reader opens, and the page show a broken image."""
    topo = load_profile("paper-machine-b")
    topo = topo.model_copy(update={"name": "bad\x01name\x00 <&> \ufffe\x1f\tend"})
    plan = make_plan(topo, Inventory.simple(2, 2, "A100-PCIe-40GB", "P5510"), WorkloadSpec())
    svg = to_svg(plan_scene(topo, plan))
    titles = [t.text for t in ET.fromstring(svg.encode()).iter("{http://www.w3.org/2000/svg}text")
              if t.text and t.text.startswith("bad")]
    assert titles and titles[0].startswith("bad\ufffdname\ufffd <&> \ufffd\ufffd\tend"), titles
