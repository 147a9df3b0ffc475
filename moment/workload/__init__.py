"""Describe the training job: graphs, datasets, sampler, hotness (torch only where noted).

* `graph`     — the on-disk CSR dataset (`GraphDataset`, `GraphWriter`, `write_graph`); numpy only.
* `synth`     — seeded skewed, homophilous synthetic graphs (`synthesize`); numpy only.
* `importers` — OGB / IGB / edge-list loaders into our format; numpy (pandas if present) only.
* `sampler`   — the neighbour sampler and seed batches shared by pre-sampling and training; torch.
* `links`     — link-prediction batches (label edges from seed nodes, then `sampler`), edge splits; torch.
* `hotness`   — per-node access counts (`Hotness`, numpy) and `presample` (imports torch lazily).
* `spec`      — the planner's `WorkloadSpec`.
"""
