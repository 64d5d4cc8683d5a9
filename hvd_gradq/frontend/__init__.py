"""What the PyTorch and TensorFlow compressors share: the compressor core both subclass
(:mod:`.compressor`: arguments, configuration, handshake, decisions, scaling, stats),
communication patterns and their cost model, byte accounting, seeds, and the host-side codec
(NumPy, with fused kernels when present)."""
