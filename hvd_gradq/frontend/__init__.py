"""What the PyTorch and TensorFlow compressors share: communication patterns and their cost
model, byte accounting, seeds, and the host-side codec (NumPy, with fused kernels when present)."""
