"""Training across machines, as two torchrun agents on 127.0.0.1 (never another address), each with its own
layout directory: the same loss curve as one agent with the same number of ranks, restarts across agents,
a split layout's rows fetched from their owner bit for bit, and machines that do not belong together
stopped with one message and no hang. Every test here launches agents: all slow."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_data import TRAIN_ARGS, make_split

from moment import testpoints
from moment.runtime import agent
from moment.runtime.collective_trace import TRACE_ENV, check
from moment.runtime.rendezvous import Rendezvous

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(argv, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Wait for every agent; on a timeout kill them all and fail (a hang is a failure), saying which of their
    processes were still there and what each agent printed."""
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            sessions = ",".join(str(q.pid) for q in procs)  # each started in its own session
            tree = subprocess.run(["ps", "--sid", sessions, "-o", "pid,ppid,stat,etime,args"], capture_output=True,
                                  text=True).stdout
            for q in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(q.pid, signal.SIGKILL)
            said = [(q.communicate()[1] or "")[-3000:] for q in procs]
            raise AssertionError(f"an agent hung; the processes left:\n{tree}\nwhat each agent said:\n" +
                                 "\n---\n".join(said)) from None
        out.append((p.returncode, o, e))
    return out


def agents(layouts: list[Path], tmp: Path, *args: str, timeout_s: int = 120, env: dict | None = None,
           extra: list[list[str]] | None = None) -> list[tuple[int, str, str]]:
    """`moment train --nnodes N --node-rank K` for each layout K (its own run directory), machine 0 first (as on a
    cluster, where the endpoint is machine 0's: its agent hosts the rendezvous)."""
    port = free_port()
    procs = []
    for k in range(len(layouts)):
        procs.append(start([sys.executable, "-m", "moment", "train", "--nnodes", str(len(layouts)), "--node-rank",
                            str(k), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", str(timeout_s),
                            "--run-dir", str(tmp / f"runs{k}"), "--layout", str(layouts[k]), *args,
                            *((extra or [[]] * len(layouts))[k])], env))
    return finish(procs)


def test_two_agents_train_as_one_agent_with_two_ranks_and_restart_together(runtime_layout, two_rank_run, tmp_path):
    """Machine 1's rank is killed after its fifth step: both agents restart their ranks (torchrun's rendezvous),
    every rank resumes from machine 0's checkpoint, and the curve is the uninterrupted one-agent run's."""
    own = shutil.copytree(runtime_layout, tmp_path / "L1")  # machine 1's own layout directory
    out = tmp_path / "m.json"
    (a, oa, ea), (b, ob, eb) = agents([runtime_layout, own], tmp_path, *TRAIN_ARGS, "--epochs", "2", "--quiet",
                                      "--max-restarts", "1", "--metrics-json", str(out),
                                      env={testpoints.EXIT_ENV: "train-step:5"})
    assert a == 0 and b == 0, ea + eb
    assert "Traceback" not in ea + eb
    assert "rank 1 died (exit code 1); torchrun restarts the ranks (restart 1 of 1)" in " ".join(eb.split())
    m = json.loads(out.read_text())  # written by rank 0, on machine 0
    assert m["world_size"] == 2 and m["nnodes"] == 2 and m["restarts"] == 1 and 0 < m["resumed_from_step"] < 5
    assert f"resumed from step {m['resumed_from_step']}" in " ".join(ea.split())
    assert [x["ranks"] for x in m["machines"]] == [[0], [1]]
    assert Path(m["checkpoint_dir"]).parent.parent == tmp_path / "runs0"
    np.testing.assert_allclose(m["loss_curve"], two_rank_run["loss_curve"], rtol=1e-6)


def test_two_agents_train_a_split_layout_with_the_curve_of_the_whole_one(split_layout, two_rank_run, runtime_dataset,
                                                                        tmp_path):
    """Each machine holds its part; the rows it lacks come from the other: the first epoch's curve is the
    whole layout's (two_rank_run: 2 ranks on one machine), and each machine reports its remote rows and bytes."""
    out = tmp_path / "m.json"
    # each machine its own options where they may differ: only machine 0 asks for the metrics, machine 1 is quiet
    (a, _, ea), (b, _, eb) = agents([split_layout / "m0", split_layout / "m1"], tmp_path, *TRAIN_ARGS, "--epochs",
                                    "1", "--predict-nodes", "val",
                                    extra=[["--metrics-json", str(out), "--predict", str(tmp_path / "val.csv")],
                                           ["--quiet", "--predict", str(tmp_path / "m1-val.csv")]],
                                    env={TRACE_ENV: str(tmp_path / "trace")})
    assert a == 0 and b == 0, ea + eb
    # every collective of each rank from its training thread, in one order: the remote tier's rounds too
    calls = [json.loads((tmp_path / "trace" / f"collectives-rank{r}.json").read_text())["calls"] for r in (0, 1)]
    assert check(calls) == []
    assert all(sum(c["op"] == "all_to_all_single" and c["async"] for c in cs) > 5 for cs in calls), calls
    m = json.loads(out.read_text())
    np.testing.assert_allclose(m["loss_curve"], two_rank_run["loss_curve"][:8], rtol=1e-6)
    m0, m1 = m["machines"]
    rb = json.loads((split_layout / "m0" / "manifest.json").read_text())["row"]["row_bytes"]
    assert (m0["machine"], m1["machine"]) == ("m0", "m1")
    for x, other in ((m0, m1), (m1, m0)):
        assert 0.1 < x["remote_share"] < 0.6 and x["remote_bytes"] == x["remote_rows"] * rb
        assert x["remote_served_rows"] == other["remote_rows"]  # what one fetched, the other served
    assert m["tier_rows"]["remote"] == m0["remote_rows"] + m1["remote_rows"]
    assert "machines: node 0 (m0): " in " ".join(ea.split())  # rank 0's summary
    # --predict: the validation nodes' classes, their rows read from both machines, score the reported accuracy;
    # rank 0 writes them (machine 1's path is its own, and stays unwritten)
    ds = runtime_dataset
    node, cls = np.loadtxt(tmp_path / "val.csv", delimiter=",", skiprows=1, usecols=(0, 1), dtype=np.int64).T
    np.testing.assert_array_equal(node, ds.val_idx)
    assert (cls == np.asarray(ds.labels)[node]).mean() == m["val_accuracy"]
    assert not (tmp_path / "m1-val.csv").exists()


def test_two_agents_fetch_a_split_layouts_rows_bit_exact(split_layout, tmp_path):
    port = free_port()
    procs = []
    for k in (1, 0):
        r = Rendezvous(2, k, "127.0.0.1", port, 120)
        procs.append(start([*agent.COMMAND, *r.torchrun_args(), "--nproc-per-node=1",
                            str(REPO / "tests" / "split_ranks.py"), str(split_layout), str(tmp_path)], r.env()))
    for code, o, e in finish(procs):
        assert code == 0, o[-2000:] + e[-4000:]
    seen = [json.loads((tmp_path / f"machine{k}.json").read_text()) for k in (0, 1)]
    n = 4000
    for k, s in enumerate(seen):
        assert s["rows_checked"] >= n and s["remote_rows_checked"] == s["remote_rows"] > 0
        assert s["served"] == seen[1 - k]["remote_rows"]
        assert 0 < s["exchange_peak"] <= s["exchange_charged"]  # the budget's charge bounds what a round held


def test_a_scripts_own_torchrun_pairs_the_machines_by_their_split_parts(split_layout, tmp_path):
    """examples/own_loop.py under a user's `torchrun --nnodes 2` on a split's parts: c10d ignores --node-rank and
    numbers the agents by their own order (here machine 1's, started first, was often node 0), and the run was
    refused, telling the user to change a --node-rank given right (hunt-E 3). The parts say which machine each is."""
    port = free_port()
    procs = []
    for k in (1, 0):
        r = Rendezvous(2, k, "127.0.0.1", port, 120)  # its env (MOMENT_NODE_RANK, `moment train`'s) not given
        procs.append(start([*agent.COMMAND, *r.torchrun_args(), f"--node-rank={k}", "--nproc-per-node=1",
                            str(REPO / "examples" / "own_loop.py"), str(split_layout / f"m{k}"), "1"]))
    (c1, o1, e1), (c0, o0, e0) = finish(procs)
    assert c0 == 0 and c1 == 0, e0[-3000:] + e1[-3000:]
    assert "moment: summary" in o0 + e0 and "moment: summary" not in o1 + e1  # rank 0 is machine 0's


def test_machines_of_two_splits_stop_with_one_message(split_layout, runtime_dataset, tmp_path):
    """Machine 1 gives its part of another split of the same dataset: every rank refuses, rank 0 says why once,
    and both agents end (no rank waits for a peer that left)."""
    other = make_split(runtime_dataset, tmp_path / "S2", replicate="30%")
    (a, _, ea), (b, _, eb) = agents([split_layout / "m0", other / "m1"], tmp_path, *TRAIN_ARGS)
    assert a == 2 and b != 0, ea + eb
    said = " ".join(ea.split())
    assert said.count("the machines' layouts are not of one split") == 1 and "Traceback" not in ea + eb, ea + eb
    # machine 1 says the reason too: its user reads its own screen, not machine 0's
    assert b == 2 and " ".join(eb.split()).count("the machines' layouts are not of one split") == 1, eb


def test_two_machines_giving_one_node_rank_both_say_so(runtime_layout, tmp_path):
    own = shutil.copytree(runtime_layout, tmp_path / "L1")
    port = free_port()
    procs = [start([sys.executable, "-m", "moment", "train", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                    f"127.0.0.1:{port}", "--rdzv-timeout", "30", "--run-dir", str(tmp_path / f"runs{k}"), "--layout",
                    str(layout), *TRAIN_ARGS]) for k, layout in enumerate([runtime_layout, own])]
    for code, _, e in finish(procs, timeout=120):
        assert code == 2 and " ".join(e.split()).count("two machines gave --node-rank 0") == 1, e
        assert "Traceback" not in e and "its own messages say why" not in e, e


def test_a_machine_that_cannot_start_leaves_the_others_waiting_only_until_the_rendezvous_timeout(split_layout,
                                                                                               tmp_path):
    (a, _, ea), (b, _, eb) = agents([split_layout / "m0", tmp_path / "missing"], tmp_path, *TRAIN_ARGS,
                                    timeout_s=2)
    assert b == 2 and "layout directory not found" in eb and "Traceback" not in eb, eb
    assert a != 0, ea
    said = " ".join(ea.split())
    assert "not all 2 machines joined the rendezvous at 127.0.0.1:" in said and "within 2 s" in said, ea
    assert "Traceback" not in ea


def train_at(endpoint: str, layout: Path, tmp: Path, timeout_s: int = 1) -> subprocess.Popen:
    """One agent, machine 1 of 2, joining the rendezvous at `endpoint`."""
    return start([sys.executable, "-m", "moment", "train", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                  endpoint, "--rdzv-timeout", str(timeout_s), "--run-dir", str(tmp / "runs"), "--layout", str(layout),
                  *TRAIN_ARGS])


def test_an_endpoint_held_by_another_program_stops_the_agent_at_the_rdzv_timeout(runtime_layout, tmp_path):
    """A listener that never speaks (not a torch store) holds the port: torchrun would wait on it for minutes;
    --rdzv-timeout bounds the whole join, and the message says what answered at HOST:PORT."""
    import time

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(8)
        endpoint = f"127.0.0.1:{held.getsockname()[1]}"
        t0 = time.monotonic()
        p = train_at(endpoint, runtime_layout, tmp_path)
        [(code, _, err)] = finish([p], timeout=60)
    said = " ".join(err.split())
    assert code != 0 and time.monotonic() - t0 < 45, err
    assert f"the rendezvous endpoint {endpoint} answered but is not a rendezvous" in said, err
    assert "within 1 s (--rdzv-timeout)" in said and "Traceback" not in err, err
    assert not running_with(endpoint)  # torchrun did not outlive the agent


def running_with(word: str) -> list[int]:
    """The processes whose command line holds `word`."""
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and word.encode() in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except OSError:
            pass
    return out


def test_the_rendezvous_probe_names_what_is_at_the_endpoint(monkeypatch):
    """At the deadline the launcher says whether HOST:PORT refused, answered as something else, or is a store."""
    import time

    from moment.cli import train_launch
    from moment.cli.train_launch import probe_endpoint

    port = free_port()
    assert "cannot be reached (connection refused)" in probe_endpoint(Rendezvous(2, 1, "127.0.0.1", port, 3))
    with socket.socket() as held, monkeypatch.context() as m:
        m.setattr(train_launch, "PROBE_S", 1)  # how long the probe waits for the silent listener to answer
        held.bind(("127.0.0.1", 0))
        held.listen(8)
        r = Rendezvous(2, 1, "127.0.0.1", held.getsockname()[1], 3)
        t0 = time.monotonic()
        assert "answered but is not a rendezvous" in probe_endpoint(r)
        # torch's client ignores its timeout there: the probe, killed PROBE_S after it loaded torch, not at the
        # bound of a probe that never loads (PROBE_LOAD_S + PROBE_S)
        assert time.monotonic() - t0 < train_launch.PROBE_LOAD_S
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    # a store answers at once; the probe's interpreter loading torch first has PROBE_LOAD_S of its own
    assert "not all 2 machines joined the rendezvous" in probe_endpoint(Rendezvous(2, 1, "127.0.0.1", store.port, 3))


def test_a_machine_killed_mid_run_is_the_one_the_other_names(runtime_layout, tmp_path):
    """Agent 1 dies (SIGKILL) once training runs: machine 0 names machine 1 as gone, never itself."""
    import time

    own = shutil.copytree(runtime_layout, tmp_path / "L1")
    port = free_port()
    procs = [start([sys.executable, "-m", "moment", "train", "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint",
                    f"127.0.0.1:{port}", "--rdzv-timeout", "30", "--run-dir", str(tmp_path / f"runs{k}"), "--layout",
                    str(layout), *TRAIN_ARGS, "--epochs", "100000", "--quiet"])
             for k, layout in enumerate([runtime_layout, own])]
    end = time.monotonic() + 90
    while not list(tmp_path.glob("runs0/*/checkpoint/*")) and time.monotonic() < end:
        time.sleep(0.2)
    os.kill(procs[1].pid, signal.SIGKILL)
    [(a, _, ea)] = finish(procs[:1], timeout=90)
    finish(procs[1:], timeout=10)
    said = " ".join(ea.split())
    assert a != 0 and "machine 1 stopped or cannot be reached" in said, ea
    assert "machine 0" not in said and "Traceback" not in ea, ea
