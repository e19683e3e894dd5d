"""Jobs after submit: status, recovery, fallback, the watcher, chains and lineage, budget, outputs."""
