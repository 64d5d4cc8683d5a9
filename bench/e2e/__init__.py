"""End to end on the emulated network: hosts as network namespaces, links shaped by tc."""
