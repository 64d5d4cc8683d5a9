"""The quality study (accuracy under compression, simulated workers) and the measured MNIST-1D runs."""
