"""Train: tiered feature store, pipelined sample -> gather -> train, models, DDP entry point (needs torch)."""
