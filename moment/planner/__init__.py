"""Choose the hardware placement: capacity graph, solvers, symmetry-pruned search, ranking."""
