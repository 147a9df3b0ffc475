"""One seed mixer for every per-(seed, epoch, rank, batch) random stream."""

from __future__ import annotations

import numpy as np

from moment.errors import MomentError

SEED_LIMIT = 2**63  # torch's generators take a signed 64-bit seed
#: the sampling keys' tags of the splits other than train: batch i of split s in epoch e on rank r is sampled
#: with mix(seed, e, r, SPLIT_TAGS[s], i); a training batch with mix(seed, e, r, i)
SPLIT_TAGS = {"val": 0xE7A1, "test": 0x7E57}
#: the tag of a loader over nodes of the caller's choosing (`Run.loader(nodes=...)`): sampled as the evaluation
#: splits are, under a tag of its own
NODES_TAG = 0x40DE5
_SPLIT_OF_TAG = {t: s for s, t in SPLIT_TAGS.items()} | {NODES_TAG: "nodes"}


def sampling_key(seed: int, epoch: int, rank: int, split: str = "train") -> tuple[int, ...]:
    """The key a split's batches are sampled with (batch i: mix(*key, i)): (seed, epoch, rank) for training,
    (seed, epoch, rank, SPLIT_TAGS[split]) for the others ("nodes": NODES_TAG)."""
    if split == "train":
        return (seed, epoch, rank)
    return (seed, epoch, rank, NODES_TAG if split == "nodes" else SPLIT_TAGS[split])


def split_of(key: tuple[int, ...]) -> str | None:
    """The split whose batches `sampling_key` gives `key` (None: a key it never gives)."""
    return "train" if len(key) == 3 else _SPLIT_OF_TAG.get(key[3]) if len(key) == 4 else None


def mix(*parts: int) -> int:
    """A 63-bit seed from integers; different tuples give independent streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)


def check_seed(seed: int, flag: str = "--seed") -> int:
    """A seed every generator accepts (numpy's refuse negatives, torch's past 64 bits): the seed, or one
    line naming the flag."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= int(seed) < SEED_LIMIT:
        raise MomentError(f"{flag} {seed!r}: must be an integer from 0 to {SEED_LIMIT - 1}")
    return int(seed)
