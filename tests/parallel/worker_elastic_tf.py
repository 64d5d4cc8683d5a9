"""An elastic Horovod job with Keras ``fit`` and ORQ-5+EF, ``pattern=scatter``: 2 ranks, then 3, then
2 again after a worker is killed in the middle of a step (``test_elastic_tf.py`` drives the host
schedule). The Keras twin of ``worker_elastic_torch.py``, with Horovod's own Keras elastic recipe:
``KerasState``, ``CommitStateCallback``, ``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``.

Every rank appends JSON events to ``<out>/<pid>.jsonl``, in the order they happened:

* ``sync``: at each entry into the elastic function (after Horovod's restore/reset/sync): rank,
  size, the hash of this rank's worker residuals and the sum of its step counters;
* ``commit``: at each ``state.commit()`` of the Keras callback, the hash of the worker residuals
  it commits (a survivor's next ``sync`` after a failed step must show the same hash: the failed
  step's half-written residuals rolled back);
* ``restore``: after a failed step, the hash of the worker residuals before and after Horovod's
  ``restore()``;
* ``step``: after each step, the world, the compressor's generation (the TF compressor syncs at the
  first reduction of a new world, inside the step), whether every rank's parameters hash the same
  (an allgather), the owner residuals and the world they were made in;
* ``epoch`` (rank 0): the loss over the whole data set;
* ``kill`` (the worker on 127.0.0.1): what it had done when it killed itself; ``done``: the final
  parameters' hash.

The epoch log that drives the discovery script is ``--epochs-log``: rank 0 adds a line at the end of
each epoch and waits until Horovod has noticed the host change the schedule makes after epoch
``--grow-after``, as Horovod's own elastic test mains do. The worker on host 127.0.0.1 kills itself
(SIGKILL) at ``--kill-at`` (epoch, batch) inside the step, when the compressor starts to decode its
``--kill-reduction``-th gradient: the earlier gradients' reductions are finished (their residuals
written) and that one's first collective is out, so the survivors fail in the middle of the step.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # before TensorFlow is imported: CPU only

import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from elastic_run import worker_parser

import hvd_gradq.tensorflow as gq
from hvd_gradq.tensorflow.elastic import world

parser = worker_parser()
parser.add_argument("--kill-reduction", type=int, default=2)
args = parser.parse_args()
if os.environ.get("HVDQ_DEBUG_HANG"):  # print every thread's stack if the run outlives it
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["HVDQ_DEBUG_HANG"]), exit=True)

hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(2)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.keras.utils.set_random_seed(0)
HOST = os.environ.get("HOROVOD_HOSTNAME", "")
OUT = Path(args.out, f"{os.getpid()}.jsonl")
KILL_EPOCH, KILL_BATCH = (int(v) for v in args.kill_at.split(","))
MARK = Path(args.out, "killed")
GLOBAL_BATCH = 48  # 240 samples: 5 batches an epoch at 2 ranks (24 each) and at 3 (16 each)

rng = np.random.default_rng(1)
X = rng.standard_normal((GLOBAL_BATCH * args.batches, 32)).astype(np.float32)
Y = (X[:, :4].sum(axis=1) > 0).astype(np.int64)
# kernels of 2048 and 4096 weights: chunked, encoded and scattered for real
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(2)])
compression = gq.from_spec("orq:levels=5,ef=true", pattern="scatter", seed=3)
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.2), compression=compression)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model.compile(optimizer, LOSS, jit_compile=False)
# Keras' optimizer makes its slot variables at its first step, and KerasState's sync broadcasts the
# optimizer's variables: a rank that joins must hold the same list as the ranks that have trained,
# or the broadcasts pair up wrongly and wait for ever (Horovod + Keras 2.15, stock compression too)
optimizer.build(model.trainable_variables)


def emit(kind: str, **fields: Any) -> None:
    with OUT.open("a") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), "host": HOST, **fields}) + "\n")


def params_hash() -> str:
    h = hashlib.sha256()
    for v in model.trainable_variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def worker_residuals() -> str:
    """This rank's own error-feedback residuals (owner residuals, keys with '#', follow the world)."""
    h = hashlib.sha256()
    for k in sorted(compression.residuals):
        if "#" not in k:
            h.update(k.encode() + compression.residuals[k].numpy().tobytes())
    return h.hexdigest()


# -- the kill: inside the step, at the start of the decode of the kill_reduction-th gradient -------
armed = {"on": False, "decodes": 0}
_decompress = compression.decompress


def decompress(tensor: Any, ctx: Any) -> Any:
    """The compressor's decompress, and the kill when armed. In an elastic job it runs eagerly in
    the step's host function (graph-mode calls are the trace; they never kill)."""
    if armed["on"] and tf.executing_eagerly():
        armed["decodes"] += 1
        if armed["decodes"] == args.kill_reduction:
            MARK.write_text(str(os.getpid()))
            emit("kill", rank=hvd.rank(), decodes=armed["decodes"], residuals=worker_residuals(),
                 steps={k: int(v.numpy()) for k, v in compression.steps.items()})
            os.kill(os.getpid(), signal.SIGKILL)
    return _decompress(tensor, ctx)


compression.decompress = decompress


class Recorder(tf.keras.callbacks.Callback):  # type: ignore[misc]
    """Per step: the world and the parameter check; per epoch: the loss, the epoch log, the wait."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if ((self.state.epoch, batch) == (KILL_EPOCH, KILL_BATCH) and HOST == "127.0.0.1"
                and not MARK.exists()):
            armed["on"] = True

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        e = compression._elastic
        gen = e.generation.number
        hashes = hvd_tf.allgather_object(params_hash(), name=f"check.{gen}")
        owners = [k for k in compression.residuals if "#" in k]
        emit("step", rank=hvd.rank(), size=hvd.size(), generation=gen, gen_world=str(e.generation.world),
             epoch=self.state.epoch, batch=batch, equal=len(set(hashes)) == 1, owners=len(owners),
             owners_world=str(e.made_in), world=str(world()))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if hvd.rank() != 0:
            return
        logits = model(X, training=False)
        emit("epoch", epoch=self.state.epoch, loss=float(LOSS(Y, logits)), size=hvd.size())
        with open(args.epochs_log, "a") as f:
            f.write(f"{self.state.epoch}\n")
        if self.state.epoch == args.grow_after:  # the schedule adds a host now: wait until Horovod says so
            self.state._last_updated_timestamp = 0
            start = time.monotonic()
            while self.state._host_messages.empty():
                if time.monotonic() - start > 30:
                    raise TimeoutError("no host update from the driver within 30 s")
                time.sleep(0.1)


class Commit(hvd.elastic.CommitStateCallback):  # type: ignore[misc]
    """Horovod's commit callback, recording the worker residuals each commit saves."""

    def commit(self) -> None:
        emit("commit", rank=hvd.rank(), epoch=self.state.epoch, batch=self.state.batch, residuals=worker_residuals())
        super().commit()


class State(hvd.elastic.KerasState):  # type: ignore[misc]
    """Horovod's Keras state, recording the worker residuals a restore found and left."""

    def restore(self) -> None:
        before = worker_residuals()
        super().restore()
        emit("restore", rank=hvd.rank(), before=before, after=worker_residuals())


state = State(model, batch=0, epoch=0)
callbacks = [Recorder(state), hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.UpdateBatchStateCallback(state), Commit(state)]


@hvd.elastic.run
def train(state: Any) -> None:
    emit("sync", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, batch=state.batch,
         residuals=worker_residuals(), params=params_hash(),
         steps=sum(int(v.numpy()) for v in compression.steps.values()))
    rank, size = hvd.rank(), hvd.size()
    model.fit(X[rank::size], Y[rank::size], batch_size=GLOBAL_BATCH // size, epochs=args.epochs - state.epoch,
              shuffle=False, verbose=0, callbacks=callbacks)


train(state)
emit("done", rank=hvd.rank(), size=hvd.size(), params=params_hash(),
     patterns=sorted({s["pattern"] for s in compression.slots()}))
