"""The pattern cost model: its CPU table, its predictions at 2 to 1,024 workers, and its check on the
emulated network."""
