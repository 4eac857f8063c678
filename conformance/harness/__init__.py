"""Everything that calls a builder's code: guarded calls, isolation, the twin, the adapters."""
