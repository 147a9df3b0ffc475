"""The README and every page of docs/ run as written: each file's blocks are written and its commands run,
in order, in a fresh directory of its own (a page that needs a dataset or a layout builds a small one first).

Conventions for code blocks:
- ```yaml file=NAME (any language with `file=NAME`): written to NAME before any command of its page runs;
- ```bash or an unlabelled block: every command runs (a trailing backslash continues a line) and must
  exit 0; a line may start processes in the background and wait for them (`A & B && wait $!`: two training
  agents on 127.0.0.1); `moment`, `torchrun` and `python` are this interpreter's;
- any other language (```text, ```console, ```json or ```python without file=): shown, not run.
Skipped, with the reason reported: `make` lines (they build a virtual environment: `make test` runs
this test), `source .venv/bin/activate` (checked instead: it names the environment `make` built and this
test runs in), training lines when torch is not installed, `moment doctor --gpu` where CUDA exists
(there it runs the GPU checks, for minutes; tests/test_gpucheck.py runs them on CPU), and a whole block
when a tool it calls (lstopo, lspci, dmidecode, nvidia-smi, sudo) is not on this machine.
A `moment data synth ... --out DIR` line writes DIR and nothing else, the same files for the same line: it runs
once per session, and each page that gives that line gets a copy of what it wrote (four pages build the same
100k-node dataset).

Every relative link of these files must name a file of the repository.
"""

from __future__ import annotations

import hashlib
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
from conftest import shared_dir

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
_FENCE = re.compile(r"^```\s*(?P<lang>[\w+-]*)(?P<attrs>.*)$")
_OPERATORS = {"&&", "||", "|", ";", "&", "(", ")"}
#: bash builtins a README line may use (two agents started in one line: `A & B && wait $!`): not programs to find
_BUILTINS = {"wait", "cd", "export", "set", "true", "source", "."}
_TORCH_LINE = re.compile(r"\btorchrun\b|\bmoment train\b|\bmoment\.train\b")
_DOCTOR_LINE = re.compile(r"\bmoment doctor\b.*--gpu")
#: a line whose only effect is the directory it names, the same for the same line (seeded): run once per session
_SYNTH_LINE = re.compile(r"moment data synth [^;&|<>()]*--out (?P<out>[\w./-]+)")


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


def parse_blocks(text: str, name: str = "README.md") -> list[Block]:
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
    assert cur is None, f"{name}:{cur.line_no}: code block never closed"
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
    """`moment`, `torchrun` and `python` from this interpreter, so the pages run against this checkout."""
    bin_dir.mkdir()
    for name, module in (("moment", "moment"), ("torchrun", "torch.distributed.run"), ("python", None)):
        p = bin_dir / name
        run = f"-m {module} " if module else ""
        p.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {run}"$@"\n')
        p.chmod(0o755)


def _check_activation(cmd: str, where: str) -> None:
    """`source .venv/bin/activate` must name the environment the Makefile builds, and when this test
    runs from that environment (as under `make test`), its activate script must exist."""
    script = Path(shlex.split(cmd, comments=True)[1])
    venv = re.search(r"^VENV\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    assert script == Path(venv) / "bin" / "activate", f"{where}: {cmd!r} is not {venv}/bin/activate"
    if Path(sys.prefix).resolve() == (REPO / venv).resolve():
        assert (REPO / script).is_file(), f"{where}: {REPO / script} does not exist"


_SYNTHESIZED: dict[str, Path] = {}  # this session's: a synth line -> the directory it ran in


def _synth_once(tmp_path_factory, cmd: str, env: dict[str, str], work: Path, where: str) -> str:
    """Runs `moment data synth ... --out DIR` (cmd) once per session, in a directory of its own, and copies its
    DIR into `work`; returns what it printed."""
    out = _SYNTH_LINE.fullmatch(cmd).group("out")

    def build(d: Path) -> None:
        r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + cmd], cwd=d, env=env, text=True,
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
        assert r.returncode == 0, f"{where}: {cmd}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        (d / "printed.txt").write_text(r.stdout + r.stderr)

    if cmd not in _SYNTHESIZED:  # (shared_dir builds again at each call outside pytest-xdist)
        name = "readme-synth-" + hashlib.sha256(cmd.encode()).hexdigest()[:12]
        _SYNTHESIZED[cmd] = shared_dir(tmp_path_factory, name, build)
    d = _SYNTHESIZED[cmd]
    shutil.copytree(d / out, work / out)
    return (d / "printed.txt").read_text()


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def test_readme_blocks_are_labelled_and_parse():
    blocks = parse_blocks(README.read_text())
    assert any(b.commands for b in blocks), "the README's quick start runs"
    pages = {_name(p): parse_blocks(p.read_text(), _name(p)) for p in DOCS}
    assert any(b.attrs.get("file") for b in pages["docs/planning.md"]), "the profile example names its file"
    assert sum(len(b.commands) for bs in [blocks, *pages.values()] for b in bs) >= 40
    assert programs("A=1 lspci -tv > x.txt && sudo dmidecode -t slot | head; moment scan # c") == \
        ["lspci", "sudo", "head", "moment"]


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_name_files_of_the_repository(page):
    """Every relative link resolves to a file or folder inside the repository (nothing outside it, such as a
    design note beside the checkout)."""
    text = page.read_text()
    bad = []
    for no, line in enumerate(text.splitlines(), 1):
        for target in _LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor on this page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                bad.append(f"{_name(page)}:{no}: {target}")
        if "../shared" in line or "DESIGN.md" in line:
            bad.append(f"{_name(page)}:{no}: names a file outside the repository")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_page_runs_as_written(page, tmp_path, tmp_path_factory):
    name = _name(page)
    blocks = parse_blocks(page.read_text(), name)
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
        where = f"{name}:{b.line_no}"
        progs = {p for c in b.commands for p in programs(c)} - {"make"} - _BUILTINS
        missing = sorted(p for p in progs if shutil.which(p, path=env["PATH"]) is None)
        if "sudo" in progs and os.geteuid() != 0:
            missing.append("sudo (needs a password)")
        if missing:
            skipped.append(f"{where}: block needs {', '.join(missing)}")
            continue
        for cmd in b.commands:
            if programs(cmd)[:1] == ["make"]:
                skipped.append(f"{where}: {cmd!r} (builds a virtual environment)")
                continue
            if programs(cmd)[:1] in (["source"], ["."]):
                _check_activation(cmd, where)
                skipped.append(f"{where}: {cmd!r} (activates the environment this test runs in)")
                continue
            if _DOCTOR_LINE.search(cmd) and has_cuda:
                skipped.append(f"{where}: {cmd!r} (CUDA exists: the GPU checks take minutes)")
                continue
            if _TORCH_LINE.search(cmd) and not has_torch:
                skipped.append(f"{where}: {cmd!r} (torch is not installed)")
                continue
            if _SYNTH_LINE.fullmatch(cmd):
                outputs.append(_synth_once(tmp_path_factory, cmd, env, work, where))
                ran += 1
                continue
            r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + cmd], cwd=work, env=env, text=True,
                               capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
            assert r.returncode == 0, (f"{where}: {cmd}\nexit {r.returncode}\n"
                                       f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
            outputs.append(r.stdout + r.stderr)
            ran += 1
    if skipped:
        warnings.warn(f"{name} lines not run here: " + "; ".join(skipped), stacklevel=1)
    if page == README:
        assert ran >= 5, skipped

    # the examples exercise every tier, the SSDs included
    text = " ".join(" ".join(outputs).split())
    assert "training will read nothing from the SSDs" not in text
    assert "nothing will be read from the SSDs" not in text
    if (work / "m.json").is_file():
        assert json.loads((work / "m.json").read_text())["ssd_bytes_read"] > 0
    elif has_torch and any("--metrics-json m.json" in c for b in blocks for c in b.commands):
        pytest.fail(f"{name}'s training example wrote no m.json")
