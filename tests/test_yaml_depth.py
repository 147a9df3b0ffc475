"""YAML nested deeper than any real input is one error line naming the input, in every YAML reader
(the composer recurses per level: a 2 KB text used to end in RecursionError)."""

from __future__ import annotations

import contextlib
import io

import pytest

from moment.cli import main

DEEP = "nodes: " + "[" * 1000 + "]" * 1000


def run(*argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.mark.parametrize("argv", [
    ["plan", "--profile", "{f}"],
    ["plan", "--calibration", "{f}"],
    ["calibrate", "--profile", "paper-machine-b", "--measured", "{f}"],
    ["advise", "--profile", "paper-machine-b", "--budget", "50000", "--prices", "{f}"],
])
def test_deep_yaml_files_are_one_line(tmp_path, argv):
    f = tmp_path / "deep.yaml"
    f.write_text(DEEP)
    rc, err = run(*(a.format(f=f) for a in argv))
    assert rc == 2 and err.strip() == f"error: {f}: not valid YAML at line 1: nested more than 200 deep", err


def test_deep_set_value_is_one_line():
    rc, err = run("plan", "--set", "name=" + "[" * 1000 + "]" * 1000)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "nested more than 200 deep" in err, err


def test_nesting_up_to_the_limit_still_loads():
    from moment.errors import MomentError
    from moment.topology.limits import MAX_DEPTH
    from moment.topology.profiles import parse_yaml

    def nested(lists: int) -> str:  # a mapping holding `lists` nested lists
        return "a: " + "[" * lists + "1" + "]" * lists

    data = parse_yaml(nested(MAX_DEPTH - 1), "t")["a"]
    for _ in range(MAX_DEPTH - 1):
        data = data[0]
    assert data == 1
    with pytest.raises(MomentError, match=f"t: not valid YAML at line 1: nested more than {MAX_DEPTH} deep"):
        parse_yaml(nested(MAX_DEPTH), "t")
