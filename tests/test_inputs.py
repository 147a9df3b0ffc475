"""Inputs that used to be silently wrong are errors naming the input, and write nothing."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from moment.cli import main


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), " ".join(err.getvalue().split())


@pytest.mark.parametrize("argv", [["plan", "--inventory", ""], ["plan", "--inventory", "  "],
                                  ["compare", "paper-machine-b", "--inventory", ""]])
def test_empty_inventory_is_an_error(argv):
    rc, out, err = run(*argv)
    assert rc == 2 and "--inventory is empty" in err and "Traceback" not in err
    assert out == ""  # nothing was planned


@pytest.mark.parametrize(("extra", "needle"), [
    (["--train-fraction", "0"], "--train-fraction must be in (0, 1]"),
    (["--train-fraction", "-0.1"], "--train-fraction"),
    (["--avg-degree", "0"], "--avg-degree must be in (0, 10000]"),
])
def test_synth_refuses_graphs_training_cannot_use(tmp_path, extra, needle):
    rc, _, err = run("data", "synth", "--nodes", "1000", "--out", tmp_path / "ds", *extra)
    assert rc == 2 and needle in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "not dmidecode output"),
    (bytes(range(256)) * 8, "not dmidecode output"),
    (b"# dmidecode 3.4\nHandle 0x0000, DMI type 0, 24 bytes\nBIOS Information\n\tVendor: X\n", "no slots found"),
])
def test_scan_dmidecode_without_slots(tmp_path, content, needle):
    f = tmp_path / "dmi.txt"
    f.write_bytes(content)
    rc, _, err = run("scan", "--from-dmidecode", f, "--out", tmp_path / "m.yaml")
    assert rc == 2 and f"{f}: {needle}" in err and "Traceback" not in err
    assert not (tmp_path / "m.yaml").exists()


def test_scan_dmidecode_with_slots_still_works(tmp_path):
    f = tmp_path / "dmi.txt"
    f.write_text("# dmidecode 3.4\n\nHandle 0x0900, DMI type 9, 17 bytes\nSystem Slot Information\n"
                 "\tDesignation: PCIE3\n\tType: x16 PCI Express 4 x16\n\tCurrent Usage: Available\n")
    rc, _, err = run("scan", "--from-dmidecode", f, "--out", tmp_path / "m.yaml")
    assert rc == 0, err
    assert "slot" in Path(tmp_path / "m.yaml").read_text()
