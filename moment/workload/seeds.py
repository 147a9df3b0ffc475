"""One seed mixer for every per-(seed, epoch, rank, batch) random stream."""

from __future__ import annotations

import numpy as np

from moment.errors import MomentError

SEED_LIMIT = 2**63  # torch's generators take a signed 64-bit seed
#: the sampling keys' tags of the splits other than train: batch i of split s in epoch e on rank r is sampled
#: with mix(seed, e, r, SPLIT_TAGS[s], i); a training batch with mix(seed, e, r, i)
SPLIT_TAGS = {"val": 0xE7A1, "test": 0x7E57}


def mix(*parts: int) -> int:
    """A 63-bit seed from integers; different tuples give independent streams."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)


def check_seed(seed: int, flag: str = "--seed") -> int:
    """A seed every generator accepts (numpy's refuse negatives, torch's past 64 bits): the seed, or one
    line naming the flag."""
    if not 0 <= int(seed) < SEED_LIMIT:
        raise MomentError(f"{flag} {seed}: must be an integer from 0 to {SEED_LIMIT - 1}")
    return int(seed)
