"""Hostile-user cases, replayed against the real CLI and service: one markdown table row per case.

Why: a review that tried Moment the way a hostile new user would found tracebacks, deleted user
files and inputs accepted that should have been refused, each shown by one command. Those bugs are
fixed; this runner keeps every one of those commands runnable, so a regression shows as `FAIL: why`
instead of waiting for the next review, and its table is the list of cases tried (command -> outcome).

Each case runs as a real subprocess of the CLI (`python -m moment ...`) with a timeout, in a fresh
temporary directory holding what the cases need (small synthetic datasets, a plan, layouts, a pack, a
checkpoint, hand-written and damaged input files). A refusal must exit non-zero with the expected
words in its message and no traceback; a data-safety case must also leave the user's files in place;
a case that must work must exit 0. Training runs are stopped by SIGTERM and SIGKILL once they have
written a checkpoint, and none of their processes (torchrun, the ranks) may outlive them; a checkpoint
meets a full disk on a small tmpfs (mounting one needs root: elsewhere that case is skipped and counted
apart). The service cases go over HTTP (urllib) to `moment serve` on 127.0.0.1 and to uvicorn's factory
on 0.0.0.0 without a token, jobs are polled to their end, and 60 concurrent plans flood the service
while /v1/health is timed. The output column shows the first `error` line, else the first line of
stderr, else of stdout.

    .venv/bin/python bench/hostile.py [--only SUBSTRING] [--keep DIR]

About four minutes on two cores; exits non-zero when any case fails.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import copy
import glob
import hashlib
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
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from epoch import alive, descendants

from moment.placement.manifest import manifest_sha256
from moment.topology.generate import mixed_chassis
from moment.topology.profiles import save_profile
from moment.workload.graph import hash_blocks

SYNTH = "--nodes 20000 --feature-dim 16"
FAST = "--fanouts 10,5 --hidden 32 --threads 1"  # training options that keep each run short
ADVISE = "moment advise --profile paper-machine-b --budget 60000 --models A100-PCIe-40GB,P5510"
CACHES = "--plan plan.json --gpu-cache 2% --cpu-cache 5%"
TRAIN = "moment train --layout layouts/L --epochs 1"
NESTED_YAML = "nodes: " + "[" * 1000 + "]" * 1000
TIMEOUT_S = 60
FLOOD_HEALTH_S = 2.0  # the slowest /v1/health answer allowed while searches flood the service
OUTPUT_CHARS = 110


@dataclass(frozen=True)
class Case:
    """One hostile input. `cmd` is what a user types in the work directory: a `moment` command line, or
    `METHOD /path [@body]` sent to the server `via` names (`JOB`: POST a job and poll it to its end;
    `FLOOD N`: N concurrent POSTs while /v1/health is timed; `HALF`: POST half the body and wait for the
    answer). `code` is the exit status (HTTP status) expected, None for a refusal (any non-zero exit);
    `expect` must be in the output and none of `absent`; `keep` must still exist afterwards (the user's
    files) and nothing may match the globs in `gone`. `ctype`: the request's content type; `host`: its
    Host header (default: the server's address). `capture`: (NAME, regex) whose first group later
    commands use as {NAME}. `kill`: (signal, glob): once the glob matches (the run is training), the
    signal goes to the command, and no process it started may outlive it. `needs`: a facility of the work
    directory (`full-disk`: a small tmpfs at full/, which needs root); without it the case is skipped. Rendezvous
    cases: `{rdzv}` is a free 127.0.0.1:PORT, `{held}` one where a socket listens and never speaks, `{http}`
    `moment serve`'s; `beside` is another machine's agent started with the command (killed afterwards),
    SIGKILLed once the glob `beside_kill` matches."""

    cmd: str
    expect: str
    code: int | None = None
    keep: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    via: str | None = None
    timeout: float = TIMEOUT_S
    absent: tuple[str, ...] = ()
    ctype: str = "application/json"
    host: str | None = None
    capture: tuple[str, str] | None = None
    kill: tuple[str, str] | None = None
    needs: str | None = None
    beside: str | None = None
    beside_kill: str | None = None


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
    "serve": Server("moment serve --port {port} --data-dir served --body-timeout 3"),
    "uvicorn": Server("MOMENT_DATA_DIR=served uvicorn --factory moment.service.app:create_app "
                      "--host 0.0.0.0 --port {port}", lan=True),
}

#: a user's module of models and losses, each wrong in its own way
MY_MODELS = """
def wrong(**kw):
    return 3


def boom(**kw):
    raise RuntimeError("no GPU here")


def nonscalar(logits, y):
    return logits
"""


def _npy(a: list, dtype: str) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.array(a, dtype=dtype))
    return buf.getvalue()


NPY_3X5 = _npy([[0, 1, 2, 3, 4]] * 3, "int64")
NPY_EDGES = _npy([[0, 1, 2, 3], [1, 2, 3, 9]], "int64")
NPY_X_SHORT = _npy([[0.5] * 4] * 3, "float32")

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
    # a dataset far larger than the disk: refused at once, nothing written
    Case("moment data synth --nodes 1000 --feature-dim 100000000 --out data/huge", "the disk holding",
         gone=("data/huge", "data/.huge.tmp-*")),
    # more epochs than any disk holds: refused from one sampled epoch, not after hours of writing
    Case("moment data pack --layout layouts/packed --epochs 100000000 --overwrite", "the disk holding the layout has",
         keep=("layouts/packed/pack/pack.json",)),
    # two answers to which rows the pack leaves out: refused before anything is sampled, the pack kept
    Case("moment data pack --layout layouts/packed --whole --memory-budget 2GiB --overwrite",
         "give one of --whole and --memory-budget", keep=("layouts/packed/pack/pack.json",)),
    # a damaged graph whose checksums were made to match: only the structure check can tell; given with a layout
    # placed from the undamaged copy, the content no longer matches the layout's record of its dataset
    Case("moment train --dataset data/badgraph --features-in-memory --epochs 1", "neighbour id 1000000 out of range"),
    Case(f"{TRAIN} --dataset data/badgraph", "the layout was placed from another dataset"),
    Case("moment train --layout layouts/other --epochs 1 --checkpoint-dir ckpt --resume",
         "checkpoint is from another run", keep=("ckpt/checkpoint.pt",)),
    Case(f"{TRAIN} --nproc 5", "placed for 4 GPU"),
    # your own data, model and loss: one line naming the input, nothing half-written
    Case("moment data import pyg corrupt.pt --out data/pt", "corrupt.pt", gone=("data/pt", "data/.pt.tmp-*")),
    Case("moment data import npy --out data/np --edge-index e-bad.npy", "e-bad.npy",
         gone=("data/np", "data/.np.tmp-*")),
    Case("moment data import npy --out data/np --edge-index e.npy --x x-short.npy", "x-short.npy",
         gone=("data/np", "data/.np.tmp-*")),
    Case("moment data import npy --out data/np --edge-index edges.txt", "edges.txt: not a .npy file",
         gone=("data/np", "data/.np.tmp-*")),  # a text edge list given as an array: not called pickled data
    Case("moment data import graphsaint yelp --out data/yelp", "yelp/class_map.json: a multi-label class map must "
         "give every node its classes: 1 of the 3 nodes has none", gone=("data/yelp", "data/.yelp.tmp-*")),
    Case("moment data import npy --out data/np --edge-index arrays.npz",
         "arrays.npz: an .npz archive without a SciPy sparse matrix in it (it holds edge_index)",
         gone=("data/np", "data/.np.tmp-*")),
    # the graph's own ids: one listed twice, or a split naming one the graph does not have
    Case("moment data import edgelist names.txt --out data/nm --node-ids names-dup.txt",
         "names-dup.txt: node id bob is listed twice", gone=("data/nm", "data/.nm.tmp-*")),
    Case("moment data import edgelist names.txt --out data/nm --renumber --splits names-split",
         "names-split/test.txt: test split names node mallory, not among the 3 node ids of names.txt",
         gone=("data/nm", "data/.nm.tmp-*")),
    Case("moment data import edgelist names.txt --out data/nm --node-table names-feats.csv --label-table "
         "names-labels.csv", "names-labels.csv: labels mix class numbers and names ('unknown')",
         gone=("data/nm", "data/.nm.tmp-*")),
    # Parquet tables: a download cut short, vectors of unequal length, names without --renumber, a table given
    # where an array goes
    Case("moment data import edgelist cut.parquet --out data/pq --renumber",
         "cut.parquet: cannot read the edge list as Parquet", gone=("data/pq", "data/.pq.tmp-*")),
    Case("moment data import edgelist names.parquet --out data/pq --renumber --node-table ragged.parquet",
         "ragged.parquet: node bob (row 2) has 1 features, the first node 2", gone=("data/pq", "data/.pq.tmp-*")),
    Case("moment data import edgelist names.parquet --out data/pq",
         "names.parquet: column 'src' holds names, not node numbers", gone=("data/pq", "data/.pq.tmp-*")),
    Case("moment data import edgelist names.txt --out data/pq --renumber --features ragged.parquet",
         "ragged.parquet: this is a Parquet table, not a .npy file", gone=("data/pq", "data/.pq.tmp-*")),
    # stop 64's hostile pass: what a spreadsheet, pandas or a typo hands the importers, the run and the service
    Case("moment data import edgelist bom.csv --out data/bom --renumber", "4 distinct names", code=0),
    Case("moment data import edgelist tags.csv --out data/tags --renumber", "6 distinct names", code=0),
    Case("moment data import edgelist names.txt --out data/fd --renumber --feature-dim 0",
         "--feature-dim 0: must be at least 1", gone=("data/fd", "data/.fd.tmp-*")),
    Case("moment data import edgelist names.txt --out data/fd --renumber --label-table floats.csv",
         "floats.csv: node bob has label 1.5: a class is a whole number or a name", gone=("data/fd",)),
    Case(f"{TRAIN} --checkpoint-dir ckpt-flipped --resume", "the checkpoint is damaged",
         keep=("ckpt-flipped/checkpoint.pt",)),
    Case(f"{TRAIN} --drop-page-cache", "--drop-page-cache is for the --features-memmap baseline"),
    Case("moment data pack --layout layouts/packed --ranks 64 --overwrite", "--ranks 64: 64 ranks on this machine",
         keep=("layouts/packed/pack/pack.json",)),
    Case("moment serve --port 1 --data-dir served --plan-timeout nan", "--plan-timeout nan: must be a finite number"),
    Case(f"{TRAIN} --model mymodels:wrong", "--model mymodels:wrong"),
    Case(f"{TRAIN} --model mymodels:boom", "no GPU here"),
    Case(f"{TRAIN} --model nosuchpkg.models:make", "nosuchpkg"),
    Case(f"{TRAIN} --model os:getcwd", "--model os:getcwd"),
    Case(f"{TRAIN} --loss mymodels:nonscalar", "--loss mymodels:nonscalar"),
    Case(f"{TRAIN} --task link --loss mymodels:nonscalar", "is for node classification"),
    # stop 65's hostile pass: scans saved the wrong way, tables as pandas and Spark write them, an edited layout
    Case("moment data import npy --out data/rs --edge-index e.npy --random-split 0.6,0.5,0.2",
         "--random-split 0.6,0.5,0.2: give three shares", gone=("data/rs", "data/.rs.tmp-*")),
    Case("moment data import edgelist pq-hive --out data/hive", "a Hive-partitioned Parquet table (bucket=0, bucket=1)",
         gone=("data/hive", "data/.hive.tmp-*")),
    Case("moment data import edgelist names.txt --out data/ix --renumber --label-table labels-index.csv",
         "has no name: pandas' index", gone=("data/ix", "data/.ix.tmp-*")),
    Case("moment scan --from-lspci lspci-u16.txt", "UTF-16"),
    Case("moment scan --from-lspci lspci-t.txt", "lspci -tv"),
    Case("moment plan --profile dup-key.yaml --gpus 1 --ssds 1", "key 'gen' appears twice"),
    Case("moment layout verify layouts/swapped", "edited or damaged", keep=("layouts/swapped/manifest.json",)),
    Case(f"moment train --layout layouts/swapped --epochs 1 {FAST}", "edited or damaged"),
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
    # a cache its answers cannot be kept in (a file where their folder goes): answered, twice, nothing said
    Case("MOMENT_ANSWERS=on MOMENT_CACHE=blocked moment plan --profile server.yaml --gpus 2 --ssds 2",
         "recommended placement", code=0, absent=("error", "Traceback"), keep=("blocked/answers",)),
    Case("MOMENT_ANSWERS=on MOMENT_CACHE=blocked moment plan --profile server.yaml --gpus 2 --ssds 2",
         "recommended placement", code=0, absent=("error", "Traceback"), keep=("blocked/answers",)),
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
    # the service
    Case("moment serve --host 0.0.0.0 --data-dir served", "without a token", timeout=20),
    Case("GET /v1/profiles", "without a token", code=403, via="uvicorn"),
    Case("POST /v1/plan @nested-plan.json", "nested more than", code=422, via="serve"),
    Case("GET /v1/plan", "use POST", code=405, via="serve"),
    # ---- the rest of the review's cases, and those found closing it ----
    # wrong predictions: a card's link is the lower generation of card and slot (a 5.0 SSD in a 4.0 bay)
    Case("moment plan --profile server.yaml --gpus 2 --ssds 2 --ssd-model PM1743", "ssd0->bay0 │ pcie │ 6.77 │ 6.77",
         code=0),
    Case("moment plan --profile server.yaml --gpus 2 --ssds 2 --gpu-model H100-PCIe-80GB --json",
         '"id": "gpu0->slot1", "src": "gpu0", "dst": "slot1", "kind": "pcie", "label": null, "capacity_gbps": 27.09',
         code=0, absent=('"capacity_gbps": 54.19',)),
    # corrupt or foreign data is found; training never goes on with NaN, nor with a finite loss that diverged
    Case(f"moment train --layout layouts/garbage --epochs 1 {FAST}", "the loss is not finite",
         gone=("layouts/garbage.runs/*/checkpoint/checkpoint.pt",)),
    Case(f"{TRAIN} {FAST} --lr 1e6 --run-dir runs-diverged", "the loss diverged (learning rate 1e+06)",
         absent=("not finite",)),
    Case("moment layout verify layouts/garbage", "checksum mismatch in chunk 0"),
    Case(f"moment train --dataset data/nanfeat --features-in-memory --epochs 1 {FAST}",
         "the loss is not finite because the feature rows read for the batch hold NaN"),
    Case("moment layout verify layouts/foreignpack", "the pack was made for another layout"),
    Case("moment train --layout layouts/foreignpack --epochs 1", "the pack was made for another layout"),
    Case(f"{TRAIN} --dataset data/changed", "do not match the manifest's block checksum"),
    Case(f"moment train --layout layouts/edited --epochs 1 {FAST}", "node 3 is in bin 99"),
    Case("moment layout verify layouts/edited", "node 3 is in bin 99"),
    Case(f"{TRAIN} --checkpoint-dir ckpt --resume --hidden 64", "hidden 256 vs 64", keep=("ckpt/checkpoint.pt",)),
    Case(f"{TRAIN} --nproc 64", "placed for 4 GPU"),
    Case("moment plan --profile mixed64.yaml --gpus 8 --ssds 16", "recommended placement", code=0),
    # a limit too short for the search: the best of the first placements, said to be unproven, with its bound
    Case("moment plan --profile mixed64.yaml --gpus 8 --ssds 16 --timeout 0.01", "not proven optimal", code=0),
    # the same where NVLink bridges on slots leave no branch and bound: the fastest first placement, without a bound
    Case("moment plan --profile paper-machine-b --set 'links+={a: rc0-x16, b: rc1-x16a, kind: nvlink, count: 4}' "
         "--gpus 4 --ssds 8 --timeout 0.01", "before any bound on the best placement was known", code=0),
    Case("moment simulate --layout layouts/L --dataset data/ds", "layout trace", code=0),
    # a disk that fills up at a checkpoint: said with the file, the last good checkpoint kept
    Case("moment train --layout layouts/L --epochs 2 --nproc 2 --checkpoint-dir full/ck --checkpoint-every 2 "
         "--run-dir runs-full", "no space left on the device; the last good checkpoint (step 2) is kept",
         keep=("full/ck/checkpoint.pt",), needs="full-disk", absent=("lost the connection", "unexpected pos")),
    # stopping the launcher stops torchrun and every rank
    Case(f"moment train --layout layouts/L --epochs 100000 --nproc 2 {FAST} --checkpoint-every 1 --run-dir runs-term",
         "training stopped by SIGTERM", code=128 + signal.SIGTERM, kill=("SIGTERM", "runs-term/*/checkpoint/checkpoint.pt"),
         timeout=120),
    Case(f"moment train --layout layouts/L --epochs 100000 --nproc 2 {FAST} --checkpoint-every 1 --run-dir runs-kill",
         "", code=-signal.SIGKILL, kill=("SIGKILL", "runs-kill/*/checkpoint/checkpoint.pt"), timeout=120),
    # the budget's suggested minimum is what the ranks accept
    Case(f"moment train --nproc 2 --layout layouts/L --epochs 1 {FAST} --memory-budget 200MiB", "give at least",
         capture=("budget", r"give at least --memory-budget (\d+MiB)")),
    Case(f"moment train --nproc 2 --layout layouts/L --epochs 1 {FAST} --memory-budget {{budget}} --run-dir runs-budget",
         "", code=0, timeout=120),
    # every file of a kind given where another kind is asked for says what it is
    Case("moment place --dataset data/ds --plan server.yaml --out layouts/x", "this is a profile",
         gone=("layouts/x",)),
    Case("moment plan --profile plan.json", "this is a plan"),
    Case("moment calibrate --measured calibration.yaml", "this is a calibration"),
    Case("moment plan --profile prices.yaml", "this is a price file"),
    Case("moment plan --profile cluster.yaml", "this is a cluster file"),
    Case("moment plan --cluster server.yaml", "this is a profile"),
    Case("moment layout verify hot128", "this is a hotness"),
    Case("moment cache simulate --dataset data/ds --capacity 10% --hotness layouts/L", "this is a layout"),
    # an output written into what Moment wrote, a link that cannot exist, a truth value for a number
    Case("moment cache simulate --dataset data/ds --capacity 10% --trace-out data/ds/features.npy",
         "is inside the dataset", keep=("data/ds/features.npy",)),
    Case("moment plan --profile paper-machine-b --gpus 2 --ssds 2 --set 'links+={a: rc0-x16, b: cpu0, kind: nvlink, "
         "count: 12}'", "an NVLink joins GPUs"),
    Case("moment plan --profile paper-machine-b --gpus 2 --ssds 2 --set nodes.sw0.link.bandwidth_gbps=true",
         "is a truth value, not a number"),
    Case("moment place --dataset data/ds --profile paper-machine-b --gpus 2 --ssds 2 --gpu-cache 2% --cpu-cache 5% "
         "--out data/ds/L", "is inside the dataset"),
    # path options found closing the review
    Case(f"{TRAIN} --run-dir /", "--run-dir /: names no file or directory of its own"),
    Case(f"{TRAIN} --run-dir afile", "--run-dir afile: exists and is a file", absent=("--checkpoint-dir",)),
    Case(f"moment serve --port 1 --data-dir served --db data/{'y' * 300}", "is 300 bytes long"),
    Case("moment serve --port 1 --data-dir dangling", "is a symbolic link to nowhere"),
    Case("moment calibrate --measured measured.yaml --profile paper-machine-a.yaml", "largest leave-one-out",
         code=0),
    # messages that misled
    Case("moment calibrate --measured measured-dup.yaml --out afile/cal.yaml", "--out afile/cal.yaml"),
    Case("moment probe --ssd-path ssd0=mnt/nvme0 --size-mib 16 --out probe.yaml", "memory copy:", code=0,
         gone=("mnt/nvme0/.moment-probe-*",)),
    Case("moment advise --profile paper-machine-b --budget 60000 --models A100-PCIe-40GB,P5510 --max-gpus 2 "
         "--max-ssds 2 --json", "best_throughput_per_dollar", code=0, absent=('"best_per_dollar"', '"cost_usd"')),
    # the service
    Case("POST /v1/whatif/targets @nested-targets.json", "nested more than", code=422, via="serve"),
    Case("POST /v1/advise @nested-advise.json", "nested more than", code=422, via="serve"),
    Case("POST /v1/plan @badutf.json", "body: not UTF-8 text", code=422, via="serve"),
    Case("POST /v1/scan @broken.form", "body: not a valid form", code=422, via="serve", ctype="multipart/form-data"),
    Case("OPTIONS /v1/plan", "use POST", code=405, via="serve"),
    Case("POST /v1/plan @zero-gpus.json", '"field":"gpus"', code=422, via="serve", absent=("--gpus",)),
    Case("POST /v1/plan @many-ssds.json", '"field":"ssds"', code=422, via="serve", absent=("--ssds",)),
    Case("POST /v1/advise @small-budget.json", '"field":"budget"', code=422, via="serve", absent=("--budget",)),
    Case("POST /v1/plan @inventory-and-model.json", "so ssd_model would be ignored", code=422, via="serve"),
    Case("POST /v1/jobs/probe @probe-huge.json", "above the service's limit of 16,384 MiB per job", code=422,
         via="serve"),
    Case("POST /v1/jobs/probe @probe-qd3.json", "queue_depth 3: choose 8-", code=422, via="serve"),
    Case("POST /v1/jobs/place @place-bigcache.json", '"field":"gpu_cache"', code=422, via="serve",
         absent=("--gpu-cache",)),
    Case("JOB /v1/jobs/probe @probe-small.json", '"path":"probe/a/.moment-probe-', code=200, via="serve"),
    Case("JOB /v1/jobs/place @place-job.json", '"layout":"layouts/L1"', code=200, via="serve"),
    Case("FLOOD 60 /v1/plan @plan-b.json", "health within 2 s", code=200, via="serve", timeout=300),
    # a client that sends half its body, a page reached through DNS rebinding, HEAD
    Case("HALF /v1/plan @plan-b.json", "the request body stopped arriving: nothing for 3 s", code=408, via="serve"),
    Case("POST /v1/jobs/place @place-job.json", "DNS rebinding", code=403, via="serve", host="attacker.example"),
    Case("GET /v1/profiles", "paper-machine-b", code=200, via="serve", host="localhost"),
    Case("HEAD /v1/profiles", "", code=200, via="serve"),
    # rendezvous: the join bounded by --rdzv-timeout, every machine told why, the right machine named
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint 127.0.0.1:29400:1", "the port '29400:1'"),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint [::1", "'[::1' opens '[' without its ']'"),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint {{held}} --rdzv-timeout 3 --run-dir runs31",
         "answered but is not a rendezvous", timeout=45, absent=("Traceback",)),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint {{http}} --rdzv-timeout 3 --run-dir runs31",
         "answered but is not a rendezvous", timeout=45, absent=("Traceback",)),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint {{rdzv}} --rdzv-timeout 3 --run-dir runs31",
         "not all 2 machines joined the rendezvous", timeout=45, absent=("Traceback",)),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 1 --rdzv-endpoint {{rdzv}} --rdzv-timeout 30 --run-dir runs31",
         "the machines train different datasets", timeout=120, absent=("its own messages say why",),
         beside=f"moment train --layout layouts/other --epochs 1 {FAST} --nnodes 2 --node-rank 0 --rdzv-endpoint "
                "{rdzv} --rdzv-timeout 30 --run-dir runs31b"),
    Case(f"{TRAIN} {FAST} --nnodes 2 --node-rank 0 --rdzv-endpoint {{rdzv}} --rdzv-timeout 30 --run-dir runs31",
         "two machines gave --node-rank 0", timeout=120, absent=("its own messages say why",),
         beside=f"moment train --layout layouts/packed --epochs 1 {FAST} --nnodes 2 --node-rank 0 --rdzv-endpoint "
                "{rdzv} --rdzv-timeout 30 --run-dir runs31b"),
    Case(f"moment train --layout layouts/L --epochs 100000 {FAST} --quiet --nnodes 2 --node-rank 0 --rdzv-endpoint "
         "{rdzv} --rdzv-timeout 30 --run-dir runs31k", "machine 1 stopped or cannot be reached", timeout=120,
         absent=("machine 0", "Traceback"),
         beside=f"moment train --layout layouts/packed --epochs 100000 {FAST} --quiet --nnodes 2 --node-rank 1 "
                "--rdzv-endpoint {rdzv} --rdzv-timeout 30 --run-dir runs31k1", beside_kill="runs31k/*/checkpoint/*"),
    # bounds and flags: every count is bounded by the data before work starts
    Case("moment place --dataset data/ds --machines 20001 --out layouts/many", "at most 20,000 machines",
         gone=("layouts/many", "layouts/.many.lock")),
    Case("moment place --dataset data/ds --machines 100000 --out layouts/many", "at most 20,000 machines",
         gone=("layouts/many", "layouts/.many.lock")),
    Case(f"{ADVISE} --machines-max 1000000", "--machines-max 1000000: give 1 to 512 servers"),
    Case(f"{ADVISE} --machines-max 3 --nics 1000", "--nics 1000: give 1 to 16 NICs per server"),
    Case(f"{ADVISE} --machines-max 512 --nics 16", "costs more than its share of the budget", code=0, timeout=120,
         absent=("budget -",)),
    Case(f"{ADVISE} --nic CX7", "--nic prices the network between servers, which only --machines-max compares"),
    Case(f"{TRAIN} --dry-run --metrics-json m.json", "--metrics-json: a dry run trains nothing", gone=("m.json",)),
    # fan-outs: bounded by the graph's largest degree, the dry run in bounded time and memory, beyond any graph refused
    Case("moment train --layout layouts/L --dry-run --json --fanouts 1000000,1000000",
         "neighbours (the graph's largest degree); using", code=0, timeout=30),
    Case("moment train --layout layouts/L --dry-run --fanouts 3000000000,5", "--fanouts", absent=("Traceback",)),
    # last: the other cases read this layout
    Case("moment layout rm layouts/L", "also removed", code=0,
         gone=("layouts/L", "layouts/L.runs", "mnt/*/moment-L-*")),
    # cluster files and the service: every number bounded, one name check, the body limit answered
    Case("moment plan --cluster c31-count.yaml", "servers[0].count: 100000000000000000000 is out of range: from 1 to 512"),
    Case("moment plan --cluster c31-digits.yaml", "(400 digits) is out of range: from 1 to 512 machines"),
    Case("moment plan --cluster c31-total.yaml", "add up to 600 machines: at most 512"),
    Case("moment plan --cluster c31-max.yaml", "b0 ... b511 (512 machines, each)", code=0, timeout=60),
    Case("moment plan --cluster c31-model.yaml", "model_mb: 1e+300 is out of range: above 0, at most 1e+06 MB"),
    Case("moment plan --cluster c31-switch.yaml", "network.switch_gbit: 1e+300 is out of range: above 0, at most 3200 Gb/s"),
    Case("moment plan --cluster c31-bool.yaml", "servers[0].count: Input should be a valid integer"),
    Case("moment plan --cluster c31-names.yaml", "two machines are named 'b0'"),
    Case("moment place --dataset data/ds --cluster c31-names.yaml --out layouts/c31", "two machines are named 'b0'",
         gone=("layouts/c31",)),
    Case("moment plan --cluster c31-long.yaml", "is 400 characters: at most 64", absent=("use letters",)),
    Case("moment plan --cluster cluster.yaml --calibration calibration.yaml", "a cluster plan takes no --calibration",
         absent=("put them in the cluster file",)),
    Case("POST /v1/plan/cluster @c31-count-req.json", "is out of range: from 1 to 512", code=422, via="serve"),
    Case("POST /v1/plan/cluster @c31-digits-req.json", "is out of range: from 1 to 512", code=422, via="serve"),
    Case("POST /v1/plan/cluster @c31-model-req.json", '"field":"cluster.model_mb"', code=422, via="serve"),
    Case("POST /v1/plan/cluster @c31-bool-req.json", "cluster.servers.0.count", code=422, via="serve"),
    Case("POST /v1/plan/cluster @c31-names-req.json", "two machines are named 'b0'", code=422, via="serve"),
    Case("POST /v1/plan/cluster @c31-max-req.json", '"name":"b511"', code=200, via="serve", timeout=60),
    Case("POST /v1/plan/cluster @c31-50mb.json", "over the service's limit of 16,777,216 bytes", code=413,
         via="serve"),
    # messages that name the real cause
    Case("moment layout info layouts/split-nocluster", "no cluster.json: this is a split layout's top directory"),
    # a directory of datasets is neither a layout nor a split's top directory, and stays
    Case("moment layout rm data", "no manifest.json: not a complete layout", keep=("data/ds/manifest.json",)),
    Case("moment place --dataset data/ds --machines 2 --out layouts/other --overwrite",
         "is one machine's layout, not a split layout", keep=("layouts/other/manifest.json",)),
    Case("moment place --dataset data/ds --out layouts/split --overwrite", "is a split layout, not one machine's",
         keep=("layouts/split/cluster.json", "layouts/split/m0/manifest.json")),
    Case("moment layout info layouts/split-cut", "owners.npy: the owners file is truncated"),
    Case("moment doctor --device tpu", "--device tpu: not a device the checks run on; choose cuda or cpu"),
    Case("moment data import edgelist edge_index.npy --out data/ei", "this is a NumPy .npy file",
         gone=("data/ei",), absent=("codec",)),
    Case("moment data import edgelist corrupt.pt --out data/ei", "moment data import pyg", gone=("data/ei",)),
    # ids and headers as written, hotness checked where read, machines without SSDs, what a CPU drives, bodies
    Case("moment data import edgelist padded.txt --renumber --out data/padded",
         "'007' is the integer 7 written another way", code=0),
    Case("moment data import edgelist users.csv --renumber --out data/users", "it may be a header or an edge",
         gone=("data/users",)),
    Case("moment data import edgelist edges.txt.bz2 --out data/bz", "bzip2-compressed", gone=("data/bz",)),
    Case(f"moment place --dataset data/ds {CACHES} --hotness hot-negative --out layouts/hn",
         "hot-negative/feature_reads.npy: negative counts", gone=("layouts/hn",)),
    Case("moment cache simulate --dataset data/ds --capacity 10% --hotness hot-negative",
         "hot-negative/feature_reads.npy: negative counts"),
    Case(f"moment place --dataset data/ds {CACHES} --ssd-path ssd0=/proc --out layouts/proc",
         "a kernel file system", gone=("layouts/proc",)),
    Case("moment place --dataset data/ds --gpus 1 --ssds 0 --gpu-cache 2% --cpu-cache 5% --out layouts/nossd",
         "the machine has no SSD, so its caches must hold all 20,000 rows", gone=("layouts/nossd",)),
    Case("moment place --dataset data/ds --gpus 1 --ssds 0 --gpu-cache 2% --cpu-cache 100% --out layouts/nossd1",
         "layout written", code=0, keep=("layouts/nossd1/manifest.json",)),
    Case("moment plan --profile cpugen.yaml --gpus 1 --ssds 2", "capped from 5.0 by the CPU", code=0),
    Case("moment plan --cluster c-owners.yaml", "no machine may take that name"),
    Case("moment scan --from-nccl-xml bomb.xml", "declares a DTD of its own", timeout=20),
    Case("POST /v1/plan @gpus-true.json", "gpus: true is a truth value, not a number", code=422, via="serve"),
]

_B = {"profile": "paper-machine-b", "inventory": "4xA100-PCIe-40GB,8xP5510"}
_NET = {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}
#: the cluster files of the block above: NAME.yaml for the CLI, NAME-req.json ({"cluster": ...}) for the service
CLUSTERS_31 = {
    "c31-count": {"servers": [{**_B, "count": 10**20}], "network": _NET},
    "c31-digits": {"servers": [{**_B, "count": int("9" * 400)}], "network": _NET},
    "c31-total": {"servers": [{**_B, "name": "a", "count": 300}, {**_B, "name": "b", "count": 300}], "network": _NET},
    "c31-max": {"servers": [{**_B, "name": "b", "count": 512}], "network": _NET},
    "c31-model": {"servers": [_B], "network": _NET, "model_mb": 1e300},
    "c31-switch": {"servers": [_B], "network": {**_NET, "switch_gbit": 1e300}},
    "c31-bool": {"servers": [{**_B, "count": True}], "network": _NET},
    "c31-names": {"servers": [{**_B, "name": "b", "count": 2}, {**_B, "name": "b0"}], "network": _NET},
    "c31-long": {"servers": [{**_B, "name": "x" * 400}], "network": _NET},
}


def write_clusters_31() -> None:
    for name, data in CLUSTERS_31.items():
        write_yaml(f"{name}.yaml", data)
        Path(f"{name}-req.json").write_text(json.dumps({"cluster": data}))
    with open("c31-50mb.json", "wb") as f:  # a 50 MB body
        f.write(b'{"cluster": "' + b"x" * 50_000_000 + b'"}')


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
    f"moment place --dataset data/other {CACHES} --out layouts/foreign",
    "moment data pack --layout layouts/packed",
    f"{TRAIN} --checkpoint-dir ckpt",
    "moment export --profile paper-machine-a --out paper-machine-a.yaml",
    "moment place --dataset data/ds --machines 2 --out layouts/split",
]
#: after write_inputs: what reads the files it writes
AFTER_INPUTS = [
    "moment calibrate --measured measured.yaml --out calibration.yaml",
    "moment data pack --layout layouts/foreign",
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


def resign(d: Path, name: str) -> None:
    """Make the dataset manifest's checksums of `name`.npy match its edited content."""
    manifest = json.loads((d / "manifest.json").read_text())
    rec = manifest["files"][name]
    rec["sha256"], rec["block_sha256"], rec["block_bytes"] = hash_blocks(d / f"{name}.npy")
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))


def corrupt_graph(d: Path) -> None:
    """A neighbour id past the node count, with the manifest's checksums made to match: only the
    structure check can tell."""
    indices = np.load(d / "indices.npy", mmap_mode="r+")
    indices[5] = 10**6
    indices.flush()
    del indices
    resign(d, "indices")


def overwrite(path: str | Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def swap_shards(manifest: Path) -> None:
    """An edit of a layout's manifest that every per-file check still passes: two SSD shards' files swapped (their
    paths, sizes and checksums together), so each would read the other's nodes."""
    m = json.loads(manifest.read_text())
    a, b = [sh for sh in m["shards"] if sh["kind"] == "ssd"][:2]
    for key in ("path", "rows", "bytes", "chunk_sha256"):
        a[key], b[key] = b[key], a[key]
    manifest.write_text(json.dumps(m))


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x80
    path.write_bytes(data)


def set_nan_features(d: Path) -> None:
    """Every feature NaN, the manifest's checksums made to match (a bad import): only the loss can tell."""
    features = np.load(d / "features.npy", mmap_mode="r+")
    features[:] = np.nan
    features.flush()
    del features
    resign(d, "features")


def edit_layout_index(layout: Path) -> None:
    """Node 3 moved to a bin the layout does not have, the manifest's checksum of the index (and its own) made to
    match."""
    f = layout / "index.npy"
    index = np.load(f)
    index[3, 0] = 99
    np.save(f, index)
    manifest = json.loads((layout / "manifest.json").read_text())
    manifest["index"] |= {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "bytes": f.stat().st_size}
    manifest["sha256"] = manifest_sha256(manifest)
    (layout / "manifest.json").write_text(json.dumps(manifest))


def copy_layout(src: str, name: str) -> Path:
    return Path(shutil.copytree(src, f"layouts/{name}"))


SERVICE_BODIES = {  # the service cases' request bodies
    "nested-targets.json": {"profile_yaml": NESTED_YAML},
    "nested-advise.json": {"profile_yaml": NESTED_YAML, "budget": 60000},
    "zero-gpus.json": {"profile": "paper-machine-b", "gpus": 0},
    "many-ssds.json": {"profile": "paper-machine-b", "ssds": 100},
    "small-budget.json": {"profile": "paper-machine-b", "budget": 100},
    "inventory-and-model.json": {"inventory": "2xA100-PCIe-40GB,2xP5510", "ssd_model": "PM1743"},
    "probe-huge.json": {"ssd_dirs": {f"ssd{i}": f"d{i}" for i in range(64)}, "size_mib": 4096},
    "probe-qd3.json": {"queue_depth": 3},
    "probe-small.json": {"ssd_dirs": {"ssd0": "a"}, "size_mib": 16},
    "place-job.json": {"dataset": "ds", "layout": "L1", "gpu_cache": "2%", "cpu_cache": "5%"},
    "place-bigcache.json": {"dataset": "ds", "layout": "L2", "gpu_cache": "100"},
    "plan-b.json": {"profile": "paper-machine-b", "gpus": 4, "ssds": 8},
}


def write_inputs() -> None:
    """The files the cases hand to Moment, beside what SETUP built."""
    Path("ext/icons").mkdir(parents=True)
    Path("ext/manifest.json").write_text('{"manifest_version": 3, "name": "my extension"}\n')
    Path("ext/background.js").write_text("chrome.runtime.onInstalled.addListener(() => {});\n")
    Path("ext/icons/logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    Path("edges.txt").write_text("0 1\n1 2\n2 0\n")
    Path("blocked").mkdir()
    Path("blocked/answers").write_text("not a folder\n")
    Path("corrupt.pt").write_bytes(b"PK\x03\x04 not really a torch file")
    Path("e-bad.npy").write_bytes(NPY_3X5)  # an edge index of 3 rows
    Path("e.npy").write_bytes(NPY_EDGES)
    Path("x-short.npy").write_bytes(NPY_X_SHORT)  # features of fewer rows than the edges name
    Path("mymodels.py").write_text(MY_MODELS)
    write_saint_multilabel(Path("yelp"))
    np.savez("arrays.npz", edge_index=np.array([[0, 1], [1, 2]]))
    Path("names.txt").write_text("alice bob\nbob carol\n")
    Path("names-dup.txt").write_text("alice\nbob\ncarol\nbob\n")
    Path("names-feats.csv").write_text("alice,0.5,1\nbob,1.5,2\ncarol,2.5,3\n")
    Path("names-labels.csv").write_text("id,class\nalice,1\nbob,unknown\ncarol,2\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"src": ["alice", "bob"], "dst": ["bob", "carol"]}), "names.parquet")
    Path("cut.parquet").write_bytes(Path("names.parquet").read_bytes()[:-40])
    pq.write_table(pa.table({"id": ["alice", "bob", "carol"], "x": [[0.5, 1.0], [1.5], [2.5, 3.0]]}), "ragged.parquet")
    Path("bom.csv").write_bytes("\ufeffdst,src\nbob,alice\ncarol,bob\ndave,carol\n".encode())  # Excel's CSV
    Path("tags.csv").write_text("src,dst\nalice,c#\nbob,c\ncarol,c++\nalice,bob\n")  # c# is not c
    Path("floats.csv").write_text("alice,1.0\nbob,1.5\n")
    Path("dup-key.yaml").write_text("name: dup\nnodes:\n  - {id: cpu0, kind: socket}\n  - {id: rc0, kind: root_complex, "
                                    "parent: cpu0}\n  - {id: slot1, kind: slot, parent: rc0, width: 16, "
                                    "link: {gen: 4, width: 16, gen: 3}}\n")
    Path("labels-index.csv").write_text(",id,class\n0,alice,1\n1,bob,2\n")  # pandas' to_csv with its index
    for k in range(2):
        Path(f"pq-hive/bucket={k}").mkdir(parents=True)
        pq.write_table(pa.table({"src": [k, 1], "dst": [2, k]}), f"pq-hive/bucket={k}/part-0.parquet")
    tree = "-[0000:00]-+-00.0  Advanced Micro Devices, Inc. [AMD] Root Complex\n           \\-01.1-[01]----00.0  NVIDIA Corporation GA100 [A100 PCIe 40GB]\n"
    Path("lspci-u16.txt").write_bytes(tree.encode("utf-16"))  # PowerShell's > redirection
    Path("lspci-t.txt").write_text("-[0000:00]-+-00.0\n           \\-01.1-[01]----00.0\n")  # lspci -t: no names
    swap_shards(Path(shutil.copytree("layouts/L", "layouts/swapped")) / "manifest.json")
    shutil.copytree("ckpt", "ckpt-flipped")  # a flipped bit mid-file: a valid float to torch.load
    flip_bit(Path("ckpt-flipped/checkpoint.pt"), Path("ckpt/checkpoint.pt").stat().st_size // 2)
    Path("names-split").mkdir()
    for part, text in (("train", "alice\n"), ("valid", "bob\n"), ("test", "mallory\n")):
        (Path("names-split") / f"{part}.txt").write_text(text)
    (copy_dataset("noted") / "notes.txt").write_text("my notes\n")
    overwrite(copy_dataset("changed") / "features.npy", 1000, b"\xff" * 64)
    corrupt_graph(copy_dataset("badgraph"))
    flip_bit(copy_dataset("flipped") / "manifest.json", 10)
    stale = Path(f"data/.fresh.tmp-{dead_pid()}-a1b2c3d4")
    stale.mkdir()
    (stale / "features.npy").write_bytes(b"\0" * 4096)
    overwrite("layouts/packed/pack/rank0.bin", 100, b"garbage!" * 8)
    Path("rand.yaml").write_bytes(bytes(range(128, 256)) * 16)
    np.save("edge_index.npy", np.array([[0, 1], [1, 2]]))
    (Path(shutil.copytree("layouts/split", "layouts/split-nocluster")) / "cluster.json").unlink()
    owners = Path(shutil.copytree("layouts/split", "layouts/split-cut")) / "owners.npy"
    owners.write_bytes(owners.read_bytes()[:100])
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
    set_nan_features(copy_dataset("nanfeat"))
    garbage = copy_layout("layouts/other", "garbage") / "shards" / "ssd0.shard"
    garbage.write_bytes(b"\xff" * garbage.stat().st_size)  # every float NaN
    edit_layout_index(copy_layout("layouts/other", "edited"))
    copy_layout("layouts/packed", "foreignpack")  # its pack/ is replaced by layouts/foreign's (AFTER_INPUTS)
    Path("prices.yaml").write_text("devices:\n  P5510: {price_usd: 1000, date: 2025-01, source: me}\n")
    write_yaml("cluster.yaml", {"servers": [{"profile": "paper-machine-b", "inventory": "4xA100-PCIe-40GB,8xP5510",
                                             "count": 2}], "network": {"nic": "CX6-Dx-100GbE", "switch_gbit": 100}})
    os.symlink("nowhere", "dangling")
    Path("badutf.json").write_bytes(b'{"profile": "paper-machine-b\xff"}')
    Path("broken.form").write_bytes(b"xx")  # a form without its boundary
    for name, body in SERVICE_BODIES.items():
        Path(name).write_text(json.dumps(body))
    write_clusters_31()
    write_stop68_inputs()
    shutil.copytree("data/ds", "served/datasets/ds")


def write_stop68_inputs() -> None:
    """Ids written as the user wrote them, a header of unknown names, a bzip2 table, damaged hotness counts, a
    machine whose CPU drives less than its slots say, a cluster machine named as a split's own file, an XML
    entity bomb and a truth value for a number."""
    Path("padded.txt").write_text("007 7\n7 8\n8 007\n")
    Path("users.csv").write_text("user_a,user_b\nalice,bob\nbob,carol\n")
    Path("edges.txt.bz2").write_bytes(bz2.compress(Path("edges.txt").read_bytes()))
    shutil.copytree("hot128", "hot-negative")
    reads = np.load("hot-negative/feature_reads.npy")
    np.save("hot-negative/feature_reads.npy", np.full_like(reads, -5))
    write_yaml("cpugen.yaml", {"name": "cpugen", "nodes": [
        {"id": "cpu0", "kind": "socket", "model": "Xeon E5-2680 v4", "memory_gib": 256, "memory_bandwidth_gbps": 150},
        {"id": "rc0", "kind": "root_complex", "parent": "cpu0"},
        {"id": "slot1", "kind": "slot", "parent": "rc0", "width": 16, "accepts": ["gpu"], "link": {"gen": 5, "width": 16}},
        *({"id": f"bay{i}", "kind": "slot", "parent": "rc0", "width": 4, "accepts": ["ssd"],
           "link": {"gen": 5, "width": 4}} for i in range(2))]})
    write_yaml("c-owners.yaml", {"servers": [{**_B, "name": "owners.npy"}, {**_B, "name": "m0"}], "network": _NET})
    lol = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10 if i else "lol"}">' for i in range(10))
    Path("bomb.xml").write_text(f'<?xml version="1.0"?><!DOCTYPE system [{lol}]><system>&l9;</system>\n')
    Path("gpus-true.json").write_text(json.dumps({"profile": "paper-machine-b", "gpus": True, "ssds": 8}))


def write_saint_multilabel(root: Path) -> None:
    """A GraphSAINT release whose class map is multi-label, as Yelp's and Amazon's are, and leaves a node out."""
    import scipy.sparse as sp

    root.mkdir()
    sp.save_npz(root / "adj_full.npz", sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], np.float32)))
    np.save(root / "feats.npy", np.ones((3, 4), np.float32))
    (root / "class_map.json").write_text(json.dumps({str(i): [1, 1, 0] for i in range(2)}))
    (root / "role.json").write_text(json.dumps({"tr": [0], "va": [1], "te": [2]}))


def setup(steps: list[str]) -> None:
    for step in steps:
        cmd, _, into = step.partition(" > ")
        code, out, err = run(cmd, TIMEOUT_S)
        if code != 0:
            sys.exit(f"setup failed: {cmd} (exit {code})\n{err}{out}")
        if into:
            Path(into).write_text(out)


def build() -> None:
    for d in ("mnt/nvme0", "mnt/nvme1", "served"):
        Path(d).mkdir(parents=True)
    setup(SETUP)
    write_inputs()
    setup(AFTER_INPUTS)
    shutil.rmtree("layouts/foreignpack/pack")
    shutil.copytree("layouts/foreign/pack", "layouts/foreignpack/pack")


#: facilities some cases need: name -> why it is missing ("" when present)
FACILITIES: dict[str, str] = {}


@contextlib.contextmanager
def full_disk():
    """A tmpfs at full/ that holds one training checkpoint and a half (the next write fills it), for the
    full-disk case; mounting needs root. Unmounted afterwards."""
    ckpt = Path("ckpt/checkpoint.pt").stat().st_size
    Path("full").mkdir()
    size_kib = ckpt * 3 // 2 // 1024
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", "full"],
                           capture_output=True, text=True)
    FACILITIES["full-disk"] = "" if mount.returncode == 0 else (
        f"cannot mount a small tmpfs ({mount.stderr.strip() or 'needs root'})")
    try:
        yield
    finally:
        if mount.returncode == 0:
            subprocess.run(["umount", "full"], check=False)


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


def request(method: str, url: str, body: bytes | None = None, timeout: float = TIMEOUT_S,
            ctype: str = "application/json", host: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method,
                                 headers={"content-type": ctype, **({"host": host} if host else {})})
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


def run_killed(cmd: str, sig: str, ready: str, timeout: float) -> tuple[int | None, str, str, list[int]]:
    """Run `cmd`; once `ready` matches a file, send it `sig`: (exit status, stdout, stderr, the pids of
    the processes it started that outlived it, which are then killed)."""
    args, env = argv(cmd)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(args, env=env, stdout=out, stderr=err, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout
        family: set[int] = set()
        try:
            while not glob.glob(ready) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if p.poll() is None and glob.glob(ready):
                family = set(descendants(p.pid)) - {p.pid}
                os.kill(p.pid, getattr(signal, sig))
                p.wait(timeout=60)
                end = time.monotonic() + 20
                while any(alive(c) for c in family) and time.monotonic() < end:
                    time.sleep(0.2)
            left = [c for c in family if alive(c)]
        finally:
            for pid in [p.pid, *family]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            code = p.wait()
        out.seek(0)
        err.seek(0)
        return (code if family else None), out.read(), err.read(), left


def flood(base: str, n: int, path: str, body: bytes) -> tuple[int, str]:
    """`n` concurrent POSTs of `body` to `path` while /v1/health is asked every 0.1 s: (200 when every
    health answer came within FLOOD_HEALTH_S, else 0; what happened, in words)."""
    codes: list[int] = []
    health: list[float] = []
    done = threading.Event()

    def post() -> None:
        try:
            codes.append(request("POST", base + path, body, timeout=600)[0])
        except OSError:
            codes.append(0)

    def probe() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            try:
                request("GET", base + "/v1/health", timeout=30)
            except OSError:
                pass
            health.append(time.monotonic() - t0)
            time.sleep(0.1)

    prober = threading.Thread(target=probe)
    prober.start()
    posts = [threading.Thread(target=post) for _ in range(n)]
    for t in posts:
        t.start()
    for t in posts:
        t.join()
    done.set()
    prober.join()
    worst = max(health, default=float("inf"))
    within = f"within {FLOOD_HEALTH_S:g} s" if worst <= FLOOD_HEALTH_S else f"NOT within {FLOOD_HEALTH_S:g} s"
    counts = ", ".join(f"{c} x{codes.count(c)}" for c in sorted(set(codes)))
    return (200 if worst <= FLOOD_HEALTH_S else 0), f"health {within} (slowest {worst:.2f} s); plans: {counts}"


def half(base: str, path: str, body: bytes, timeout: float) -> tuple[int, str]:
    """POST `path` declaring all of `body` but sending half of it, then wait: (status, body) of the answer
    (0 and what happened when none came before `timeout`)."""
    host, port = urllib.parse.urlsplit(base).hostname, urllib.parse.urlsplit(base).port
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(head + body[:len(body) // 2])
        answer = b""
        try:
            while got := s.recv(65536):
                answer += got
        except TimeoutError:
            return 0, f"no answer within {timeout:g} s ({len(answer)} bytes)"
    status, _, rest = answer.partition(b"\r\n\r\n")
    return int(status.split()[1]), rest.decode(errors="replace")


def poll_job(base: str, path: str, body: bytes, timeout: float) -> tuple[int, str]:
    """POST a job, then GET it until it ends: (200 when it finished, its status otherwise; the last answer)."""
    code, text = request("POST", base + path, body)
    if code != 202:
        return code, text
    job = json.loads(text)["id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, text = request("GET", f"{base}/v1/jobs/{job}")
        if json.loads(text)["state"] in ("done", "failed", "cancelled", "interrupted"):
            return (200 if json.loads(text)["state"] == "done" else 500), text
        time.sleep(0.5)
    return 0, f"job {job} did not end within {timeout:.0f} s: {text}"


@dataclass
class Outcome:
    code: int | None  # exit status or HTTP status (None: no answer)
    output: str
    first: str  # the output's first line worth showing
    left: tuple[int, ...] = ()  # processes that outlived a killed command
    skipped: str = ""  # why the case could not run here


@contextlib.contextmanager
def rendezvous_around(case: Case, cmd: str, services: Services):
    """`cmd` with its rendezvous placeholders filled in, and what they need running meanwhile (see Case)."""
    held = socket.socket()
    beside = None
    stop = threading.Event()
    try:
        if "{held}" in cmd + (case.beside or ""):
            held.bind(("127.0.0.1", 0))
            held.listen(8)
        fill = {"{rdzv}": f"127.0.0.1:{free_port('127.0.0.1')}", "{held}": f"127.0.0.1:{held.getsockname()[1]}"}
        if "{http}" in cmd:
            fill["{http}"] = services.url("serve").removeprefix("http://")
        for k, v in fill.items():
            cmd = cmd.replace(k, v)
        if case.beside:
            other = case.beside
            for k, v in fill.items():
                other = other.replace(k, v)
            args, env = argv(other)
            beside = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True)
            if case.beside_kill:
                def kill_when_ready() -> None:
                    while not stop.wait(0.2):
                        if glob.glob(case.beside_kill):
                            os.kill(beside.pid, signal.SIGKILL)
                            return

                threading.Thread(target=kill_when_ready, daemon=True).start()
        yield cmd
    finally:
        stop.set()
        held.close()
        if beside is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(beside.pid, signal.SIGKILL)
            beside.wait()


def execute(case: Case, services: Services, captured: dict[str, str]) -> Outcome:
    """Run one case."""
    if case.needs and FACILITIES.get(case.needs, "unknown facility"):
        return Outcome(None, "", "", skipped=FACILITIES.get(case.needs, "unknown facility"))
    cmd = case.cmd
    for name, value in captured.items():
        cmd = cmd.replace("{" + name + "}", value)
    if case.via is None:
        left: list[int] = []
        with rendezvous_around(case, cmd, services) as cmd:
            if case.kill:
                code, out, err, left = run_killed(cmd, *case.kill, case.timeout)
            else:
                code, out, err = run(cmd, case.timeout)
        errors = [line for line in (err + "\n" + out).splitlines() if line.startswith("error")]
        lines = [line.strip() for line in err.splitlines() + out.splitlines() if line.strip()]
        if case.capture and (m := re.search(case.capture[1], out + err)):
            captured[case.capture[0]] = m.group(1)
        return Outcome(code, out + err, (errors or lines or [""])[0], tuple(left))
    method, *words = cmd.split()
    count = int(words.pop(0)) if method == "FLOOD" else 0
    path, *rest = words
    body = Path(rest[0].removeprefix("@")).read_bytes() if rest else None
    try:
        base = services.url(case.via)
        if method == "JOB":
            code, text = poll_job(base, path, body, case.timeout)
        elif method == "FLOOD":
            code, text = flood(base, count, path, body or b"")
        elif method == "HALF":
            code, text = half(base, path, body or b"", case.timeout)
        else:
            code, text = request(method, base + path, body, ctype=case.ctype, host=case.host)
    except (OSError, RuntimeError) as e:
        return Outcome(None, str(e), str(e))
    return Outcome(code, text, text.strip().splitlines()[0] if text.strip() else "")


def flat(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Verdict:
    """A case's verdict ("ok", or "FAIL: why") and the kinds of failure the summary counts: a traceback shown,
    the user's files lost, a refusal expected but the input accepted (silently wrong), no answer in time."""

    text: str
    traceback: bool = False
    lost: bool = False
    silent: bool = False
    hang: bool = False


def judge(case: Case, res: Outcome) -> Verdict:
    if res.skipped:
        return Verdict(f"skipped: {res.skipped}")
    code, output = res.code, res.output
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
    why += [f"{a!r} in the output" for a in case.absent if flat(a) in flat(output)]
    if res.left:
        why.append(f"{len(res.left)} of its processes outlived it")
    if lost:
        why.append(f"lost {', '.join(lost)}")
    if left:
        why.append(f"left {', '.join(left)}")
    return Verdict("FAIL: " + "; ".join(why) if why else "ok", traceback, bool(lost),
                   silent=case.code is None and code == 0, hang=code is None and case.via is None)


def shown(case: Case) -> str:
    """The command as the table shows it: long runs of one character shortened, the server named."""
    cmd = re.sub(r"(\w)\1{29,}", lambda m: f"<{len(m[0])} x {m[1]}>", case.cmd)
    if case.via is not None:
        server = SERVERS[case.via]
        host = f" (Host: {case.host})" if case.host else ""
        cmd += f"{host} at {server.reached_at} of: {server.cmd.format(port='PORT')}"
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
    ok = tracebacks = lost = skipped = silent = hangs = 0
    services = Services()
    captured: dict[str, str] = {}
    with workdir as work:
        Path(work).mkdir(parents=True, exist_ok=True)
        with contextlib.chdir(work):
            print(f"setting up in {work} ...", file=sys.stderr, flush=True)
            build()
            setup_s = time.monotonic() - start
            print("| # | command | exit | first line of output | verdict |\n|---|---|---|---|---|")
            with full_disk():
                try:
                    for i, case in enumerate(cases, 1):
                        res = execute(case, services, captured)
                        v = judge(case, res)
                        verdict = v.text
                        ok += verdict == "ok"
                        skipped += bool(res.skipped)
                        tracebacks += v.traceback
                        lost += v.lost
                        silent += v.silent
                        hangs += v.hang
                        shown_code = "-" if res.code is None else res.code
                        print(f"| {i} | `{cell(shown(case))}` | {shown_code} | {cell(res.first, OUTPUT_CHARS)} "
                              f"| {cell(verdict)} |", flush=True)
                finally:
                    services.stop()
    print(f"\nsetup {setup_s:.0f} s, cases {time.monotonic() - start - setup_s:.0f} s")
    print(f"cases: {len(cases)}  ok: {ok}  tracebacks: {tracebacks}  silent_wrong: {silent}  data_lost: {lost}  "
          f"hangs: {hangs}"
          + (f"  skipped: {skipped}" if skipped else ""))
    return 0 if ok + skipped == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
