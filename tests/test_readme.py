"""The README runs as written: its files are written and its commands run, in order,
in a fresh directory.

Conventions for README code blocks:
- ```yaml file=NAME (any language with `file=NAME`): written to NAME before any command runs;
- ```bash or an unlabelled block: every command runs (a trailing backslash continues a line) and must
  exit 0; a line may start processes in the background and wait for them (`A & B && wait $!`: two training
  agents on 127.0.0.1);
- any other language (```text, ```console, ```json without file=): shown, not run.
Skipped, with the reason reported: `make` lines (they build a virtual environment: `make test` runs
this test), `source .venv/bin/activate` (checked instead: it names the environment `make` built and this
test runs in), training lines when torch is not installed, `moment doctor --gpu` where CUDA exists
(there it runs the GPU checks, for minutes; tests/test_gpucheck.py runs them on CPU), and a whole block
when a tool it calls (lstopo, lspci, dmidecode, nvidia-smi, sudo) is not on this machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_FENCE = re.compile(r"^```\s*(?P<lang>[\w+-]*)(?P<attrs>.*)$")
_OPERATORS = {"&&", "||", "|", ";", "&", "(", ")"}
#: bash builtins a README line may use (two agents started in one line: `A & B && wait $!`): not programs to find
_BUILTINS = {"wait", "cd", "export", "set", "true"}
_TORCH_LINE = re.compile(r"\btorchrun\b|\bmoment train\b|\bmoment\.train\b")
_DOCTOR_LINE = re.compile(r"\bmoment doctor\b.*--gpu")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class Block:
    lang: str
    attrs: dict[str, str]
    lines: list[str]
    line_no: int
    commands: list[str] = field(default_factory=list)


def parse_blocks(text: str) -> list[Block]:
    blocks, cur = [], None
    for no, line in enumerate(text.splitlines(), start=1):
        if cur is None:
            m = _FENCE.match(line)
            if m:
                attrs = dict(a.split("=", 1) for a in m.group("attrs").split() if "=" in a)
                cur = Block(m.group("lang").lower(), attrs, [], no)
        elif line.startswith("```"):
            blocks.append(cur)
            cur = None
        else:
            cur.lines.append(line)
    assert cur is None, f"README.md:{cur.line_no}: code block never closed"
    for b in blocks:
        if b.lang in ("", "bash", "sh", "shell") and "file" not in b.attrs:
            b.commands = _commands(b.lines)
    return blocks


def _commands(lines: list[str]) -> list[str]:
    out, cur = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        if cur.strip() and not cur.strip().startswith("#"):
            out.append(cur.strip())
        cur = ""
    return out


def programs(command: str) -> list[str]:
    """The programs a command line runs: the first word of each simple command (env assignments skipped)."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.commenters = "#"
    words, first = [], True
    for tok in lex:
        if tok in _OPERATORS or tok in (">", ">>", "<", "2>"):
            first = tok in _OPERATORS
            continue
        if first and re.fullmatch(r"[A-Za-z_]\w*=.*", tok):
            continue
        if first:
            words.append(tok)
            first = False
    return words


def _shims(bin_dir: Path) -> None:
    """`moment` and `torchrun` from this interpreter, so the README runs against this checkout."""
    bin_dir.mkdir()
    for name, module in (("moment", "moment"), ("torchrun", "torch.distributed.run")):
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m {module} "$@"\n')
        p.chmod(0o755)


def _check_activation(cmd: str, line_no: int) -> None:
    """`source .venv/bin/activate` must name the environment the Makefile builds, and when this test
    runs from that environment (as under `make test`), its activate script must exist."""
    script = Path(shlex.split(cmd, comments=True)[1])
    venv = re.search(r"^VENV\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert script == Path(venv) / "bin" / "activate", f"README.md:{line_no}: {cmd!r} is not {venv}/bin/activate"
    if Path(sys.prefix).resolve() == (REPO / venv).resolve():
        assert (REPO / script).is_file(), f"README.md:{line_no}: {REPO / script} does not exist"


def test_readme_blocks_are_labelled_and_parse():
    blocks = parse_blocks(README.read_text())
    assert any(b.attrs.get("file") for b in blocks), "the README's profile example names its file"
    assert sum(len(b.commands) for b in blocks) >= 20
    assert programs("A=1 lspci -tv > x.txt && sudo dmidecode -t slot | head; moment scan # c") == \
        ["lspci", "sudo", "head", "moment"]


@pytest.mark.slow
def test_readme_runs_as_written(tmp_path):
    blocks = parse_blocks(README.read_text())
    work = tmp_path / "work"
    work.mkdir()
    _shims(tmp_path / "bin")
    env = dict(os.environ)
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["COLUMNS"] = "120"
    for b in blocks:  # files first: commands may refer to a file shown further down
        if "file" in b.attrs:
            (work / b.attrs["file"]).write_text("\n".join(b.lines) + "\n")

    has_torch = all(importlib.util.find_spec(m) is not None for m in ("torch", "torch_geometric"))
    has_cuda = has_torch and _cuda_available()
    skipped, ran, outputs = [], 0, []
    for b in blocks:
        if not b.commands:
            continue
        progs = {p for c in b.commands for p in programs(c)} - {"make"} - _BUILTINS
        missing = sorted(p for p in progs if shutil.which(p, path=env["PATH"]) is None)
        if "sudo" in progs and os.geteuid() != 0:
            missing.append("sudo (needs a password)")
        if missing:
            skipped.append(f"README.md:{b.line_no}: block needs {', '.join(missing)}")
            continue
        for cmd in b.commands:
            if programs(cmd)[:1] == ["make"]:
                skipped.append(f"README.md:{b.line_no}: {cmd!r} (builds a virtual environment)")
                continue
            if programs(cmd)[:1] in (["source"], ["."]):
                _check_activation(cmd, b.line_no)
                skipped.append(f"README.md:{b.line_no}: {cmd!r} (activates the environment this test runs in)")
                continue
            if _DOCTOR_LINE.search(cmd) and has_cuda:
                skipped.append(f"README.md:{b.line_no}: {cmd!r} (CUDA exists: the GPU checks take minutes)")
                continue
            if _TORCH_LINE.search(cmd) and not has_torch:
                skipped.append(f"README.md:{b.line_no}: {cmd!r} (torch is not installed)")
                continue
            r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + cmd], cwd=work, env=env, text=True,
                               capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
            assert r.returncode == 0, (f"README.md:{b.line_no}: {cmd}\nexit {r.returncode}\n"
                                       f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            outputs.append(r.stdout + r.stderr)
            ran += 1
    if skipped:
        warnings.warn("README lines not run here: " + "; ".join(skipped), stacklevel=1)
    assert ran >= 15, skipped

    # the example exercises every tier, the SSDs included
    text = " ".join(" ".join(outputs).split())
    assert "training will read nothing from the SSDs" not in text
    assert "nothing will be read from the SSDs" not in text
    if (work / "m.json").is_file():
        assert json.loads((work / "m.json").read_text())["ssd_bytes_read"] > 0
    elif has_torch:
        pytest.fail("the README's training example wrote no m.json")
