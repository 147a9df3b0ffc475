"""bench/epoch.py's arguments and its baselines, on a tiny graph (the measurement itself is the bench)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runtime_data import make_dataset

from moment.errors import MomentError
from moment.runtime.config import TrainConfig, parse_args
from moment.runtime.train import train

REPO = Path(__file__).resolve().parents[1]


def _args(bench_epoch, *argv: str):
    return bench_epoch.parser().parse_args(list(argv))


def test_sizes_default_to_nodes_and_bound_and_are_read_as_pairs(bench_epoch):
    assert bench_epoch.parse_sizes(_args(bench_epoch)) == [(8_000_000, 128, "3GiB")]
    assert bench_epoch.parse_sizes(_args(bench_epoch, "--nodes", "5000", "--memory-bound", "none")) == [(5000, 128, "none")]
    assert bench_epoch.parse_sizes(_args(bench_epoch, "--sizes", "8000000:3GiB, 13000000x256:4GiB", "--dim", "64")) == \
        [(8_000_000, 64, "3GiB"), (13_000_000, 256, "4GiB")]
    for bad in ("8000000", "x:3GiB", "0:3GiB", "8000000:", "8000000:3GiB,8000000:2GiB", "1000x:1GiB", "1000x0:1GiB",
                "1000xy:1GiB"):
        with pytest.raises(MomentError, match="^--sizes: "):
            bench_epoch.parse_sizes(_args(bench_epoch, "--sizes", bad))
    assert len(bench_epoch.parse_sizes(_args(bench_epoch, "--sizes", "1000:1GiB,1000x64:1GiB"))) == 2  # other widths


@pytest.mark.slow
def test_the_pack_is_written_for_the_budget_the_runs_size_their_caches_by(bench_epoch):
    """A run with no bound but a budget of its own (a GPU host's) read no batch as its segment until the pack was
    written for that budget rather than for the layout's CPU bins."""
    assert bench_epoch.run_budget(_args(bench_epoch), 3 << 30) == str(3 << 30)
    assert bench_epoch.run_budget(_args(bench_epoch, "--memory-bound", "none"), None) is None
    for flags in ("--memory-budget 2GiB", "--depth 3 --memory-budget=2GiB"):
        assert bench_epoch.run_budget(_args(bench_epoch, "--moment-args", flags), None) == "2GiB"
        assert bench_epoch.run_budget(_args(bench_epoch, "--moment-args", flags), 3 << 30) == "2GiB"


def test_a_size_below_moments_minimum_is_refused_before_anything_is_built(bench_epoch, tmp_path):
    """The bench asks the runtime's budget rule on the graph alone: a bound below it is refused naming
    this size's least bound, nothing but the graph written; that least bound is the one the runtime's
    own refusal names once the dataset and layout exist."""
    from moment.runtime.sizing import preview_plan
    from moment.workload.graph import GraphDataset

    a = _args(bench_epoch, "--cache-dir", str(tmp_path), "--fanouts", "5,3", "--batch-size", "64", "--hidden", "16",
              "--train-fraction", "0.05")
    with pytest.raises(MomentError) as e:
        bench_epoch.check_feasible(a, 3000, 8, "1MiB")
    need = bench_epoch.minimum_bound(argparse.Namespace(**{**vars(a), "nodes": 3000}), 8)
    assert "a 1.00 MiB bound is below the" in str(e.value) and "Moment's runtime needs for 3000 nodes x 8" in str(e.value)
    assert e.value.hint.startswith(f"a size that runs: 3000x8:{need // 2**20}MiB (features ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph-3000-tf0.05"]  # the graph alone
    bench_epoch.check_feasible(a, 3000, 8, f"{need // 2**20}MiB")  # accepted
    bench_epoch.check_feasible(a, 3000, 8, "none")

    a.nodes, a.dim = 3000, 8
    ds_dir, layout = bench_epoch.build(tmp_path, a)
    cfg = TrainConfig(layout=layout, dataset=ds_dir, memory_budget="1MiB", fanouts=[5, 3], batch_size=64, hidden=16,
                      io_shape="block", cache_policy="static")
    ds = GraphDataset.open(ds_dir)
    with pytest.raises(MomentError) as e:
        preview_plan(cfg, ds, a.nproc)
    assert f"give at least --memory-budget {need // 2**20}MiB" in e.value.hint
    least = bench_epoch.planned_budget(a, 8).minimum()  # to the byte: accepted, one byte less refused
    preview_plan(cfg.model_copy(update={"memory_budget": str(least)}), ds, a.nproc)
    with pytest.raises(MomentError, match="is below the minimum"):
        preview_plan(cfg.model_copy(update={"memory_budget": str(least - 1)}), ds, a.nproc)


def test_the_default_baseline_is_the_dataloader_with_both_readahead_settings(bench_epoch):
    runs = bench_epoch.baseline_runs(_args(bench_epoch))
    assert [name for name, _, _ in runs] == ["baseline_readahead_off", "baseline_readahead_on"]
    (_, off_mode, off), (_, on_mode, on) = runs
    assert "DataLoader, 4 worker processes per rank" in on_mode and "kernel readahead" in on_mode
    assert "MADV_RANDOM" in off_mode
    assert on == ["--features-memmap", "--loader-workers", "4"]
    assert off == ["--features-memmap", "--loader-workers", "4", "--memmap-random"]
    # one setting: one run named `baseline`; the old spelling `--baseline-readahead` still means "on"
    [(name, mode, flags)] = bench_epoch.baseline_runs(_args(bench_epoch, "--baseline-readahead", "--loader-workers", "2"))
    assert name == "baseline" and "2 worker processes" in mode and "--memmap-random" not in flags
    [(_, mode, flags)] = bench_epoch.baseline_runs(_args(bench_epoch, "--baseline", "serial", "--baseline-readahead", "off"))
    assert "serial stages" in mode and flags == ["--features-memmap", "--no-pipeline", "--memmap-random"]
    with pytest.raises(MomentError, match="--loader-workers must be at least 1"):
        bench_epoch.baseline_runs(_args(bench_epoch, "--loader-workers", "0"))


@pytest.mark.parametrize("argv, said", [
    (["--sizes", "8000000"], "error: --sizes: cannot read '8000000'"),
    (["--variants", "rows,bogus"], "error: --variants: unknown variant 'bogus'"),
    (["--loader-workers", "-1"], "error: --loader-workers must be at least 1, got -1"),
    (["--feed-rounds", "0"], "error: --feed-rounds must be at least 1, got 0"),
])
def test_bad_arguments_are_one_line_before_anything_is_built(bench_epoch, tmp_path, capsys, argv, said):
    """Each refusal is a MomentError from `main` (which the script prints as `error: ...`, exit 2: the next
    test runs the script itself), raised before anything is built or printed."""
    cache = tmp_path / "cache"
    with pytest.raises(MomentError) as e:
        bench_epoch.main([*argv, "--cache-dir", str(cache)])
    assert f"error: {e.value}".startswith(said), e.value
    assert capsys.readouterr() == ("", "")
    assert not cache.exists()  # nothing built for a run that cannot start


def test_the_script_says_a_bad_argument_in_one_line_and_exits_2(tmp_path):
    """The script's own process: a MomentError is one `error:` line on stderr, no traceback, exit status 2."""
    cache = tmp_path / "cache"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "epoch.py"), "--sizes", "8000000", "--cache-dir",
                        str(cache)], capture_output=True, text=True, env=dict(os.environ), timeout=120, check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: --sizes: cannot read '8000000'") and "Traceback" not in r.stderr, r.stderr
    assert not cache.exists()


@pytest.mark.slow
def test_the_bench_baselines_train_the_same_batches_on_a_tiny_graph(bench_epoch, tmp_path):
    """Each baseline run the bench starts (DataLoader workers with and without readahead, the serial one)
    trains the same batches: equal loss curves, every row read from the memmap."""
    ds = make_dataset(tmp_path, 1500, 16)
    common = ["--dataset", str(ds.path), "--epochs", "1", "--fanouts", "5,3", "--hidden", "16", "--batch-size", "64",
              "--threads", "1", "--quiet"]
    runs = bench_epoch.baseline_runs(_args(bench_epoch, "--loader-workers", "2")) + \
        bench_epoch.baseline_runs(_args(bench_epoch, "--baseline", "serial", "--baseline-readahead", "off"))
    out = {name + str(i): train(parse_args([*flags, *common])) for i, (name, _, flags) in enumerate(runs)}
    curves = [m["loss_curve"] for m in out.values()]
    assert len(curves[0]) > 1 and all(c == curves[0] for c in curves[1:])
    assert [m["loader_workers"] for m in out.values()] == [2, 2, 0]
    assert len({m["tier_rows"]["memmap"] for m in out.values()}) == 1


@pytest.mark.slow
def test_a_run_past_its_deadline_is_stopped_with_its_dataloader_workers(bench_epoch, tmp_path):
    """The slower readahead setting is cut short: torchrun, its rank and the rank's DataLoader workers
    (each rank leads its own process group) are all gone when `run` returns."""
    ds = make_dataset(tmp_path, 1500, 16)
    out = tmp_path / "m.json"
    args = ["--features-memmap", "--loader-workers", "2", "--dataset", str(ds.path), "--epochs", "2000",
            "--fanouts", "5,3", "--hidden", "16", "--batch-size", "64", "--threads", "1"]
    m = bench_epoch.run("deadline", 1, args, out, cold=[], bound=None, deadline=8)
    assert m == {"stopped_after_s": 8}
    assert not _running_with(str(ds.path))


def test_a_baseline_setting_is_stopped_at_the_cap_or_past_the_faster_one(bench_epoch):
    """A baseline setting runs until 1.1x the faster finished one's whole run, or the cap (--baseline-cap
    seconds) when that comes first; the first runs to the cap alone, and with no cap unbounded."""
    assert bench_epoch.baseline_deadline({}, None) == (None, False)
    assert bench_epoch.baseline_deadline({}, 600.0) == (600.0, True)
    assert bench_epoch.baseline_deadline({"off": {"process_s": 100.0}}, 600.0) == (pytest.approx(110.0), False)
    assert bench_epoch.baseline_deadline({"off": {"process_s": 100.0}}, None) == (pytest.approx(110.0), False)
    assert bench_epoch.baseline_deadline({"off": {"process_s": 900.0}, "on": {"process_s": 700.0}}, 600.0) == \
        (600.0, True)
    assert _args(bench_epoch).baseline_cap == 1200 and _args(bench_epoch, "--baseline-cap", "0").baseline_cap == 0


def test_an_in_memory_run_is_stopped_past_twice_the_fastest_so_far(bench_epoch):
    """Only a run that cannot be the limit is cut short, and the first one is never (nothing to compare)."""
    assert bench_epoch.memory_run_deadline({}) is None
    done = {"memory_moment": {"process_s": 12.0}, "memory_pagecache": {"process_s": 9.5}}
    assert bench_epoch.memory_run_deadline(done) == bench_epoch.SLOWER_IN_MEMORY * 9.5 == 19.0


def _running_with(arg: str) -> list[str]:
    out = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = p.read_bytes()
        except OSError:  # it exited meanwhile
            continue
        if arg.encode() in cmd:
            st = (p.parent / "status").read_text() if (p.parent / "status").exists() else ""
            out.append(f"{p.parent.name} " + " ".join(ln for ln in st.splitlines() if ln.startswith(("State", "PPid")))
                       + " " + cmd.decode(errors="replace")[:80])
    return out


def test_the_in_memory_runs_are_those_memory_can_hold(bench_epoch):
    """Moment's own in-memory run holds a copy per rank, the page-cache runs one for all: each is left out,
    with a line saying why, when memory cannot hold its copies; the worker baseline's run is the same
    DataLoader as the baseline's, warm."""
    a = _args(bench_epoch, "--loader-workers", "3")
    gib = 2**30
    runs, skipped = bench_epoch.memory_runs(a, 4 * gib, 23 * gib)
    assert [n for n, _, _ in runs] == ["memory_moment", "memory_pagecache", "memory_loader"] and not skipped
    assert [f for _, _, f in runs] == [["--features-in-memory"], ["--features-memmap"],
                                       ["--features-memmap", "--loader-workers", "3"]]
    runs, skipped = bench_epoch.memory_runs(a, 16 * gib, 23 * gib)  # 2 copies do not fit, one does
    assert [n for n, _, _ in runs] == ["memory_pagecache", "memory_loader"]
    assert skipped == ["memory_moment_skipped: --features-in-memory holds a copy per rank, 2 x 16.0 GiB, over 80% "
                       "of the 23.0 GiB available (the page-cache runs hold one copy for all ranks)"]
    runs, skipped = bench_epoch.memory_runs(a, 30 * gib, 23 * gib)
    assert runs == [] and len(skipped) == 2 and skipped[1].startswith("memory_pagecache_skipped: the 30.0 GiB")


def test_the_limit_runs_beside_moments_run_before_the_baseline_with_two_steady_epochs(bench_epoch, tmp_path,
                                                                                      monkeypatch):
    """`limit_ratio` divides Moment's steady epoch by the in-memory one's: they run one after the other, not
    with the baseline's minutes between them (this machine's speed drifts over minutes), and by default every
    run has two steady epochs to average."""
    ds, layout = tmp_path / "ds", tmp_path / "L"
    ds.mkdir()
    (layout / "shards").mkdir(parents=True)
    np.save(ds / "features.npy", np.zeros((4, 2), np.float32))
    order = []
    m = {"epoch_seconds": [2.0, 1.0, 1.0], "process_s": 9.0, "loss_curve": [1.0]}
    monkeypatch.setattr(bench_epoch, "build", lambda cache, a: (ds, layout))
    monkeypatch.setattr(bench_epoch, "check_disk", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "ensure_pack", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "predicted_hit_rate", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "report", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "run", lambda name, *a, **k: order.append(name) or dict(m))
    monkeypatch.setattr(bench_epoch, "in_memory_limit",
                        lambda *a, **k: order.append("limit") or (1.0, ["--features-in-memory"]))
    a = _args(bench_epoch, "--variants", "", "--baseline-readahead", "off", "--cache-dir", str(tmp_path))
    assert a.epochs == 3
    ok, figures = bench_epoch.run_size(a, 100, 2, "none")
    assert ok and order == ["moment", "limit", "baseline"], order
    assert figures["limit_ratio"] == 1.0 and figures["speedup"] == 1.0


def test_the_feed_rate_counts_the_train_epochs_reads_and_says_what_the_cpu_side_allows(bench_epoch, tmp_path,
                                                                                        monkeypatch, capsys):
    """The data-only SSD rate is Moment's reads in its train epochs (`epoch_ssd_bytes`), not `ssd_bytes_read`,
    which counts validation's reads too, over every epoch and over the steady ones; its ceiling on these cores is
    the steady epoch's bytes at the in-memory run's pace, each against fio's replay; beside them, Moment's CPU per
    steady epoch over the in-memory run's."""
    ds, layout = tmp_path / "ds", tmp_path / "L"
    (layout / "shards").mkdir(parents=True)
    ds.mkdir()
    (ds / "indptr.npy").write_bytes(b"")
    mo = {"epoch_seconds": [3.0, 1.0, 1.0], "epoch_ssd_bytes": [400e6, 300e6, 300e6], "ssd_bytes_read": 1.5e9,
          "disk_bytes_read": 2e9, "seeds_per_s": 2000.0, "features": "tiered", "limiting_stage": "gather",
          "ssd_requests": 10, "ssd_request_sizes": [], "config": {"queue_depth": 64}}
    mo["epoch_cpu_seconds"] = [5.0, 1.8, 2.2]
    mem = {"epoch_seconds": [1.0, 0.5, 0.5], "disk_bytes_read": 0, "seeds_per_s": 9000.0, "features": "memory",
           "epoch_cpu_seconds": [2.0, 1.0, 1.0]}
    base = {"epoch_seconds": [10.0, 10.0, 10.0], "disk_bytes_read": 3e9, "seeds_per_s": 200.0, "features": "memmap"}
    got = {"data_only_moment": mo, "data_only_baseline": base, "data_only_in_memory": mem}
    monkeypatch.setattr(bench_epoch, "run", lambda name, *a, **k: dict(got[name]))
    monkeypatch.setattr(bench_epoch, "mix_limit", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "replay_limit", lambda *a, **k: 1e9)  # fio: 1,000 MB/s
    a = _args(bench_epoch, "--cache-dir", str(tmp_path))
    out = bench_epoch.feed_rate(a, ds, layout, None, [], [], [], [], "_x")
    assert out["data_only_ssd_over_fio"] == pytest.approx(1e9 / 5.0 / 1e9)  # 1 GB in 5 s, not 1.5 GB
    assert out["data_only_ssd_over_fio_steady"] == pytest.approx(0.3)  # 300 MB in a 1 s steady epoch
    assert out["data_only_cpu_ceiling_over_fio"] == pytest.approx(0.6)  # 300 MB at the in-memory 0.5 s
    assert out["data_only_seeds_ratio"] == 10.0 and out["data_only_limit_ratio"] == 2.0
    assert out["data_only_cpu_ratio"] == pytest.approx(2.0)  # 2 CPU-s a steady epoch against 1
    printed = capsys.readouterr().out
    assert "data_only_moment_ssd_MB_per_s: 200 " in printed and "data_only_moment_ssd_MB_per_s_steady: 300 " in printed


def test_the_feed_rate_replays_the_reads_an_earlier_run_of_the_same_command_kept_before_it_runs(bench_epoch, tmp_path,
                                                                                                monkeypatch, capsys):
    """fio replays the run's reads right after it, and right before it those an earlier run of the same command
    kept (its seeds fix them); the bracketed ratio is over the mean of both. A run of another command replays
    nothing before: its kept reads are not this run's."""
    ds, layout = tmp_path / "ds", tmp_path / "L"
    (layout / "shards").mkdir(parents=True)
    ds.mkdir()
    (ds / "indptr.npy").write_bytes(b"")
    mo = {"epoch_seconds": [3.0, 1.0, 1.0], "epoch_ssd_bytes": [400e6, 300e6, 300e6], "disk_bytes_read": 2e9,
          "seeds_per_s": 2000.0, "features": "tiered", "limiting_stage": "gather", "ssd_requests": 10,
          "ssd_request_sizes": [], "config": {"queue_depth": 64}}

    def run(name, nproc, args, *a, **k):  # the run's traces, as `--io-trace` writes them
        where = Path(args[args.index("--io-trace") + 1])
        where.mkdir(parents=True, exist_ok=True)
        for r in range(nproc):
            (where / f"rank-{r}.iolog").write_text(f"fio version 2 iolog\nrank {r}\n")
        return dict(mo)

    rates, replayed = iter([1e9, 2e9, 1e9, 3e9]), []
    monkeypatch.setattr(bench_epoch, "run", run)
    monkeypatch.setattr(bench_epoch, "mix_limit", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "replay_limit",
                        lambda traces, depth, label="fio_replay": replayed.append((label, depth)) or next(rates))
    a = _args(bench_epoch, "--cache-dir", str(tmp_path / "cache"), "--feed-rounds", "1")
    first = bench_epoch.feed_rate(a, ds, layout, None, ["--epochs", "3"], [], None, None, "_x")
    assert "data_only_ssd_over_fio_bracketed_steady" not in first and replayed == [("fio_replay", 64)]
    assert "no earlier run of this command kept its reads" in capsys.readouterr().out
    again = bench_epoch.feed_rate(a, ds, layout, None, ["--epochs", "3"], [], None, None, "_x")
    assert replayed[1:] == [("fio_replay_before", 64), ("fio_replay", 64)]
    assert again["data_only_ssd_over_fio_steady"] == pytest.approx(0.3)  # 300 MB/s against the 1,000 after
    assert again["data_only_ssd_over_fio_bracketed_steady"] == pytest.approx(0.2)  # against the mean, 1,500
    other = bench_epoch.feed_rate(a, ds, layout, None, ["--epochs", "2"], [], None, None, "_x")
    assert replayed[3:] == [("fio_replay", 64)] and "data_only_ssd_over_fio_bracketed_steady" not in other


def test_the_feed_rate_runs_rounds_each_bracketed_by_replays_and_takes_the_median(bench_epoch, tmp_path,
                                                                                  monkeypatch, capsys):
    """Each round is a cold data-only run followed by fio's replay of its reads; the replay after a round is the
    one before the next (the same reads), the first round's the kept reads'; the fio ratios are the medians over
    the rounds, printed with each, and every other line is the first round's."""
    ds, layout = tmp_path / "ds", tmp_path / "L"
    (layout / "shards").mkdir(parents=True)
    ds.mkdir()
    (ds / "indptr.npy").write_bytes(b"")
    steady = iter([300e6, 600e6, 450e6])  # the rounds' steady epochs' SSD bytes (1 s each)

    def run(name, nproc, args, *a, **k):
        where = Path(args[args.index("--io-trace") + 1])
        assert not where.exists()  # each round's traces are its own
        where.mkdir(parents=True)
        for r in range(nproc):
            (where / f"rank-{r}.iolog").write_text(f"fio version 2 iolog\nrank {r}\n")
        b = next(steady)
        return {"epoch_seconds": [3.0, 1.0, 1.0], "epoch_ssd_bytes": [400e6, b, b], "disk_bytes_read": 2e9,
                "seeds_per_s": b / 1e5, "features": "tiered", "limiting_stage": "gather", "ssd_requests": 10,
                "ssd_request_sizes": [{"from_bytes": 1 << 20, "requests": 10, "bytes": 10 << 20}],
                "config": {"queue_depth": 64}}

    rates = {"fio_replay": iter([1e9, 2e9, 1e9]), "fio_replay_in_flight": iter([1.5e9, 1.5e9, 3e9])}
    replayed = []
    monkeypatch.setattr(bench_epoch, "run", run)
    monkeypatch.setattr(bench_epoch, "mix_limit", lambda *a, **k: None)
    monkeypatch.setattr(bench_epoch, "replay_limit",
                        lambda traces, depth, label="fio_replay": replayed.append((label, depth)) or next(rates[label]))
    a = _args(bench_epoch, "--cache-dir", str(tmp_path / "cache"), "--feed-rounds", "3")
    out = bench_epoch.feed_rate(a, ds, layout, None, ["--epochs", "3"], [], None, None, "_x")
    # nothing kept before the first round; after each, at the queue depth, then at the reader's 32 in flight
    assert replayed == [("fio_replay", 64), ("fio_replay_in_flight", 32)] * 3
    # after: 300/1000, 600/2000, 450/1000 -> 0.3, 0.3, 0.45; bracketed (rounds 2 and 3): 600/1500, 450/1500
    assert out["data_only_ssd_over_fio_steady"] == pytest.approx(0.3)
    assert out["data_only_ssd_over_fio_bracketed_steady"] == pytest.approx(0.35)
    assert out["data_only_ssd_over_fio_in_flight_steady"] == pytest.approx(0.2)  # 0.2, 0.4, 0.15
    printed = capsys.readouterr().out
    assert "each round 0.300, 0.300, 0.450" in printed and "each round 0.400, 0.300" in printed
    assert "at the 32 reads per rank" in printed and "each round 0.200, 0.400, 0.150" in printed
    assert printed.count("data_only_round: ") == 3 and "data_only_moment_seeds_per_s: 3000" in printed


def test_the_reader_depth_is_its_windows_over_the_mean_read_at_most_the_queue_depth(bench_epoch):
    """fio replays at the reads a rank's reader can hold at once: its windows' bytes over the run's mean read."""
    def m(sizes, depth=128):
        return {"ssd_request_sizes": sizes, "config": {"queue_depth": depth}}
    mib = [{"from_bytes": 1 << 20, "requests": 100, "bytes": 100 << 20}]
    held = bench_epoch.INFLIGHT * bench_epoch.WINDOW // (1 << 20)
    assert bench_epoch.reader_depth(m(mib)) == held
    assert bench_epoch.reader_depth(m(mib, depth=8)) == 8  # never more than the queue depth
    small = [{"from_bytes": 4096, "requests": 1000, "bytes": 4096 * 1000}]
    assert bench_epoch.reader_depth(m(small)) == 128
    assert bench_epoch.reader_depth(m([])) is None and bench_epoch.reader_depth({}) is None


def test_the_cpu_ratio_is_left_out_where_the_in_memory_runs_cpu_is_not_all_counted(bench_epoch):
    """A rank's `epoch_cpu_seconds` is its own process's: DataLoader workers' CPU is not in it, so against an
    in-memory run with workers (the worker baseline, when it is the limit) there is no CPU ratio, in training and
    in the feed rate alike."""
    mo, mem = {"epoch_cpu_seconds": [5.0, 1.8, 2.2]}, {"epoch_cpu_seconds": [2.0, 1.0, 1.0], "loader_workers": 0}
    assert bench_epoch.cpu_ratio(mo, mem) == pytest.approx(2.0)
    assert bench_epoch.cpu_ratio(mo, {**mem, "loader_workers": 4}) is None
    assert bench_epoch.cpu_ratio({}, mem) is None


def test_steady_epochs_leave_out_the_first(bench_epoch):
    assert bench_epoch.steady_s({"epoch_seconds": [5.0, 2.0, 3.0]}) == 2.5
    assert bench_epoch.steady_s({"epoch_seconds": [4.0]}) == 4.0
    assert bench_epoch.steady([9.0, 1.0, 2.0]) == 1.5  # the same rule for any figure per epoch (CPU seconds)


def test_the_disks_busy_rate_is_over_the_steady_epochs_of_the_first_machine(bench_epoch):
    """The SSD devices' reads, busy seconds and epoch seconds after the first epoch, summed over the first
    machine's devices; none where no device read or none was watched."""
    d = {"spans": [[9, 900, 9.0, 9.0], [2, 200, 0.1, 0.5], [3, 400, 0.3, 0.5]]}
    e = {"spans": [[1, 100, 1.0, 9.0], [1, 100, 0.1, 0.5], [1, 100, 0.1, 0.5]]}
    other = {"spans": [[1, 10**9, 1.0, 1.0]] * 3}
    m = {"machines": [{"disks": [d, e]}, {"disks": [other]}]}
    assert bench_epoch.disk_busy(m) == pytest.approx((800, 0.6, 2.0, 2))
    assert bench_epoch.disk_busy({"machines": [{"disks": [{"spans": [[1, 100, 0.5, 1.0]]}]}]}) == (100, 0.5, 1.0, 1)
    assert bench_epoch.disk_busy({"machines": [{"disks": [{"spans": [[0, 0, 0.0, 1.0]] * 2}]}]}) is None
    assert bench_epoch.disk_busy({"machines": [{"disks": []}]}) is None and bench_epoch.disk_busy({}) is None


def test_the_disk_count_sees_a_childs_cold_reads_and_not_warm_ones(bench_epoch, tmp_path):
    """`disk_bytes_read` (the memmap baseline's SSD bytes) is what the run's processes read from disk,
    counted by the kernel and handed up as each is reaped: a grandchild's read of a file dropped from the
    page cache counts, the same read while cached does not."""
    mounts = [ln.split() for ln in Path("/proc/mounts").read_text().splitlines()]
    fstype = max((m for m in mounts if str(tmp_path).startswith(m[1])), key=lambda m: len(m[1]))[2]
    if fstype in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory ({fstype}): nothing is read from a disk")
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(8 << 20))
    os.sync()
    reader = tmp_path / "read.py"
    reader.write_text(f"open({str(f)!r}, 'rb').read()")
    inner = f"import subprocess, sys; subprocess.run([sys.executable, {str(reader)!r}])"
    got = []
    for warm in (False, True):
        if not warm:
            bench_epoch.drop_files(f)
        before = bench_epoch.bytes_read()
        subprocess.run([sys.executable, "-c", inner], check=True, timeout=60)
        got.append(bench_epoch.bytes_read() - before)
    assert got[0] >= 8 << 20 and got[1] < 1 << 20, got


def test_fio_reads_the_files_at_the_given_request_size(bench_epoch, tmp_path, monkeypatch):
    if not shutil.which("fio"):
        pytest.skip("fio is not installed (apt-get install fio)")
    files = [tmp_path / "a", tmp_path / "b"]
    for f in files:
        f.write_bytes(os.urandom(4 << 20))
    monkeypatch.setattr(bench_epoch, "FIO_SECONDS", 1)
    r = bench_epoch.fio_limit(files, 6000, 4, 2)
    assert r is not None and r["bs"] == 6144 and r["jobs"] == 2 and r["depth"] == 4
    assert r["bw_bytes"] > 0 and r["iops"] > 0


def test_the_fio_mix_keeps_the_size_classes_that_matter(bench_epoch):
    """Size classes with at least half a percent of the requests or of the bytes are read by fio at their
    mean request (512-B multiples); the others join the nearest kept class, nothing is lost."""
    sizes = [{"from_bytes": 512, "requests": 1000, "bytes": 512 * 1000},
             {"from_bytes": 4096, "requests": 2, "bytes": 2 * 5000},  # 0.2% of requests, 0.003% of bytes
             {"from_bytes": 1 << 20, "requests": 10, "bytes": 10 * (1 << 20) + 10 * 300_000}]
    mix = bench_epoch.size_mix(sizes)
    assert [bs for bs, _, _ in mix] == [512, 1348608]  # 4 KiB joined 512 B (nearer than 1 MiB)
    assert [n for _, n, _ in mix] == [1002, 10] and sum(b for _, _, b in mix) == sum(x["bytes"] for x in sizes)


def test_a_bound_reports_what_it_took_back(bench_epoch, tmp_path):
    """A run's memory cgroup names the file pages it evicted and read again (the bench prints them beside the
    peak: a bound that evicts the ranks' own code slows every stage, not only the reads)."""
    why = bench_epoch.cgroup_problem()
    if why:
        pytest.skip(why)
    data = tmp_path / "f"
    with open(data, "wb") as f:
        f.write(os.urandom(64 << 20))
        os.fsync(f.fileno())  # clean pages: dirty ones stay in the page cache (this process's) despite the advice
    cg = bench_epoch.MemoryBound("test", 32 << 20)
    try:
        # read the file twice through the page cache under a 32 MiB bound: the second pass reads evicted pages
        read = (f"import os; fd = os.open({str(data)!r}, os.O_RDONLY); "
                "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); "
                "any(not os.pread(fd, 1 << 20, off) for _ in range(2) for off in range(0, 64 << 20, 1 << 20))")
        subprocess.run(cg.wrap([sys.executable, "-c", read]), check=True, timeout=60)
        got = cg.reclaim()
    finally:
        cg.close()
    assert set(got) == {"workingset_refault_file", "pgmajfault", "pgpgout"}
    # the second pass read again most of what the first read: more pages than the bound holds
    assert got["workingset_refault_file"] > (32 << 20) // 4096 and got["pgpgout"] > 0


def test_a_disk_check_reads_a_layout_file_and_says_when_the_disk_slowed(bench_epoch, tmp_path, capsys):
    """The check reads a real file with direct I/O (the largest of those given; none: no figure), in 1 MiB reads
    and in random 4 KiB ones, and a size whose end's rate or IOPS is under half its start's is flagged, naming
    which."""
    assert bench_epoch.disk_rate([tmp_path / "missing"]) is None and bench_epoch.disk_iops([tmp_path / "x"]) is None
    small, big = tmp_path / "ssd0.rows", tmp_path / "ssd1.rows"
    small.write_bytes(b"\0" * 4096)
    big.write_bytes(os.urandom(8 << 20))
    start = bench_epoch.check_disk([small, big], "start", "_8000000")
    out = capsys.readouterr().out.splitlines()
    rate, iops = start
    assert rate > 0 and iops > 0
    assert out[0].startswith(f"disk_MB_per_s_at_start_8000000: {rate:.0f}  ")
    assert out[1].startswith(f"disk_4k_iops_at_start_8000000: {iops:.0f}  ") and len(out) == 2  # not slowed
    # IOPS a million times below the start's; the rate a million times above it (a real disk's second read may
    # well take twice as long as its first: the start's own rate flaked here once, 679 MB/s against 1686)
    bench_epoch.check_disk([big], "end", "", start=(rate / 1e6, iops * 1e6))
    out = capsys.readouterr().out
    assert "\ndisk_slowed: " in out and "4 KiB reads/s at the end" in out and "MB/s at the end" not in out
    bench_epoch.check_disk([big], "end", "", start=(rate * 1e6, iops * 1e6))
    out = capsys.readouterr().out
    assert "MB/s at the end" in out and "4 KiB reads/s at the end" in out
