"""Describe the training job: graphs, datasets, sampler, hotness (torch only where noted).

* `graph`     — the on-disk CSR dataset (`GraphDataset`, `GraphWriter`, `write_graph`); numpy only.
* `synth`     — seeded skewed, homophilous synthetic graphs (`synthesize`); numpy only.
* `importers` — OGB / IGB / edge-list loaders into our format, the CSR build with its edge report and
  `write_parts` (what every importer writes through); numpy (pandas if present) only.
* `import_ogb` — an OGB dataset, its raw download (`import_ogb_hetero`: one node type of a heterogeneous one)
  or (`import_ogb_processed`) what ogb's loaders wrote.
* `import_pyg`, `import_npy`, `import_ogb_processed`, `import_saint` — a PyG `Data` file, loose `.npy` arrays
  (or a SciPy sparse adjacency), OGB's `processed/`, a GraphSAINT release; `import_files` reads the inputs
  (splits included), `import_options` holds the choices, `torch_files` unpickles `.pt` files without running
  their code (torch only where a file needs it).
* `renumber`, `node_tables`, `parquet` — the graph's own ids numbered and back, features and labels in tables
  keyed by them, and Parquet tables (files or Spark's directories of parts; pyarrow where a file needs it).
* `sampler`   — the neighbour sampler and seed batches shared by pre-sampling and training; torch.
* `links`     — link-prediction batches (label edges from seed nodes, then `sampler`), edge splits; torch.
* `hotness`   — per-node access counts (`Hotness`, numpy) and `presample` (imports torch lazily).
* `spec`      — the planner's `WorkloadSpec`.
"""
