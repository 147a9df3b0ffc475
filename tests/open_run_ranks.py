"""One rank of tests/test_open_run.py's 2-rank runs of a user's own loop (`moment.open_run`), under torchrun
(gloo on CPU, the peer tier on: rows of the other rank's GPU bin come through the exchange rounds).

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/open_run_ranks.py SCENARIO[,...] LAYOUT OUT

uneven: rank 1 breaks out of its train loader after one batch and makes 2 feature-store lookups where rank 0
makes 5; every row either reads is checked against the dataset. vanish: rank 1 exits after its first batch
without closing the run; rank 0 records the error it gets. vanish-late: both ranks train an epoch, then rank 1
exits without closing; rank 0 records what each of the run's own collectives then says (memory, a loss check, a
write's gather, close). bad-output: both ranks write predictions and embeddings whose scores are wrong on rank 1
alone; each records the errors it gets (every rank must raise the same, at the same gather). own-group: as uneven, in a process group the
script made itself, which must outlive the run. untracked: a model in `run.ddp` trained on both ranks, its loss
tracked on rank 0 alone (as logging code does); each rank records the error it gets at the first check. skipped:
the same with the script's own DDP, rank 0 skipping one step's track. spare-head: a model in `run.ddp` with
a head its loss does not use, given DDP's `find_unused_parameters=True`. take-turns: loaders and lookups inside a
train loop, zip over two loaders, a train iterator left part-way (`take_turns`). abandon: rank 1 leaves with `abandon()`
inside its train loop, closes the loader and lingers 4 s before it goes on; rank 0 trains on and records when it
heard.
evaluate-alone: both ranks train an epoch, then rank 0 alone evaluates and looks rows up while rank 1 waits at a
barrier (PyG's `if rank == 0: test()`), then runs an inference pass over its share of every node
(`loader(nodes=...)`), and reads the whole val split and every node (`shard=False`); the other GPU's rows come
from rank 0's own tiers. Each rank
writes OUT/rank<R>.json, or for several scenarios
in one launch (run one after the other in the same ranks: one torch start-up; rank 1 opens each run after the
first a second late), OUT/<SCENARIO>/rank<R>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import moment
from moment.errors import MomentError


def main(scenario: str, layout: str, out: Path) -> int:
    if scenario == "own-group":  # the script made the process group: the run uses it and leaves it alive
        import torch.distributed as dist
        import torch_geometric.nn  # noqa: F401 - as a PyG script does, before its group (see dist.import_before_group)

        dist.init_process_group("gloo")
    run = moment.open_run(layout, fanouts=[10, 5], batch_size=64, seed=3, quiet=True, peer_tier="on")
    rank = run.rank
    feats = np.load(run.dataset.file("features"), mmap_mode="r")
    seen = {"rank": rank, "world_size": run.world_size, "batches": 0, "bad_rows": 0}

    def check(ids: torch.Tensor, x: torch.Tensor) -> None:
        want = torch.from_numpy(np.asarray(feats[ids.numpy()]))
        seen["bad_rows"] += int((x.cpu() != want).any(dim=1).sum())

    try:
        if scenario == "untracked":
            untracked(run, seen)
        elif scenario == "evaluate-alone":
            evaluate_alone(run, seen, check)
        elif scenario == "bad-output":
            bad_output(run, seen, out)
        elif scenario == "vanish-late":
            vanish_late(run, seen, out)
        elif scenario == "skipped":
            skipped(run, seen)
        elif scenario == "spare-head":
            spare_head(run, seen)
        elif scenario == "abandon":
            abandon(run, seen)
        elif scenario == "take-turns":
            take_turns(run, seen, check)
        else:
            for batch in run.loader("train", 0):
                check(batch.n_id, batch.x)
                seen["batches"] += 1
                if rank == 1:
                    if scenario == "vanish":
                        os._exit(0)  # no close: the other rank must hear it as Moment's error, not gloo's
                    break
            for batch in run.loader("val", 0):
                check(batch.n_id, batch.x)
            store = run.feature_store
            g = torch.Generator().manual_seed(rank)
            for _ in range(5 if rank == 0 else 2):
                ids = torch.randint(0, run.num_nodes, (300,), generator=g)
                check(ids, store["node", "x", ids])
            seen["summary"] = run.close()
            if scenario == "own-group":
                import torch.distributed as dist

                seen["group_alive"] = dist.is_initialized()
                dist.barrier()
                dist.destroy_process_group()
    except MomentError as e:
        seen["error"] = str(e)
        run.abandon()
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    return 0


def evaluate_alone(run: moment.Run, seen: dict, check) -> None:
    """Both ranks train an epoch; rank 0 alone evaluates (the val loader, lookups, a nodes loader) while rank 1
    waits at a barrier, as PyG's multi-GPU examples do; then both close."""
    import torch.distributed as dist

    for batch in run.loader("train", 0):
        check(batch.n_id, batch.x)
        seen["batches"] += 1
    if run.rank == 0:
        before = run.summary()["tier_rows"]
        for batch in run.loader("val", 0):
            check(batch.n_id, batch.x)
            seen["val_batches"] = seen.get("val_batches", 0) + 1
        ids = torch.arange(run.num_nodes)
        check(ids, run.feature_store["node", "x", ids])
        for batch in run.loader(nodes=slice(None)):  # an inference pass, alone: the rank's share of every node
            check(batch.n_id, batch.x)
            seen["inferred"] = seen.get("inferred", 0) + batch.batch_size
        after = run.summary()["tier_rows"]
        seen["alone_rows"] = {t: after[t] - before[t] for t in after}
        # shard=False: the whole split, and every node, on this rank alone, in order
        seen["val_whole"] = []
        for batch in run.loader("val", 0, shard=False):
            check(batch.n_id, batch.x)
            seen["val_whole"] += batch.n_id[: batch.batch_size].tolist()
        seen["nodes_whole"] = []
        for batch in run.loader(nodes=slice(None), shard=False):
            check(batch.n_id, batch.x)
            seen["nodes_whole"] += batch.n_id[: batch.batch_size].tolist()
    dist.barrier()
    seen["summary"] = run.close()


def sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch) -> torch.Tensor:
    """One step of `model` on `batch`'s seeds, the scenarios' training step; its loss."""
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(batch.x.float())[: batch.batch_size], batch.y)
    loss.backward()
    opt.step()
    return loss


def take_turns(run: moment.Run, seen: dict, check) -> None:
    """A model in `run.ddp` stepped on every train batch, with the val loader inside the train loop (rank 0 alone
    reading the whole split too, shard=False), a feature-store lookup between two steps, zip over the train and val
    loaders, and a train iterator left after one batch while the next epoch trains, then finished; no memory budget
    (each waited for ever): every row exact, every batch of each train epoch read once."""
    model = run.ddp(torch.nn.Linear(run.feature_dim, run.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen["val_batches"], seen["want"] = 0, 0

    def step(batch) -> None:
        check(batch.n_id, batch.x)
        run.track(sgd_step(model, opt, batch))
        seen["batches"] += 1

    def evaluate(loader) -> None:
        with torch.no_grad():
            for batch in loader:
                check(batch.n_id, batch.x)
                seen["val_batches"] += 1

    train = run.loader("train", 0)
    seen["want"] += len(train)
    for i, batch in enumerate(train):
        step(batch)
        if i == 1:
            evaluate(run.loader("val", 0))
            if run.rank == 0:
                evaluate(run.loader("val", 0, shard=False))
        if i == 2:
            ids = torch.arange(0, run.num_nodes, 7)
            check(ids, run.feature_store["node", "x", ids])
    pairs = zip(run.loader("train", 1), run.loader("val", 1))
    seen["want"] += min(len(run.loader("train", 1)), len(run.loader("val", 1)))
    for batch, v in pairs:
        step(batch)
        check(v.n_id, v.x)
    left = iter(run.loader("train", 2))
    step(next(left))
    for batch in run.loader("train", 3):
        step(batch)
    for batch in left:
        step(batch)
    seen["want"] += len(run.loader("train", 2)) + len(run.loader("train", 3))
    seen["summary"] = run.close()


def vanish_late(run: moment.Run, seen: dict, out: Path) -> None:
    """Both ranks train an epoch in step; rank 1 then exits without close(); rank 0 records each collective's
    error: the run's own (DistContext's), not the feature exchange's."""
    model = torch.nn.Linear(run.feature_dim, run.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in run.loader("train", 0):
        run.track(sgd_step(model, opt, batch))
        seen["batches"] += 1
    if run.rank == 1:
        os._exit(0)  # no close: rank 0's next collectives must say so as Moment does
    seen["errors"] = {}
    for name, call in [("memory", run.memory), ("track", lambda: (run.track(0.5), run.sync_losses())),
                       ("write_embeddings", lambda: run.write_embeddings(
                           out / "e.npy", lambda b: b.x.float()[: b.batch_size], nodes=[1, 2, 3])),
                       ("close", run.close)]:
        try:
            call()
            seen["errors"][name] = None
        except MomentError as e:
            seen["errors"][name] = str(e)
        except Exception as e:  # noqa: BLE001 - recorded: the test says which call leaked gloo's words
            seen["errors"][name] = f"{type(e).__name__}: {e}"
    run.abandon()


#: bad-output's cases: (name, write, function of the batch, the rank and the classes); rank 1 alone gives a bad
#: result
BAD_OUTPUT = [
    ("width", "write_predictions", lambda b, r, c: torch.zeros(b.batch_size, 20 if r == 1 else c)),
    # node 5 is rank 1's (every other node from the rank's); rank 0's node 8 comes after it in the pass's order
    ("nan", "write_predictions", lambda b, r, c: torch.zeros(b.batch_size, c).masked_fill(
        ((b.n_id[: b.batch_size] == 5) | (b.n_id[: b.batch_size] == 8))[:, None], float("nan"))),
    ("ragged", "write_embeddings", lambda b, r, c: torch.zeros(b.batch_size, 3 + b.index * r)),
    ("ranks-widths", "write_embeddings", lambda b, r, c: torch.zeros(b.batch_size, 3 + 2 * r)),
]


def bad_output(run: moment.Run, seen: dict, out: Path) -> None:
    seen["errors"] = {}
    for name, write, fn in BAD_OUTPUT:
        try:
            suffix = ".npy" if write == "write_embeddings" else ".csv"
            getattr(run, write)(out / f"{name}{suffix}", lambda b: fn(b, run.rank, run.num_classes),  # noqa: B023
                                nodes=slice(0, 300))
            seen["errors"][name] = None
        except MomentError as e:
            seen["errors"][name] = str(e)
    seen["summary"] = run.close()


def untracked(run: moment.Run, seen: dict) -> None:
    """A model in DDP stepped on both ranks, its loss tracked on rank 0 alone; ends with the run closed."""
    model = run.ddp(torch.nn.Linear(run.feature_dim, run.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen["steps"] = 0
    for batch in run.loader("train", 0):
        loss = sgd_step(model, opt, batch)
        seen["steps"] += 1
        if run.rank == 0:
            run.track(loss)
    run.close()


def spare_head(run: moment.Run, seen: dict) -> None:
    """A model in `run.ddp` with a head its loss does not use, told so (`find_unused_parameters=True`, DDP's own
    option): both ranks train the epoch (without it DDP stops at the second step); an option the run owns is
    refused by name."""
    from user_models import SpareHead

    try:
        run.ddp(torch.nn.Linear(2, 2), device_ids=[0])
    except MomentError as e:
        seen["refused"] = str(e)
    model = run.ddp(SpareHead(run.feature_dim, run.num_classes), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen["steps"] = 0
    for batch in run.loader("train", 0):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch.x.float(), batch.edge_index)[: batch.batch_size],
                                                 batch.y)
        loss.backward()
        opt.step()
        run.track(loss)
        seen["steps"] += 1
    seen["summary"] = run.close()


def abandon(run: moment.Run, seen: dict) -> None:
    """Rank 1 abandons the run inside its train loop (as a script does on an error of its own), lets go of the
    loader (`seen["close_error"]`: what that raised) and lingers; rank 0 trains on until it hears
    (`seen["heard_s"]`: seconds after its first batch)."""
    first = time.monotonic()
    batches = iter(run.loader("train", 0))
    try:
        for _ in batches:
            seen["batches"] += 1
            if run.rank == 1:
                run.abandon()
                try:
                    batches.close()
                except Exception as e:  # noqa: BLE001 - recorded: closing a loader of an abandoned run says nothing
                    seen["close_error"] = f"{type(e).__name__}: {e}"
                time.sleep(4)
                return
    finally:
        seen["heard_s"] = time.monotonic() - first


def skipped(run: moment.Run, seen: dict) -> None:
    """A model in the script's own DDP (not `run.ddp`), rank 0 skipping the `track` of one step: the train
    loader's end compares the ranks' counts (it met an all-reduce of another length, read as a NaN loss)."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(run.feature_dim, run.num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen["steps"] = 0
    for batch in run.loader("train", 0):
        sgd_step(model, opt, batch)
        seen["steps"] += 1
        if not (run.rank == 0 and batch.index == 2):
            run.track(1.0)
    run.close()


if __name__ == "__main__":
    scenarios = sys.argv[1].split(",")
    for i, name in enumerate(scenarios):
        if i and os.environ.get("RANK") == "1":
            time.sleep(1)  # rank 0 opens its next run first: it must not find rank 1's address in the closed group's keys
        where = Path(sys.argv[3]) / name if len(scenarios) > 1 else Path(sys.argv[3])
        where.mkdir(exist_ok=True)
        main(name, sys.argv[2], where)
    sys.exit(0)
