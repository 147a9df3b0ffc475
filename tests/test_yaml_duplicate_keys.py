"""A key given twice in one mapping is refused in every YAML input, naming the file, the line and the
key (PyYAML keeps the last one without a word: `link: {gen: 4, gen: 3}` planned a PCIe 3.0 slot, a
second `nodes:` block dropped the first one's slots)."""

from __future__ import annotations

import contextlib
import io

import pytest

from moment.cli import main

PROFILE = """\
name: dup
nodes:
  - {id: cpu0, kind: socket, memory_gib: 256, memory_bandwidth_gbps: 150}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: slot1, kind: slot, parent: rc0, width: 16, link: {gen: 4, width: 16, gen: 3}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
"""
TWO_BLOCKS = "measurements: []\nmachine: paper-machine-a\nmeasurements:\n  - {layout: paper-a, epoch_s: 15.9}\n"


def run(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


def test_a_profile_key_given_twice_names_its_line(tmp_path):
    f = tmp_path / "dup.yaml"
    f.write_text(PROFILE)
    rc, err = run("plan", "--profile", f, "--gpus", "1", "--ssds", "1")
    assert rc == 2 and err.strip() == f"error: {f}: line 5: key 'gen' appears twice", err


@pytest.mark.parametrize("argv", [
    ["plan", "--profile", "{f}"],
    ["plan", "--calibration", "{f}"],
    ["calibrate", "--profile", "paper-machine-b", "--measured", "{f}"],
    ["advise", "--profile", "paper-machine-b", "--budget", "50000", "--prices", "{f}"],
    ["plan", "--cluster", "{f}"],
])
def test_every_yaml_input_refuses_a_block_given_twice(tmp_path, argv):
    f = tmp_path / "two.yaml"
    f.write_text(TWO_BLOCKS)
    rc, err = run(*(a.format(f=f) for a in argv))
    assert rc == 2 and err.strip() == f"error: {f}: line 3: key 'measurements' appears twice (first at line 1)", err


def test_a_set_value_with_a_key_twice_is_refused():
    rc, err = run("plan", "--set", "links+={a: cpu0, b: cpu1, kind: upi, kind: qpi}")
    assert rc == 2 and "the value: line 1: key 'kind' appears twice" in err and len(err.strip().splitlines()) == 1


def test_merge_keys_and_the_same_key_in_two_mappings_still_load():
    from moment.topology.profiles import parse_yaml

    assert parse_yaml("base: &b {gen: 4, width: 4}\nslot: {<<: *b, gen: 3}\n", "t")["slot"] == {"gen": 3, "width": 4}
    assert parse_yaml("a: 1\nb: {a: 2}\n", "t") == {"a": 1, "b": {"a": 2}}
