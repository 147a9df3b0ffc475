"""Measures what one training step holds, for tests/test_models.py: a fresh process (its allocator as a rank's:
`return_freed_memory`), one synthetic batch per configuration (blocks cut as `MiniBatch.blocks()` cuts them),
two steps each, and the kernel's high-water mark over the second beyond what the process held before it (the
first also makes what persists).

    python tests/model_step.py OUT.json '[[model, in_dim, hidden, classes, [seeds, hop1, ...], [edges1, ...]], ...]'

A configuration with a seventh item, a number of label edges, is a link step (moment.runtime.link_task): the
model's output (`classes` wide) decoded for that many random label edges between the seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from moment.runtime.heap import return_freed_memory
from moment.runtime.link_task import decoder_bytes, link_logits, link_loss
from moment.runtime.memory_use import reset_peak
from moment.runtime.models import LayerExtent, build_model, step_bytes, weights
from moment.workload.sampler import Block


def status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")


def batch(new: list[int], edges: list[int]) -> tuple[int, list[Block]]:
    """Nodes seeds first, then each hop's new ones; hop h's edges go from the first nodes[h] nodes to the
    nodes hop h-1 added, in the order of their targets (as the sampler orders them)."""
    g = torch.Generator().manual_seed(0)
    nodes = [0, *torch.tensor(new).cumsum(0).tolist()]
    parts = [torch.stack([torch.randint(0, nodes[h + 1], (e,), generator=g),
                          torch.randint(nodes[h - 1], nodes[h], (e,), generator=g).sort().values])
             for h, e in enumerate(edges, start=1)]
    nodes = nodes[1:]
    ei = torch.cat(parts, 1)
    cut = torch.tensor([0, *edges]).cumsum(0).tolist()
    hops = len(edges)
    return nodes[-1], [Block(ei[:, : cut[hops - i]], nodes[hops - i], nodes[hops - i - 1]) for i in range(hops)]


def main() -> int:
    torch.set_num_threads(1)
    return_freed_memory()
    out = []
    for name, in_dim, hidden, classes, new, edges, *link in json.loads(sys.argv[2]):
        rows, blocks = batch(new, edges)
        model = build_model(name, in_dim, classes, len(edges), hidden)
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(rows, in_dim)
        y = torch.randint(0, classes, (new[0],))
        if link:
            g = torch.Generator().manual_seed(1)
            label_index = torch.randint(0, new[0], (2, link[0]), generator=g)
            label = (torch.arange(link[0]) % 2).float()
        held = []
        for _ in range(2):
            if not reset_peak():
                raise SystemExit("cannot reset the high-water mark here")
            before = status("VmRSS")
            opt.zero_grad(set_to_none=True)
            h = model(x, blocks)
            loss = link_loss(link_logits(h, label_index), label) if link else F.cross_entropy(h, y)
            del h
            loss.backward()
            opt.step()
            del loss
            held.append(status("VmHWM") - before)
        layers = [LayerExtent(b.num_src, b.num_dst, int(b.edge_index.shape[1])) for b in blocks]
        # the first step also makes what persists (Adam's state, lazily set-up kernels): the second's
        head = decoder_bytes(link[0], new[0], classes) if link else 0
        out.append({"model": name, "link": bool(link), "measured": held[1], "stated": step_bytes(
            name, in_dim, classes, hidden, layers, rows=rows, float_copy=False, head_bytes=head), "head": head,
                    "weights": sum(p.numel() for p in model.parameters()),
                    "weights_stated": weights(name, in_dim, classes, hidden, len(edges))})
        del model, opt, x, blocks
    Path(sys.argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
