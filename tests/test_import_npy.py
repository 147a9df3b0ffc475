"""`.npy` imports: edge_index in either layout, ids or masks for the split, dtype and shape checks naming
the file, and features larger than the import's memory bound streamed through in chunks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moment.errors import MomentError
from moment.workload.import_npy import import_npy
from moment.workload.importers import EdgePolicy, import_notices

ROOT = Path(__file__).resolve().parents[1]
N, D = 30, 4
RNG = np.random.default_rng(5)
EDGES = np.concatenate([np.unique(RNG.integers(0, N, size=(80, 2)), axis=0), [[2, 2], [4, 5], [4, 5]]])
FEAT = RNG.standard_normal((N, D))  # float64: stored as float32
LABELS = RNG.integers(0, 3, N)


def save(tmp: Path, **arrays: np.ndarray) -> dict[str, Path]:
    out = {}
    for name, a in arrays.items():
        np.save(tmp / f"{name}.npy", a)
        out[name] = tmp / f"{name}.npy"
    return out


def rows_of(ds) -> dict[int, list[int]]:
    ip, ix = np.asarray(ds.indptr), np.asarray(ds.indices)
    return {v: ix[ip[v] : ip[v + 1]].tolist() for v in range(ds.num_nodes)}


def test_both_layouts_ids_and_masks(tmp_path: Path) -> None:
    train = np.zeros(N, bool)
    train[:10] = True
    f = save(tmp_path, ecols=EDGES.T.astype(np.int32), erows=EDGES, x=FEAT, y=LABELS[:, None], train=train,
             val=np.arange(10, 20), test=np.arange(20, 30, dtype=np.uint16))
    a = import_npy(tmp_path / "a", edge_index=f["ecols"], x=f["x"], y=f["y"], train_idx=f["train"],
                   val_idx=f["val"], test_idx=f["test"], policy=EdgePolicy(duplicates="keep"))
    b = import_npy(tmp_path / "b", edge_index=f["erows"], x=f["x"], y=f["y"], train_idx=f["train"],
                   val_idx=f["val"], test_idx=f["test"], policy=EdgePolicy(duplicates="keep"))
    a.verify()
    assert rows_of(a) == rows_of(b) and a.num_edges == len(EDGES)
    assert rows_of(a)[5].count(4) >= 2  # the duplicate kept
    assert a.features_memmap().dtype == np.float32
    np.testing.assert_allclose(a.features_memmap(), FEAT.astype(np.float32))
    np.testing.assert_array_equal(a.labels, LABELS)
    np.testing.assert_array_equal(a.train_idx, np.arange(10))
    np.testing.assert_array_equal(a.test_idx, np.arange(20, 30))
    s = a.manifest.source
    assert s["importer"] == "npy" and s["split"] == "given" and not s["generated_features"]
    loops, dups = int((EDGES[:, 0] == EDGES[:, 1]).sum()), len(EDGES) - len(np.unique(EDGES, axis=0))
    assert loops >= 1 and dups >= 1
    assert (s["self_loops_found"], s["duplicate_edges_found"], s["duplicate_edges_dropped"]) == (loops, dups, 0)
    # no x, y or split: generated (seeded) and said; the node count from --num-nodes
    c = import_npy(tmp_path / "c", edge_index=f["ecols"], num_nodes=N + 5, feature_dim=3, seed=1)
    assert c.num_nodes == N + 5 and c.manifest.source["split"] == "random" and c.manifest.source["generated_labels"]


def test_a_negative_or_nan_label_is_an_unlabelled_node_in_no_split_and_counted(tmp_path: Path) -> None:
    ints, floats = LABELS.copy(), LABELS.astype(np.float64)
    ints[[3, 7]] = [-1, -3]
    floats[[3, 7]] = [np.nan, -2.0]
    f = save(tmp_path, e=EDGES.T.copy(), yi=ints, yf=floats)
    for name in ("yi", "yf"):
        ds = import_npy(tmp_path / name, edge_index=f["e"], y=f[name])
        assert ds.labels[3] == ds.labels[7] == -1 and ds.manifest.source["unlabelled_nodes"] == 2
        assert not {3, 7} & set(np.concatenate([ds.train_idx, ds.val_idx, ds.test_idx]).tolist())
        assert "2 nodes have no label (a negative label or NaN in the input): they are in no split" in \
            import_notices(ds.manifest.source)
    whole = import_npy(tmp_path / "whole", edge_index=f["e"])
    assert "unlabelled_nodes" not in whole.manifest.source  # said only where there are some


def test_bad_arrays_name_the_file(tmp_path: Path) -> None:
    f = save(tmp_path, e=EDGES.T.copy(), x=FEAT, y=LABELS, ids=np.arange(5), fe=EDGES.T.astype(float),
             e3=np.zeros((3, 7), np.int64), xs=np.array([["a"] * D] * N), y3=np.full((N, 3), 2, np.int64),
             short=np.zeros(N - 1, bool), fids=np.arange(5.0), big=np.array([0, N]), x1=FEAT[:, 0].copy(),
             xnan=np.full((N, D), np.nan), ys=LABELS[:-1], overlap=np.arange(3, 8), twice=np.array([1, 1]),
             ystr=np.array(["a"] * N))

    def bad(match: str, name: str, **kw) -> None:
        args = {"edge_index": f["e"]} | kw
        with pytest.raises(MomentError, match=match) as e:
            import_npy(tmp_path / "out", **args)
        assert f"{name}.npy" in str(e.value)
        assert not (tmp_path / "out").exists()

    bad("dtype float64: expected integer node ids", "fe", edge_index=f["fe"])
    bad(r"\[2, E\] or \[E, 2\], got \[3, 7\]", "e3", edge_index=f["e3"])
    bad("features have dtype <U1: expected numbers", "xs", x=f["xs"])
    bad(r"features must be a matrix \[N, D\]", "x1", x=f["x1"])
    bad("NaN or infinity", "xnan", x=f["xnan"])
    bad(r"labels of shape \[30, 3\] are read as multi-label .* node 0's target 0 is 2", "y3", y=f["y3"])
    bad("wrong row count: 29 labels for 30 nodes", "ys", x=f["x"], y=f["ys"])
    bad("labels must be numeric, got <U1", "ystr", y=f["ystr"])  # (bools are a binary target: classes 0 and 1)
    bad("boolean mask of 29 entries for 30 nodes", "short", x=f["x"], train_idx=f["short"], val_idx=f["ids"],
        test_idx=f["ids"])
    bad("dtype float64: expected integer node ids or a boolean mask", "fids", x=f["x"], train_idx=f["fids"],
        val_idx=f["ids"], test_idx=f["ids"])
    bad(f"node id {N} out of range", "big", x=f["x"], train_idx=f["big"], val_idx=f["ids"], test_idx=f["ids"])
    bad("node id 3 is in both the train split", "overlap", x=f["x"], train_idx=f["ids"], val_idx=f["overlap"],
        test_idx=f["ids"])
    bad("listed more than once", "twice", x=f["x"], train_idx=f["twice"], val_idx=f["ids"], test_idx=f["ids"])
    bad("missing features file", "nothing", x=tmp_path / "nothing.npy")
    (tmp_path / "corrupt.npy").write_bytes(b"\x93NUMPY garbage")
    bad("not a readable .npy file", "corrupt", x=tmp_path / "corrupt.npy")
    (tmp_path / "text.npy").write_text("0,1\n1,2\n")  # numpy would call it pickled data
    bad(r"not a .npy file: it does not begin with NumPy's header \(its first bytes: b'0,1\\n1,'\)", "text",
        edge_index=tmp_path / "text.npy")
    with pytest.raises(MomentError, match="missing --val-idx, --test-idx"):
        import_npy(tmp_path / "out", edge_index=f["e"], train_idx=f["ids"])


def test_a_uint64_edge_id_beyond_int64_is_named_as_it_is(tmp_path: Path) -> None:
    """A uint64 id of 2^63 was cast first and named -9223372036854775808; uint64 ids in range import as int64."""
    wide = EDGES.T.astype(np.uint64)
    wide[1, 3] = 2**63
    f = save(tmp_path, wide=wide, fine=EDGES.T.astype(np.uint64), x=FEAT)
    with pytest.raises(MomentError, match=rf"wide\.npy: destination node id {2**63} out of range \[0, {N}\)"):
        import_npy(tmp_path / "out", edge_index=f["wide"], x=f["x"])
    a = import_npy(tmp_path / "a", edge_index=f["fine"], x=f["x"], policy=EdgePolicy(duplicates="keep"),
                   undirected=True)
    b = import_npy(tmp_path / "b", edge_index=save(tmp_path, e=EDGES.T.copy())["e"], x=f["x"],
                   policy=EdgePolicy(duplicates="keep"), undirected=True)
    assert rows_of(a) == rows_of(b)


def test_a_mask_saved_as_integers_is_named_a_mask(tmp_path: Path) -> None:
    """torch's `.numpy()` of a uint8 mask (DGL's older masks) was "node id 0 is listed more than once" alone."""
    m = np.zeros(N, np.uint8)
    m[:10] = 1
    f = save(tmp_path, e=EDGES.T.copy(), x=FEAT, tm=m, ids=np.arange(10, 20))
    with pytest.raises(MomentError, match=rf"tm\.npy: node id 0 is listed more than once in the train split "
                                          rf"\(28 repeats\): {N} entries of 0 and 1 look like a mask") as e:
        import_npy(tmp_path / "out", edge_index=f["e"], x=f["x"], train_idx=f["tm"], val_idx=f["ids"], test_idx=f["ids"])
    assert e.value.hint == "save a mask as booleans (mask.astype(bool)): an integer array is node ids"


# --------------------------------------------------------------------------------------------- bounded memory

BIG_ROWS, BIG_DIM = 655_360, 128  # float32: 320 MiB of features
BOUND = 128 << 20  # memory the import may take beyond what the process held when it started

#: the import in a child process: its private memory bounded (RLIMIT_DATA: every private writable mapping,
#: where features read whole would have to live) unless a cgroup bounds it; prints what it measured
_CHILD = """
import json, os, resource, sys, threading, time
from moment.workload.import_npy import import_npy

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
peak = [0]
def sample():
    while True:
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.002)
threading.Thread(target=sample, daemon=True).start()
time.sleep(0.05)
base = status("RssAnon")
bound, mode, out, edges, x, y = sys.argv[1:]
if mode == "rlimit":
    resource.setrlimit(resource.RLIMIT_DATA, (status("VmData") + int(bound), resource.RLIM_INFINITY))
ds = import_npy(out, edge_index=edges, x=x, y=y)
assert "torch" not in sys.modules  # (a .npy import needs numpy only)
print(json.dumps({"base_anon": base, "peak_anon": peak[0], "vm_hwm": status("VmHWM"), "rows": ds.num_nodes}))
"""


LIMIT = BOUND + (96 << 20)  # the cgroup's limit: the interpreter and numpy, plus the bound


def _memory_cgroup_v1() -> tuple[Path | None, str]:
    """A fresh child of this process's cgroup v1 memory group (which charges page cache too), or None and why."""
    try:
        rel = next(ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                   if ln.split(":")[1] == "memory")
        child = Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / f"moment-import-test-{os.getpid()}"
        child.mkdir()
        (child / "memory.limit_in_bytes").write_text(str(LIMIT))
        if (child / "memory.memsw.limit_in_bytes").exists():
            with contextlib.suppress(OSError):
                (child / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
        return child, ""
    except (OSError, StopIteration, IndexError) as e:
        return None, f"cannot make a cgroup v1 memory group here: {e}"


def _memory_cgroup() -> tuple[Path | None, str]:
    """A fresh child of this process's cgroup v2 group with the memory controller (else of its cgroup v1 memory
    group), or None and why not."""
    try:
        mounts = [ln.split() for ln in Path("/proc/mounts").read_text().splitlines()]
        root = next((Path(m[1]) for m in mounts if m[2] == "cgroup2"), None)
        if Path("/sys/fs/cgroup/memory").is_dir():  # cgroup v1's memory controller (a hybrid machine's)
            return _memory_cgroup_v1()
        if root is None:
            return None, "no cgroup file system with a memory controller is mounted"
        rel = next(ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::"))
        own = root / rel.lstrip("/")
        if "memory" not in (own / "cgroup.controllers").read_text().split():
            return None, (f"the cgroup v2 group {own} has no memory controller (it offers "
                          f"{(own / 'cgroup.controllers').read_text().split() or 'none'}; memory is on cgroup v1 here)")
        if "memory" not in (own / "cgroup.subtree_control").read_text().split():
            (own / "cgroup.subtree_control").write_text("+memory")
        child = own / f"moment-import-test-{os.getpid()}"
        child.mkdir()
        (child / "memory.max").write_text(str(LIMIT))
        if (child / "memory.swap.max").exists():
            (child / "memory.swap.max").write_text("0")
        return child, ""
    except (OSError, StopIteration) as e:
        return None, f"cannot make a cgroup v2 memory group here: {e}"


def test_features_larger_than_the_memory_bound_import_in_chunks(tmp_path: Path) -> None:
    src = tmp_path / "x.npy"
    x = np.lib.format.open_memmap(src, mode="w+", dtype=np.float32, shape=(BIG_ROWS, BIG_DIM))
    step = 65_536
    for s in range(0, BIG_ROWS, step):
        x[s : s + step] = (np.arange(s, min(s + step, BIG_ROWS), dtype=np.float32)[:, None]
                           + np.arange(BIG_DIM, dtype=np.float32) / BIG_DIM)
    x.flush()
    del x
    size = src.stat().st_size
    assert size > 2 * BOUND  # features read whole could not fit
    e = np.random.default_rng(0).integers(0, BIG_ROWS, size=(2, 50_000))
    np.save(tmp_path / "e.npy", e)
    np.save(tmp_path / "y.npy", np.arange(BIG_ROWS) % 7)
    cg, why = _memory_cgroup()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")

    def enter() -> None:
        if cg is not None:
            (cg / "cgroup.procs").write_text(str(os.getpid()))

    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(BOUND), "cgroup" if cg else "rlimit",
                            str(tmp_path / "out"), str(tmp_path / "e.npy"), str(src), str(tmp_path / "y.npy")],
                           capture_output=True, text=True, env=env, timeout=120, preexec_fn=enter)
        peak = next((int((cg / f).read_text()) for f in ("memory.peak", "memory.max_usage_in_bytes")
                     if cg is not None and (cg / f).exists()), None)
    finally:
        if cg is not None:
            cg.rmdir()
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(r.stdout.strip().splitlines()[-1])
    grew = m["peak_anon"] - m["base_anon"]
    how = f"cgroup {cg} limit {LIMIT >> 20} MiB (peak {peak})" if cg else f"RLIMIT_DATA (no cgroup: {why})"
    print(f"features {size / 2**20:.0f} MiB, bound {BOUND >> 20} MiB by {how}: private memory grew "
          f"{grew / 2**20:.0f} MiB (sampled), peak RSS {m['vm_hwm'] / 2**20:.0f} MiB incl. mapped file pages")
    assert grew < BOUND
    if peak is not None:  # the cgroup charged everything (page cache too) and the import stayed within it
        assert peak <= LIMIT < size
    from moment.workload.graph import GraphDataset

    ds = GraphDataset.open(tmp_path / "out")
    got = ds.features_memmap()
    for row in (0, 12_345, BIG_ROWS - 1):
        np.testing.assert_array_equal(got[row], row + np.arange(BIG_DIM, dtype=np.float32) / BIG_DIM)
