"""Card 6 of the planning page in Chromium: several servers of the chosen machine, each server's
placement with its NICs, and the network's share of the epoch, as `POST /v1/plan/cluster` answers it;
a bad count is said under its field. Same browser set-up (and skips) as test_web_page.py."""

from __future__ import annotations

import pytest

from tests.test_web_page import Page, _post, browser, service  # noqa: F401 - fixtures

CLUSTER = {"name": "2 x paper-machine-b",
           "servers": [{"name": "server", "profile": "paper-machine-b", "inventory": "4xA100-PCIe-40GB,8xP5510",
                        "nics": 1, "count": 2}],
           "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}}


def _rows(p: Page, sel: str) -> list[list[str]]:
    return p.js("return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
                ".map((tr) => [...tr.cells].map((td) => td.innerText.trim()))", sel)


@pytest.mark.slow
def test_a_person_plans_two_servers_and_sees_the_network_share(service, browser):  # noqa: F811
    p = Page(browser, service)
    browser.get(service)
    p.wait(lambda: p.js("return document.body.dataset.ready") == "1", "the page to load the machines and models")
    p.wait(lambda: "slots to fill" in p.text("#machine-desc"), "the machine's description")
    assert p.css("#cl-nic").get_attribute("value") == "CX6-Dx-100GbE"
    p.click_and_wait("#cluster-btn", lambda: p.shown("[data-testid=cluster-machine]"), "the cluster plan")
    want = _post(service + "v1/plan/cluster", {"cluster": CLUSTER})
    assert p.text("#cluster-out [data-kpi=cl-epoch] .kpi-val") == f"{want['epoch_s']:.2f} s"
    assert p.text("#cluster-out [data-kpi=cl-network] .kpi-val") == f"{round(want['network_share'] * 100)}%"
    assert p.text("#cluster-out [data-kpi=cl-gdr] .kpi-val") == str(sum(m["gdr_paths"] for m in want["machines"]))
    machines = p.all("[data-testid=cluster-machine]")
    assert [m.get_attribute("data-name") for m in machines] == ["server0", "server1"]
    for m in want["machines"]:
        sel = f"[data-testid=cluster-machine][data-name={m['name']}]"
        assert p.text(sel + " .machine-head") == (f"{m['name']}: epoch {m['epoch_s']:.2f} s, "
                                       f"network {round(m['network_share'] * 100)}%")
        rows = _rows(p, sel + " [data-testid=cluster-placement]")
        assert sorted(r[:3] for r in rows) == sorted([d, s, m["placement"][s]] for s, d in m["devices"].items())
        nic = m["nics"][0]
        assert [r for r in rows if r[0] == nic["nic"]] == [[nic["nic"], nic["slot"], "CX6-Dx-100GbE", ""]]
        assert {r[0]: r[3] for r in rows if r[0].startswith("gpu")} == m["gpu_paths"]
        assert p.text(sel + " [data-testid=nics]") == (
            f"{nic['nic']} in {nic['slot']}: {nic['rate_gbps']:.1f} GB/s, serves {', '.join(nic['gpus'])}; "
            f"GPUDirect RDMA: {', '.join(nic['gdr_gpus']) or 'none'}")
        # the bar: local reads, remote features, all-reduce, each its share of the machine's epoch
        widths = p.js("return [...document.querySelectorAll(arguments[0] + ' [data-testid=epoch-split] span')]"
                      ".map((s) => s.getBoundingClientRect().width)", sel)
        total = p.js("return document.querySelector(arguments[0] + ' [data-testid=epoch-split]')"
                     ".getBoundingClientRect().width", sel)
        for w, part in zip(widths, ("read_s", "remote_feature_s", "allreduce_s")):
            assert abs(w - total * m[part] / m["epoch_s"]) <= 1.5, (part, w, total)
    p.snapshot("cluster")

    # a count the service refuses is said under its field, and the last plan is marked not updated
    p.type("#cl-servers", "0")
    p.click_and_wait("#cluster-btn", lambda: p.shown("#cluster-card .field-error"), "the servers error")
    assert p.text("#cluster-card .field-error") == ("0 is out of range: from 1 to 512 machines (the largest single "
                                                   "switch's ports)")
    assert p.js("return document.querySelector('#cluster-card .field-error').closest('label').innerText")\
        .startswith("Servers") and p.css("#cl-servers").get_attribute("aria-invalid") == "true"
    assert "Not updated: the last cluster plan failed" in p.text("#cluster-out [data-testid=stale]")
    # NICs that do not fit: the planner's reason, under the NICs field
    p.type("#cl-servers", "2")
    p.type("#cl-nics", "9")
    p.click_and_wait("#cluster-btn", lambda: p.shown("#cluster-card .field-error"), "the NICs error")
    said = p.text("#cluster-card .field-error")
    assert said.startswith("9 x CX6-Dx-100GbE do not fit"), said
    assert p.css("#cl-nics").get_attribute("aria-invalid") == "true"
    p.snapshot("cluster-error")
