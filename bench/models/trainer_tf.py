"""TensorFlow side of the model benchmark's worker: one Keras model a compression, each step a
``tf.function`` through stock ``hvd.DistributedGradientTape``, and the collectives the worker's
loop needs. Imported by :mod:`bench.models.models_worker` under Horovod only.

``sparse_as_dense=True``: BERT's embedding gradients are ``IndexedSlices`` in TensorFlow, which
Horovod would allgather uncompressed; dense, they go through the compression as in PyTorch
(whose ``nn.Embedding`` gradients are dense), so both frameworks exchange the same tensors."""
from __future__ import annotations

import argparse
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import hvd_gradq.tensorflow as gq
from bench.models import catalog, keras_models


def init() -> tuple[int, int]:
    hvd.init()
    tf.get_logger().setLevel("ERROR")
    return hvd.rank(), hvd.size()


def threads() -> dict[str, Any]:
    """TensorFlow's own pools (0: its default, the machine's cores); OMP_NUM_THREADS reaches
    only oneDNN's kernels, not these pools."""
    return {"tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


class Trainer:
    """One compression's model (the same initial weights for every compression, broadcast from
    rank 0 anyway), SGD with momentum, this rank's fixed synthetic batch and a traced step."""

    def __init__(self, spec: str, args: argparse.Namespace) -> None:
        tf.keras.utils.set_random_seed(args.seed)
        self.spec = spec
        self.model = keras_models.build(args.model, args.image, args.seq, args.layers)
        hvd.broadcast_variables(self.model.variables, root_rank=0)
        x, y = keras_models.batch(args.model, args.batch, args.image, args.seq, args.seed * 1000 + hvd.rank())
        base = catalog.baseline(spec)
        self.compressor = None if base else gq.from_spec(spec)
        comp = getattr(hvd.Compression, base) if base else self.compressor
        opt = tf.keras.optimizers.legacy.SGD(learning_rate=args.lr, momentum=0.9)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model = self.model

        @tf.function
        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape, compression=comp, sparse_as_dense=True)
            vs = model.trainable_variables
            opt.apply_gradients(zip(tape.gradient(loss, vs), vs))
            return loss

        self._step = step

    def step(self) -> None:
        self._step().numpy()  # returns when the step's every op has run

    def weights(self) -> list[Any]:
        """The trained weights as NumPy arrays, in the model's order (for the ranks' digest)."""
        return [v.numpy() for v in self.model.trainable_variables]


def make(spec: str, index: int, args: argparse.Namespace) -> Trainer:
    del index  # TF names each step's collectives after its own graph's ops
    return Trainer(spec, args)


def allreduce_max(values: np.ndarray, name: str) -> np.ndarray:
    return hvd.allreduce(tf.constant(values), op=hvd.Max, name=name).numpy()


def allgather(rows: np.ndarray, name: str) -> np.ndarray:
    return hvd.allgather(tf.constant(rows), name=name).numpy()


def shutdown() -> None:
    hvd.shutdown()
