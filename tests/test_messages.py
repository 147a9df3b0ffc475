"""Each refusal names its real cause (the missing file, the other kind of layout, the invalid
value, a binary file given as text), a missing torch is one line with the install command, and piped
tables are not wrapped at a fixed width."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from moment.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_a_split_without_its_cluster_json_says_so(split_layout, tmp_path, capsys):
    s = shutil.copytree(split_layout, tmp_path / "S")
    (s / "cluster.json").unlink()
    for argv in (["layout", "info", str(s)], ["layout", "verify", str(s)]):
        assert main(argv) == 2, argv
        err = _err(capsys)
        assert "no cluster.json" in err and "a split layout's top directory" in err, err
        assert "no manifest.json" not in err
        # its machines' layouts still train (each carries its part of the split): it said they could not
        assert f"each machine's layout ({s}/NAME) carries its part of the split and still trains" in err, err
        assert "cannot train" not in err


def test_a_directory_of_datasets_and_layouts_is_not_called_a_split(runtime_dataset, runtime_layout, tmp_path,
                                                                   capsys):
    """`moment layout rm data/` (a directory holding datasets and a whole layout) said it was a split's top
    directory without its cluster.json and hinted to write the split again."""
    shutil.copytree(runtime_layout, tmp_path / "L", symlinks=True)
    shutil.copytree(runtime_dataset.path, tmp_path / "D")
    for argv in (["layout", "rm", str(tmp_path)], ["layout", "info", str(tmp_path)]):
        assert main(argv) == 2, argv
        err = _err(capsys)
        assert "no manifest.json: not a complete layout" in err and "split" not in err, err
    assert (tmp_path / "L" / "manifest.json").is_file() and (tmp_path / "D" / "manifest.json").is_file()


def test_place_over_the_other_kind_of_layout_names_it(runtime_dataset, runtime_layout, split_layout, tmp_path,
                                                       capsys):
    whole = shutil.copytree(runtime_layout, tmp_path / "L", symlinks=True)
    assert main(["place", "--dataset", str(runtime_dataset.path), "--machines", "2", "--out", str(whole),
                 "--overwrite"]) == 2
    err = _err(capsys)
    assert "is one machine's layout, not a split layout" in err and "moment layout rm" in err, err
    assert "no manifest.json that Moment wrote" not in err
    split = shutil.copytree(split_layout, tmp_path / "S")
    assert main(["place", "--dataset", str(runtime_dataset.path), "--out", str(split), "--overwrite"]) == 2
    err = _err(capsys)
    assert "is a split layout, not one machine's layout" in err and "moment layout rm" in err, err
    assert (whole / "manifest.json").is_file() and (split / "cluster.json").is_file()


def test_layout_info_of_a_split_with_a_truncated_owners_file_fails(split_layout, tmp_path, capsys):
    s = shutil.copytree(split_layout, tmp_path / "S")
    owners = s / "owners.npy"
    owners.write_bytes(owners.read_bytes()[:100])
    assert main(["layout", "info", str(s)]) == 2
    err = _err(capsys)
    assert str(owners) in err and "truncated" in err, err


def test_doctor_names_an_invalid_device_and_the_choices(capsys):
    assert main(["doctor", "--device", "tpu"]) == 2
    err = _err(capsys)
    assert "--device tpu" in err and "cuda" in err and "cpu" in err, err


def test_importing_a_npy_or_torch_file_as_an_edge_list_names_the_importer(tmp_path, capsys):
    npy = tmp_path / "edge_index.npy"
    np.save(npy, np.array([[0, 1], [1, 2]]))
    assert main(["data", "import", "edgelist", str(npy), "--out", str(tmp_path / "d")]) == 2
    err = _err(capsys)
    assert "a NumPy .npy file" in err and "moment data import npy --edge-index" in err and "codec" not in err, err
    pt = tmp_path / "data.pt"
    pt.write_bytes(b"PK\x03\x04" + bytes(100))
    assert main(["data", "import", "edgelist", str(pt), "--out", str(tmp_path / "d")]) == 2
    err = _err(capsys)
    assert "zip archive" in err and "moment data import pyg" in err, err


NO_TORCH = """
import sys
sys.modules['torch'] = None  # `import torch` raises ModuleNotFoundError, as where torch is not installed
from moment.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_command_that_needs_torch_says_how_to_install_it(runtime_dataset, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for argv in (["place", "--dataset", str(runtime_dataset.path), "--out", str(tmp_path / "L")],
                 ["data", "presample", str(runtime_dataset.path), "--out", str(tmp_path / "h")]):
        r = subprocess.run([sys.executable, "-c", NO_TORCH, *argv], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 2, (argv, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        err = " ".join(r.stderr.split())
        assert "needs torch" in err and "make install-dev" in err and "torch==2.13.0" in err, err


def test_every_fanouts_help_says_the_same(capsys):
    from moment.workload.spec import FANOUTS_HELP

    from moment.runtime.config import build_parser

    for argv in (["place", "--help"], ["data", "presample", "--help"], ["cache", "simulate", "--help"],
                 ["data", "pack", "--help"], ["simulate", "--help"]):
        main(argv)
        out = re.sub(r"[\s│]+", " ", capsys.readouterr().out)
        assert FANOUTS_HELP.split(",")[0] in out, argv
    train = " ".join(build_parser().format_help().split())  # `python -m moment.train --help`
    assert "outermost last" not in train and FANOUTS_HELP.split(",")[0] in train


def test_piped_output_is_not_wrapped_at_a_fixed_width(tmp_path):
    code = "from moment.cli import console, err_console; print(console.width, err_console.width)"
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert all(int(w) > 1000 for w in r.stdout.split()), r.stdout
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env | {"COLUMNS": "150"},
                       timeout=60)
    assert r.stdout.split() == ["150", "150"], r.stdout


def test_the_install_hint_pins_the_makefiles_torch():
    from moment.errors import INSTALL_TRAIN

    pin = re.search(r"^TORCH_PIN := (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert pin in INSTALL_TRAIN and "make install-dev" in INSTALL_TRAIN


def test_the_readme_says_what_make_installs_and_places_on_ssds():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make install-dev" in quick and "torch" in quick
    example = quick.split("### Plan, place, train", 1)[1].split("```", 2)[1]
    page = (ROOT / "docs" / "placement.md").read_text()
    place = page.split("## Place a dataset", 1)[1].split("```", 2)[1]
    for block in (example, place):
        assert "moment place" in block and "--ssd-path ssd0=" in block
