"""Hostile-user cases, replayed against the real CLI and service: one markdown table row per case.

Why: a review that tried Moment the way a hostile new user would found tracebacks, deleted user
files and inputs accepted that should have been refused, each shown by one command. Those bugs are
fixed; this runner keeps every one of those commands runnable, so a regression shows as `FAIL: why`
instead of waiting for the next review, and its table is the list of cases tried (command -> outcome).

Each case runs as a real subprocess of the CLI (`python -m moment ...`) with a timeout, in a fresh
temporary directory holding what the cases need (small synthetic datasets, a plan, layouts, a pack, a
checkpoint, hand-written and damaged input files). A refusal must exit non-zero with the expected
words in its message and no traceback; a data-safety case must also leave the user's files in place;
a case that must work must exit 0. The service cases go over HTTP (urllib) to `moment serve` on
127.0.0.1 and to uvicorn's factory on 0.0.0.0 without a token. The output column shows the first
`error` line, else the first line of stderr, else of stdout.

    .venv/bin/python bench/hostile.py [--only SUBSTRING] [--keep DIR]

About two minutes on two cores; exits non-zero when any case fails.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from moment.topology.generate import mixed_chassis
from moment.topology.profiles import save_profile
from moment.workload.graph import hash_blocks

SYNTH = "--nodes 20000 --feature-dim 16"
CACHES = "--plan plan.json --gpu-cache 2% --cpu-cache 5%"
TRAIN = "moment train --layout layouts/L --epochs 1"
NESTED_YAML = "nodes: " + "[" * 1000 + "]" * 1000
TIMEOUT_S = 60
OUTPUT_CHARS = 110


@dataclass(frozen=True)
class Case:
    """One hostile input. `cmd` is what a user types in the work directory: a `moment` command line, or
    `METHOD /path [@body.json]` sent to the server `via` names. `code` is the exit status (HTTP status)
    expected, None for a refusal (any non-zero exit); `expect` must be in the output; `keep` must still
    exist afterwards (the user's files) and nothing may match the globs in `gone`."""

    cmd: str
    expect: str
    code: int | None = None
    keep: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    via: str | None = None
    timeout: float = TIMEOUT_S


@dataclass(frozen=True)
class Server:
    """A service started for the HTTP cases: its command (`{port}` filled in) and whether requests reach
    it at this machine's non-loopback (LAN) address rather than at 127.0.0.1."""

    cmd: str
    lan: bool = False

    @property
    def reached_at(self) -> str:
        return "the LAN address" if self.lan else "127.0.0.1"


SERVERS = {
    "serve": Server("moment serve --port {port} --data-dir served"),
    "uvicorn": Server("MOMENT_DATA_DIR=served uvicorn --factory moment.service.app:create_app "
                      "--host 0.0.0.0 --port {port}", lan=True),
}

FOREIGN = ("ext/manifest.json", "ext/background.js", "ext/icons/logo.png")
REFUSED_NAME = "names no file or directory of its own"

CASES = [
    # data safety: --overwrite replaces only what Moment wrote; a killed writer's leftovers go
    Case(f"moment data synth {SYNTH} --out ext --overwrite", "is not a Moment dataset", keep=FOREIGN),
    Case("moment data import edgelist edges.txt --out ext --overwrite", "is not a Moment dataset",
         keep=FOREIGN),
    Case(f"moment data synth {SYNTH} --out data/noted --overwrite", "notes.txt",
         keep=("data/noted/notes.txt", "data/noted/manifest.json")),
    Case("moment data import edgelist edges.txt --out data/noted --overwrite", "notes.txt",
         keep=("data/noted/notes.txt", "data/noted/manifest.json")),
    Case(f"moment data synth {SYNTH} --out data/fresh", "", code=0, keep=("data/fresh/manifest.json",),
         gone=("data/.fresh.tmp-*",)),
    Case("moment layout verify layouts/packed", "pack/rank0.bin"),
    Case("moment data pack --layout layouts/L --dataset data/changed", "block checksum"),
    Case(f"{TRAIN} --dataset data/badgraph", "neighbour id 1000000 out of range"),
    Case("moment train --layout layouts/other --epochs 1 --checkpoint-dir ckpt --resume",
         "checkpoint is from another run", keep=("ckpt/checkpoint.pt",)),
    Case(f"{TRAIN} --nproc 5", "placed for 4 GPU"),
    # values that must be refused
    Case("moment calibrate --measured measured-dup.yaml --out cal.yaml", "measure the same layout",
         gone=("cal.yaml",)),
    Case("moment plan --profile server.yaml --gpus 2 --ssds 2", "recommended placement", code=0),
    Case("moment plan --profile inf.yaml --gpus 2 --ssds 2", "finite number"),
    Case("moment plan --profile wide-link.yaml --gpus 2 --ssds 2", "wider than the slot"),
    Case("moment plan --profile width3.yaml --gpus 2 --ssds 2", "got x3"),
    Case("moment place --dataset data/ds --plan plan.json --gpu-cache 100 --out layouts/big",
         "larger than the 40 GiB", gone=("layouts/big",)),
    Case("moment probe --ssd-path ssd0=missing/dir --size-mib 16", "does not exist", gone=("missing",)),
    Case("moment probe --ssd-path ssd0=afile --size-mib 16", "is a file", keep=("afile",)),
    Case(f"{TRAIN} --memory-budget 1000000GiB", "more than this machine has"),
    Case(f"{TRAIN} --memory-budget ''", "--memory-budget ''"),
    Case(f"{TRAIN} --cpu-cache-limit 150%", "at most 100%"),
    Case(f"{TRAIN} --hidden 0", "--hidden 0: must be"),
    Case(f"{TRAIN} --lr nan", "--lr nan: must be a finite number"),
    Case("moment cache simulate --dataset data/ds --capacity 10% --batch-size 0", "--batch-size 0"),
    Case("moment place --dataset data/ds --plan plan.json --hotness hot128 --batch-size 64 --out layouts/h",
         "pre-sampled at 128", gone=("layouts/h",)),
    Case("moment cache simulate --dataset data/ds --capacity 10% --hotness hot128 --batch-size 64",
         "pre-sampled at 128"),
    # once tracebacks or hangs
    Case("moment simulate --layout layouts/L", "layout trace", code=0),
    Case("moment plan --profile mixed64.yaml --gpus 2 --ssds 4", "recommended placement", code=0),
    Case("moment plan --profile rand.yaml", "is not UTF-8"),
    Case("moment calibrate --measured rand.yaml --out cal.yaml", "is not UTF-8", gone=("cal.yaml",)),
    Case("moment plan --calibration rand.yaml", "is not UTF-8"),
    Case("moment advise --profile paper-machine-b --budget 60000 --prices rand.yaml", "is not UTF-8"),
    Case("moment place --dataset data/ds --plan rand.yaml --out layouts/x", "is not UTF-8",
         gone=("layouts/x",)),
    Case("moment place --dataset data/flipped --plan plan.json --out layouts/x", "is not UTF-8",
         gone=("layouts/x",)),
    Case(f"moment data synth {SYNTH} --out /", REFUSED_NAME),
    Case("moment place --dataset data/ds --plan plan.json --out / --overwrite", REFUSED_NAME),
    Case("moment layout rm /", "no manifest.json"),
    Case(f"moment data synth {SYNTH} --out data/{'y' * 300}", "is 300 bytes long"),
    Case("moment simulate --placement paper-c --profile paper-machine-b --steps 100000000", "steps fit"),
    Case("moment plan --profile nested.yaml", "nested more than"),
    Case("moment plan --profile paper-machine-b --gpus 4 --ssds 8 --calibration measured.yaml",
         "this is a measurement file"),
    # messages that misled
    Case("moment plan --gpu-model P5510", "is an SSD, not a GPU"),
    Case("moment plan --inventory 2xA100-PCIe-40GB,4xP5510 --gpus 3", "give one or the other"),
    Case("moment plan --gpus -1", "must not be negative"),
    Case("moment layout rm afile", "is a file, not a layout directory", keep=("afile",)),
    Case("moment plan --frobnicate", "No such option: --frobnicate hint:"),
    Case("moment layout rm layouts/L", "also removed", code=0,
         gone=("layouts/L", "layouts/L.runs", "mnt/*/moment-L-*")),
    # the service
    Case("moment serve --host 0.0.0.0 --data-dir served", "without a token", timeout=20),
    Case("GET /v1/profiles", "without a token", code=403, via="uvicorn"),
    Case("POST /v1/plan @nested-plan.json", "nested more than", code=422, via="serve"),
    Case("GET /v1/plan", "use POST", code=405, via="serve"),
]


# ---- the work directory --------------------------------------------------------------------------------

SETUP = [  # `> FILE`: stdout goes there
    "moment plan --profile paper-machine-b --gpus 4 --ssds 8 --json > plan.json",
    f"moment data synth {SYNTH} --out data/ds",
    f"moment data synth {SYNTH} --seed 1 --out data/other",
    "moment data presample data/ds --out hot128 --batch-size 128",
    f"moment place --dataset data/ds {CACHES} --ssd-path ssd0=mnt/nvme0 --ssd-path ssd1=mnt/nvme1 "
    "--out layouts/L",
    f"moment place --dataset data/other {CACHES} --out layouts/other",
    f"moment place --dataset data/ds {CACHES} --out layouts/packed",
    "moment data pack --layout layouts/packed",
    f"{TRAIN} --checkpoint-dir ckpt",
]

#: a small machine as a person writes one, and the one-link changes that must be refused
SERVER_PROFILE = {
    "name": "my-server",
    "nodes": [
        {"id": "cpu0", "kind": "socket", "memory_gib": 256, "memory_bandwidth_gbps": 150},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "sw0", "kind": "switch", "parent": "rc0", "link": {"gen": 4, "width": 16}},
        *({"id": f"slot{i}", "kind": "slot", "parent": "sw0", "width": 16, "link": {"gen": 4, "width": 16}}
          for i in (1, 2)),
        *({"id": f"bay{i}", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"],
           "link": {"gen": 4, "width": 4}} for i in (0, 1)),
    ],
}
PROFILE_CHANGES = {  # file: (node, link field, value)
    "inf.yaml": ("sw0", "bandwidth_gbps", float("inf")),
    "wide-link.yaml": ("bay0", "width", 16),
    "width3.yaml": ("sw0", "width", 3),
}
MEASURED = {"machine": "paper-machine-a", "data": "even", "gpus": 4, "ssds": 8,
            "measurements": [{"layout": f"paper-{k}", "epoch_s": s}
                             for k, s in zip("abcd", (15.9, 26.7, 14.9, 24.1))]}


def write_yaml(path: str, data: object) -> None:
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def profile_with(node: str, field: str, value: object) -> dict:
    profile = copy.deepcopy(SERVER_PROFILE)
    next(n for n in profile["nodes"] if n["id"] == node)["link"][field] = value
    return profile


def dead_pid() -> int:
    """The pid of a process that has exited (what a killed writer's temporary names carry)."""
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def copy_dataset(name: str) -> Path:
    return Path(shutil.copytree("data/ds", f"data/{name}"))


def corrupt_graph(d: Path) -> None:
    """A neighbour id past the node count, with the manifest's checksums made to match: only the
    structure check can tell."""
    indices = np.load(d / "indices.npy", mmap_mode="r+")
    indices[5] = 10**6
    indices.flush()
    del indices
    manifest = json.loads((d / "manifest.json").read_text())
    rec = manifest["files"]["indices"]
    rec["sha256"], rec["block_sha256"], rec["block_bytes"] = hash_blocks(d / "indices.npy")
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))


def overwrite(path: str | Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x80
    path.write_bytes(data)


def write_inputs() -> None:
    """The files the cases hand to Moment, beside what SETUP built."""
    Path("ext/icons").mkdir(parents=True)
    Path("ext/manifest.json").write_text('{"manifest_version": 3, "name": "my extension"}\n')
    Path("ext/background.js").write_text("chrome.runtime.onInstalled.addListener(() => {});\n")
    Path("ext/icons/logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    Path("edges.txt").write_text("0 1\n1 2\n2 0\n")
    (copy_dataset("noted") / "notes.txt").write_text("my notes\n")
    overwrite(copy_dataset("changed") / "features.npy", 1000, b"\xff" * 64)
    corrupt_graph(copy_dataset("badgraph"))
    flip_bit(copy_dataset("flipped") / "manifest.json", 10)
    stale = Path(f"data/.fresh.tmp-{dead_pid()}-a1b2c3d4")
    stale.mkdir()
    (stale / "features.npy").write_bytes(b"\0" * 4096)
    overwrite("layouts/packed/pack/rank0.bin", 100, b"garbage!" * 8)
    Path("rand.yaml").write_bytes(bytes(range(128, 256)) * 16)
    Path("afile").write_text("not a directory\n")
    Path("nested.yaml").write_text(NESTED_YAML + "\n")
    Path("nested-plan.json").write_text(json.dumps({"profile_yaml": NESTED_YAML, "gpus": 2, "ssds": 4}))
    write_yaml("server.yaml", SERVER_PROFILE)
    for name, change in PROFILE_CHANGES.items():
        write_yaml(name, profile_with(*change))
    write_yaml("measured.yaml", MEASURED)
    write_yaml("measured-dup.yaml", {**MEASURED, "measurements": [{"layout": "paper-a", "epoch_s": 15.9 + i}
                                                                 for i in range(4)]})
    save_profile(mixed_chassis(64, seed=0), Path("mixed64.yaml"))


def build() -> None:
    for d in ("mnt/nvme0", "mnt/nvme1", "served"):
        Path(d).mkdir(parents=True)
    for step in SETUP:
        cmd, _, into = step.partition(" > ")
        code, out, err = run(cmd, TIMEOUT_S)
        if code != 0:
            sys.exit(f"setup failed: {cmd} (exit {code})\n{err}{out}")
        if into:
            Path(into).write_text(out)
    write_inputs()


# ---- running a case ------------------------------------------------------------------------------------


def environment(assignments: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MOMENT_TOKEN", "MOMENT_ALLOW_NO_TOKEN")}
    return env | assignments


def argv(cmd: str) -> tuple[list[str], dict[str, str]]:
    """The command line of `cmd` (leading VAR=value words go to the environment), run by this Python."""
    words = shlex.split(cmd)
    assignments = {}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        assignments[key] = value
    return [sys.executable, "-m", words[0], *words[1:]], environment(assignments)


def run(cmd: str, timeout: float) -> tuple[int | None, str, str]:
    """(exit status or None after the timeout, stdout, stderr); on a timeout the whole process group
    (torchrun and its ranks too) is killed."""
    args, env = argv(cmd)
    p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lan_address() -> str | None:
    """This machine's address on its default route (no packet is sent), None when it has only loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


def request(method: str, url: str, body: bytes | None = None, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class Services:
    """The servers the HTTP cases use, started on first use and stopped together at the end."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[subprocess.Popen, str]] = {}

    def url(self, name: str) -> str:
        """The base URL of server `name`, started now if need be; raises RuntimeError if it cannot be."""
        if name not in self.running:
            server = SERVERS[name]
            host = lan_address() if server.lan else "127.0.0.1"
            if host is None:
                raise RuntimeError("this machine has no non-loopback address to connect from")
            port = free_port("0.0.0.0" if server.lan else host)
            args, env = argv(server.cmd.format(port=port))
            p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 errors="replace")
            self.running[name] = (p, f"http://{host}:{port}")
            self.wait_up(name)
        return self.running[name][1]

    def wait_up(self, name: str, limit: float = 30) -> None:
        p, base = self.running[name]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"the server exited ({p.returncode}): {p.stderr.read().strip()[-300:]}")
            try:
                request("GET", f"{base}/v1/health", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {limit:.0f} s")

    def stop(self) -> None:
        for p, _ in self.running.values():
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.running.clear()


def execute(case: Case, services: Services) -> tuple[int | None, str, str]:
    """(exit status or HTTP status, all output, the output's first line) of one case."""
    if case.via is None:
        code, out, err = run(case.cmd, case.timeout)
        errors = [line for line in (err + "\n" + out).splitlines() if line.startswith("error")]
        lines = [line.strip() for line in err.splitlines() + out.splitlines() if line.strip()]
        return code, out + err, (errors or lines or [""])[0]
    method, path, *rest = case.cmd.split()
    body = Path(rest[0].removeprefix("@")).read_bytes() if rest else None
    try:
        code, text = request(method, services.url(case.via) + path, body)
    except (OSError, RuntimeError) as e:
        return None, str(e), str(e)
    return code, text, text.strip().splitlines()[0] if text.strip() else ""


def flat(text: str) -> str:
    return " ".join(text.split())


def judge(case: Case, code: int | None, output: str) -> tuple[str, bool, bool]:
    """(verdict, whether a traceback showed, whether the user's files were lost)."""
    traceback = "Traceback" in output
    lost = [p for p in case.keep if not os.path.lexists(p)]
    left = [p for p in case.gone if glob.glob(p)]
    why = []
    if code is None:
        why.append(f"no answer within {case.timeout:.0f} s" if case.via is None else output)
    elif case.code is None and code == 0:
        why.append("accepted (exit 0)")
    elif case.code is not None and code != case.code:
        why.append(f"got {code}, expected {case.code}")
    if traceback:
        why.append("traceback")
    if flat(case.expect) not in flat(output):
        why.append(f"no {case.expect!r} in the output")
    if lost:
        why.append(f"lost {', '.join(lost)}")
    if left:
        why.append(f"left {', '.join(left)}")
    return ("FAIL: " + "; ".join(why) if why else "ok"), traceback, bool(lost)


def shown(case: Case) -> str:
    """The command as the table shows it: long runs of one character shortened, the server named."""
    cmd = re.sub(r"(\w)\1{29,}", lambda m: f"<{len(m[0])} x {m[1]}>", case.cmd)
    if case.via is not None:
        server = SERVERS[case.via]
        cmd += f" at {server.reached_at} of: {server.cmd.format(port='PORT')}"
    return cmd


def cell(text: str, limit: int | None = None) -> str:
    if limit is not None and len(text) > limit:
        text = text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", metavar="SUBSTRING",
                    help="run only the cases whose command contains SUBSTRING")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (new or empty) and keep it afterwards")
    args = ap.parse_args()
    cases = [c for c in CASES if args.only in shown(c)]
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        ap.error(f"--keep {args.keep}: not empty")
    workdir = (contextlib.nullcontext(os.path.abspath(args.keep)) if args.keep
               else tempfile.TemporaryDirectory(prefix="moment-hostile-"))
    start = time.monotonic()
    ok = tracebacks = lost = 0
    services = Services()
    with workdir as work:
        Path(work).mkdir(parents=True, exist_ok=True)
        with contextlib.chdir(work):
            print(f"setting up in {work} ...", file=sys.stderr, flush=True)
            build()
            setup_s = time.monotonic() - start
            print("| # | command | exit | first line of output | verdict |\n|---|---|---|---|---|")
            try:
                for i, case in enumerate(cases, 1):
                    code, output, first = execute(case, services)
                    verdict, traceback, data_lost = judge(case, code, output)
                    ok += verdict == "ok"
                    tracebacks += traceback
                    lost += data_lost
                    shown_code = "-" if code is None else code
                    print(f"| {i} | `{cell(shown(case))}` | {shown_code} | {cell(first, OUTPUT_CHARS)} "
                          f"| {cell(verdict)} |", flush=True)
            finally:
                services.stop()
    print(f"\nsetup {setup_s:.0f} s, cases {time.monotonic() - start - setup_s:.0f} s")
    print(f"cases: {len(cases)}  ok: {ok}  tracebacks: {tracebacks}  data_lost: {lost}")
    return 0 if ok == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
