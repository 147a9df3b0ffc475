"""Describe the training job: graphs, datasets, sampler, hotness (torch only where noted)."""
