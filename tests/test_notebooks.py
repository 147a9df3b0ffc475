"""The notebooks in notebooks/ run as committed and show what their text says.

Each notebook is executed top to bottom with nbclient in a fresh ipykernel of this interpreter (a
kernelspec written for the test, so no installed Jupyter configuration is used), in an empty working
directory that must stay empty. A probe cell appended after the last cell prints the notebook's key
results as JSON, and the test checks them against the claims the markdown makes. In git the notebooks
carry no outputs (`python notebooks/strip.py` strips them); that is checked without any Jupyter package.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
NAMES = ("01_plan_a_machine.ipynb", "02_place_a_dataset.ipynb", "03_an_epoch.ipynb")
KERNEL = "moment-notebook-test"
CELL_TIMEOUT_S = 180


def _strip_module():
    spec = importlib.util.spec_from_file_location("notebook_strip", NOTEBOOKS / "strip.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- stripped in git ----------------------------------------------------------------------------------
def test_notebooks_are_committed_without_outputs():
    files = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert {p.name for p in files} >= set(NAMES), f"missing notebooks in {NOTEBOOKS}"
    strip = _strip_module()
    for p in files:
        text = p.read_text(encoding="utf-8")
        nb = json.loads(text)
        assert nb["nbformat"] == 4, p.name
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, \
                    f"{p.name} cell {i} has outputs: run `python notebooks/strip.py`"
            assert "execution" not in cell.get("metadata", {}), f"{p.name} cell {i} has run metadata"
        assert strip.dumps(strip.stripped(json.loads(text))) == text, \
            f"{p.name} is not in stripped form: run `python notebooks/strip.py`"


def test_strip_script_strips_and_checks(tmp_path, capsys):
    strip = _strip_module()
    nb = {"cells": [
        {"cell_type": "markdown", "id": "a", "metadata": {}, "source": ["# hi"]},
        {"cell_type": "code", "id": "b", "execution_count": 3,
         "metadata": {"execution": {"iopub.status.idle": "2026-01-01T00:00:00Z"}, "tags": ["keep"]},
         "outputs": [{"name": "stdout", "output_type": "stream", "text": ["1\n"]}], "source": ["print(1)"]},
    ], "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    assert strip.main(["--check", str(path)]) == 1
    assert "not stripped" in capsys.readouterr().out
    assert json.loads(path.read_text()) == nb  # --check changes nothing
    assert strip.main([str(path)]) == 0
    cell = json.loads(path.read_text())["cells"][1]
    assert cell["outputs"] == [] and cell["execution_count"] is None
    assert cell["metadata"] == {"tags": ["keep"]} and cell["source"] == ["print(1)"]
    assert strip.main(["--check", str(path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["x.ipynb"]  # no temporary file left behind


# ---- executed -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernelspec that runs ipykernel in this interpreter, with the checkout on the path."""
    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the notebooks are executed with the dev extra "
                    f"(pip install -e '.[dev]' or make install-dev)")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "data" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",  # inline figures even if MPLBACKEND=Agg
        "IPYTHONDIR": str(root / "ipython"),  # no user profile or startup files
    }
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "moment notebook tests", "language": "python", "env": env}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root / "data"))
    mp.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
    yield KERNEL
    mp.undo()


def execute(name: str, kernel: str, cwd: Path, probe: str) -> tuple[dict, dict]:
    """Run notebook `name` plus a probe cell printing one JSON line; returns (notebook, probe's JSON).
    A failing cell raises nbclient's CellExecutionError with the cell's source and traceback."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    n = len(nb.cells)
    nb.cells.append(nbformat.v4.new_code_cell("import json as _json\nprint(_json.dumps(" + probe + "))"))
    NotebookClient(nb, kernel_name=kernel, timeout=CELL_TIMEOUT_S, shutdown_kernel="immediate",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    for i, cell in enumerate(nb.cells[:n]):
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", f"{name} cell {i}: {out.get('ename')}: {out.get('evalue')}"
            assert not (out["output_type"] == "stream" and out["name"] == "stderr"), \
                f"{name} cell {i} wrote to stderr: {out['text'][:500]}"
    stdout = "".join(o["text"] for o in nb.cells[-1].outputs if o["output_type"] == "stream")
    assert list(cwd.iterdir()) == [], f"{name} wrote into its working directory: {list(cwd.iterdir())}"
    return nb, json.loads(stdout.strip().splitlines()[-1])


def outputs_of(nb, mime: str) -> int:
    return sum(mime in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def _faster_or_tie(times: dict[str, float]) -> None:
    rec = times["recommended"]
    assert math.isfinite(rec) and rec > 0
    for name, t in times.items():
        assert rec <= t * (1 + 1e-6), f"baseline {name} ({t:.3f} s) beats the recommended layout ({rec:.3f} s)"


@pytest.mark.slow
def test_plan_a_machine(kernel, tmp_path):
    nb, r = execute(NAMES[0], kernel, tmp_path, """{
        "base": {"recommended": plan.predicted.epoch_read_s} | {b.name: b.predicted.epoch_read_s for b in plan.baselines},
        "whatif": {"recommended": plan_slow.predicted.epoch_read_s} | {b.name: b.predicted.epoch_read_s for b in plan_slow.baselines},
        "upgrade": {k: v.epoch_read_s for k, v in fast.items()},
        "per_gpu": plan.predicted.per_gpu_inlet_gbps, "bottlenecks": plan.bottlenecks,
        "sockets": sockets_used(machine_slow, plan_slow.placement), "overrides": plan_slow.overrides}""")
    base, whatif, upgrade = r["base"], r["whatif"], r["upgrade"]
    for times in (base, whatif, upgrade):
        _faster_or_tie(times)
    assert len(base) >= 5 and len(r["per_gpu"]) == 4 and min(r["per_gpu"]) > 0
    # what the markdown says about these results
    assert r["bottlenecks"] and all(b.endswith(":read") for b in r["bottlenecks"]), \
        f"the text says only the SSDs limit the recommended layout: {r['bottlenecks']}"
    for front in ("paper-a", "paper-b"):  # "about twice as slow"
        assert base[front] > 1.8 * base["recommended"], front
    for packed in ("paper-d", "gpus-packed/ssds-spread"):  # "about 1.5 times as slow"
        assert 1.3 * base["recommended"] < base[packed] < 1.7 * base["recommended"], packed
    assert base["paper-moment"] == pytest.approx(base["recommended"], rel=1e-6)
    assert r["overrides"] == ["links.0.bandwidth_gbps=5"]
    assert r["sockets"] == {"cpu0": 12}, "the text says the what-if puts every card on socket 0"
    assert whatif["recommended"] == pytest.approx(base["recommended"], rel=1e-3)
    assert whatif["paper-moment"] > 2 * base["paper-moment"]
    assert upgrade["recommended"] == pytest.approx(base["recommended"], rel=1e-3)
    assert upgrade["paper-b"] < 0.6 * base["paper-b"]  # "up to twice as fast"
    assert upgrade["gpus-packed/ssds-spread"] < 0.8 * base["gpus-packed/ssds-spread"]
    assert outputs_of(nb, "image/svg+xml") == 2 and outputs_of(nb, "image/png") == 2
    assert outputs_of(nb, "text/html") >= 1  # the side-by-side table


@pytest.mark.slow
def test_place_a_dataset(kernel, tmp_path):
    nb, r = execute(NAMES[1], kernel, tmp_path, """{
        "policies": {k: {"mean": v["mean_rel_error"], "bins": v["bins"]} for k, v in res.policies.items()},
        "layout": res.layout, "root": str(root), "root_exists": root.exists(), "curve": hot.curve(11)}""")
    pols = r["policies"]
    assert set(pols) == {"ddak", "hash", "degree"}
    for name, pol in pols.items():
        assert len(pol["bins"]) == 14  # 4 GPU caches, 2 CPU caches, 8 SSDs
        assert sum(b["achieved_share"] for b in pol["bins"]) == pytest.approx(1.0, abs=1e-6), name
        assert sum(b["target_share"] for b in pol["bins"]) == pytest.approx(1.0, abs=1e-6), name
        assert all(b["achieved_share"] >= 0 for b in pol["bins"])
    assert pols["ddak"]["mean"] <= min(p["mean"] for p in pols.values()), "the text says DDAK is closest"
    assert max(b["rel_error"] or 0 for b in pols["ddak"]["bins"]) < 0.01
    ssd = sum(b["achieved_share"] for b in pols["ddak"]["bins"] if b["kind"] == "ssd")
    assert 0.3 < ssd < 0.8, f"notebook 03 says about half of the reads go to the SSDs ({ssd:.2f})"
    ys = [y for _, y in r["curve"]]
    assert ys == sorted(ys) and ys[0] == 0 and ys[-1] == pytest.approx(1.0)
    assert ys[1] > 0.1 * 1.5, "the hotness curve should be visibly skewed (top 10% of nodes)"
    assert r["layout"].startswith(r["root"]) and not r["root_exists"], "writes only into its temp dir, removed"
    assert outputs_of(nb, "image/png") == 2


@pytest.mark.slow
def test_an_epoch(kernel, tmp_path):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch not installed: notebook 03 trains (pip install -e '.[train]' with torch==2.13.0)")
    nb, r = execute(NAMES[2], kernel, tmp_path, """{
        "m": {k: metrics[k] for k in ("stage_seconds", "pipeline_wall_s", "limiting_stage", "tier_rows",
              "memory_hit_rate", "cpu_hit_rate", "ssd_bytes_read", "val_accuracy", "num_classes", "steps")},
        "planned_memory": planned_memory, "root_exists": root.exists()}""")
    m = r["m"]
    st = m["stage_seconds"]
    assert set(st) == {"sample", "gather_submit", "gather_wait", "train", "exchange", "exchange_wait"}
    assert all(v >= 0 for v in st.values()) and st["train"] > 0 and m["pipeline_wall_s"] > 0
    assert m["limiting_stage"] == "train", "the text says training on the CPU is the slowest stage"
    assert m["pipeline_wall_s"] >= st["train"]
    assert m["steps"] == 2 * 16  # 4,000 seeds in batches of 256, two epochs
    rows = m["tier_rows"]
    assert set(rows) == {"gpu", "peer", "remote", "cpu", "ssd"} and rows["peer"] == rows["remote"] == 0, \
        "the text says one rank has neither peers nor other machines"
    rows.pop("peer")
    rows.pop("remote")
    assert min(rows.values()) > 0 and m["ssd_bytes_read"] > 0
    assert 0 < m["memory_hit_rate"] < 1 and 0 < m["cpu_hit_rate"] < 1
    assert m["memory_hit_rate"] == pytest.approx((rows["gpu"] + rows["cpu"]) / sum(rows.values()))
    assert abs(m["memory_hit_rate"] - r["planned_memory"]) < 0.1, "the text says measured is close to planned"
    assert m["val_accuracy"] > 1 / m["num_classes"] + 0.2, "the text says the model learns"
    assert not r["root_exists"]
    assert outputs_of(nb, "image/png") == 1

