"""The measurement harness of the MNIST-1D training runs in bench/quality/ (``train_mnist1d.py``,
``train_keras_mnist1d.py``, ``train_tape_mnist1d.py``; the demo runs the first): arguments, data,
the learning-rate schedule, a progress bar, compressor timing and the summary. Shared: the quality
study (``bench/quality/study_tasks.py``) and the end-to-end benchmark (``bench/e2e/e2e_worker.py``)
load their MNIST-1D data here too.
examples/ has the user-facing versions of these scripts, without the measurement.

MNIST-1D (Greydanus 2020) is generated locally by the ``mnist1d`` package (4000 train / 1000 test
signals of 40 samples, 10 classes; never downloaded) and cached in
``~/.cache/hvd_gradq/mnist1d.npz`` (``HVD_GRADQ_CACHE`` moves the folder), so later runs skip
the ~3.5 s of generation. Each rank trains on its own shard (``x[rank::size]``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ENV = "HVD_GRADQ"
STOCK = ("stock-none", "stock-fp16")  # Horovod's own hvd.Compression.none / .fp16, for comparison
WARMUP_STEPS = 5  # steps left out of the timing (tracing, JIT, the ranks' configuration check)
CACHE_VERSION = 1


# -- arguments -------------------------------------------------------------------------------------
def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--compression", default=os.environ.get(ENV) or "none",
                    help="hvd_gradq spec such as 'orq:levels=5' (default: $HVD_GRADQ, else 'none'); "
                    "'stock-none' / 'stock-fp16' use Horovod's own hvd.Compression.none / .fp16")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="model init, data order and rounding noise")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05,
                    help="peak Adam learning rate (warm-up: 1 epoch, at most a tenth of the run; then cosine)")
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                    help="adam, or sgd (momentum 0.9, Nesterov); --lr is the peak of either")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--json", default="", metavar="PATH", help="write the summary as JSON (rank 0)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0 or args.max_steps < 0:
        ap.error("--epochs and --batch-size must be >= 1, --lr > 0, --max-steps >= 0")
    return args


def stock_kind(spec: str) -> str | None:
    """'none' or 'fp16' for the stock-Horovod specs, else None (an hvd_gradq spec)."""
    s = spec.strip().lower()
    return s.split("-", 1)[1] if s in STOCK else None


# -- data --------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("HVD_GRADQ_CACHE") or Path.home() / ".cache" / "hvd_gradq")


def load_mnist1d() -> dict[str, np.ndarray]:
    """MNIST-1D with the package's default arguments: x (4000, 40) float32, y (4000,) int64,
    x_test (1000, 40), y_test (1000,). Generated once, then read from the cache; concurrent ranks
    take a file lock so only one generates."""
    path = cache_dir() / "mnist1d.npz"
    data = _read_cache(path)
    if data is not None:
        return data
    path.parent.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read_cache(path)  # another rank may have made it while we waited
        if data is not None:
            return data
        from mnist1d.data import get_dataset_args, make_dataset  # never get_dataset: it downloads

        d = make_dataset(get_dataset_args())
        data = {
            "x": np.asarray(d["x"], np.float32), "y": np.asarray(d["y"], np.int64),
            "x_test": np.asarray(d["x_test"], np.float32), "y_test": np.asarray(d["y_test"], np.int64),
        }
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, version=np.int64(CACHE_VERSION), **data)
        os.replace(tmp, path)
    return data


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    try:
        with np.load(path) as z:
            if int(z["version"]) != CACHE_VERSION:
                return None
            return {k: z[k] for k in ("x", "y", "x_test", "y_test")}
    except (OSError, KeyError, ValueError):
        return None


def shard(x: np.ndarray, y: np.ndarray, rank: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's shard; every rank gets the same number of samples."""
    n = len(x) // size
    return x[rank::size][:n], y[rank::size][:n]


def epoch_order(n: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, rank]).permutation(n)


def lr_at(step: int, total: int, warmup: int, peak: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


def warmup_steps(spe: int, total: int) -> int:
    """Warm-up length: one epoch, but at most a tenth of a short run."""
    return max(1, min(spe, total // 10))


def plan(n_samples: int, batch: int, epochs: int, max_steps: int) -> tuple[int, int]:
    """(steps per epoch, total steps), the same on every rank."""
    spe = n_samples // batch
    if spe < 1:
        raise SystemExit(f"a shard of {n_samples} samples holds no batch of {batch}")
    total = spe * epochs
    if max_steps:
        total = min(total, max_steps)
    return spe, total


# -- progress and timing --------------------------------------------------------------------------------
def progress(rank: int, total: int, desc: str, quiet: bool) -> Any:
    """A tqdm bar on rank 0 (stderr); a silent stand-in elsewhere."""
    from tqdm import tqdm

    # under horovodrun stderr is a pipe and every refresh becomes a line: refresh less often there
    every = 0.5 if sys.stderr.isatty() else 5.0
    return tqdm(total=total, desc=desc, unit="step", disable=(rank != 0 or quiet), mininterval=every,
                dynamic_ncols=True, file=sys.stderr)


class TimedCompressor:
    """Wraps a Horovod compressor and adds up the wall time spent inside its ``compress`` and
    ``decompress`` (Python-side: used by the PyTorch example, where Horovod calls them eagerly).

    For hvd_gradq compressors ``compress`` encodes and starts the payload's collective
    asynchronously; ``decompress`` waits for it and decodes every rank's payload, so this time
    includes waiting for hvd_gradq's own collective, not only arithmetic."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.compress_s = 0.0
        self.decompress_s = 0.0

    def compress(self, tensor: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.inner.compress(tensor)
        finally:
            self.compress_s += time.perf_counter() - t

    def decompress(self, tensor: Any, ctx: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.inner.decompress(tensor, ctx)
        finally:
            self.decompress_s += time.perf_counter() - t

    def total(self) -> float:
        return self.compress_s + self.decompress_s


def tf_timed_compressor(inner: Any, n_grads: int) -> Any:
    """The TensorFlow counterpart of :class:`TimedCompressor`.

    Horovod calls a TF compressor while it *traces* the reduction, so Python timers would only
    time the tracing. Instead, ``tf.timestamp()`` ops are placed before and after each
    gradient's compress and decompress ops (ordered by control dependencies) and written into a
    variable; after each step :meth:`step_time` reads them and returns the length of the union
    of the intervals (TF runs independent ops concurrently, so adding them up would overcount).
    The ops of a compress that no output depends on (e.g. the error-feedback update) may run
    outside the interval; everything on the data path is inside it. Like the PyTorch timing, it
    includes waiting for hvd_gradq's own collective (here the allgather inside ``compress``)."""
    import tensorflow as tf

    class TFTimedCompressor:
        def __init__(self) -> None:
            self.inner = inner
            self.n = n_grads
            self.marks = tf.Variable(tf.zeros((2 * n_grads, 2), tf.float64), trainable=False,
                                     name="hvd_gradq_example_marks")
            self._c = 0
            self._d = 0

        def _stamp(self, deps: list[Any]) -> Any:
            with tf.control_dependencies(deps):
                return tf.timestamp()

        def compress(self, tensor: Any) -> Any:
            i = self._c % self.n
            self._c += 1
            t0 = self._stamp([tensor])
            with tf.control_dependencies([t0]):
                tensor = tf.identity(tensor)
            out, ctx = self.inner.compress(tensor)
            t1 = self._stamp([out, *_tensors_of(ctx)])
            self.marks[i].assign(tf.stack([t0, t1]))  # a stateful op: tf.function runs it
            return out, ctx

        def decompress(self, tensor: Any, ctx: Any) -> Any:
            i = self.n + self._d % self.n
            self._d += 1
            t0 = self._stamp([tensor])
            with tf.control_dependencies([t0]):
                tensor = tf.identity(tensor)
                ctx = _after(ctx)  # the decode reads the context's tensors too: start it after t0
            out = self.inner.decompress(tensor, ctx)
            t1 = self._stamp([out])
            self.marks[i].assign(tf.stack([t0, t1]))
            return out

        def step_time(self) -> float:
            """Seconds of the last step during which some compress/decompress was running."""
            m = self.marks.numpy()
            m = m[m[:, 1] > 0]
            return interval_union(m)

    def _after(ctx: Any) -> Any:
        """``ctx`` with its tensors passed through ``tf.identity`` (under the caller's control
        dependencies); a dataclass context is copied, anything else is returned as it is."""
        if isinstance(ctx, tf.Tensor):
            return tf.identity(ctx)
        if dataclasses.is_dataclass(ctx) and not isinstance(ctx, type):
            changes = {k: tf.identity(v) for k, v in vars(ctx).items() if isinstance(v, tf.Tensor)}
            return dataclasses.replace(ctx, **changes) if changes else ctx
        return ctx

    def _tensors_of(ctx: Any) -> list[Any]:
        if isinstance(ctx, tf.Tensor):
            return [ctx]
        fields = getattr(ctx, "__dict__", {})
        return [v for v in fields.values() if isinstance(v, tf.Tensor)]

    return TFTimedCompressor()


# -- TensorFlow pieces shared by train_keras_mnist1d.py and train_tape_mnist1d.py -----------------------------------
def tf_setup() -> None:
    """One intra-op thread a rank (the ranks share the cores), quiet logs."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.get_logger().setLevel("ERROR")


def tf_model(seed: int, channels: int = 25, length: int = 40, classes: int = 10) -> Any:
    """The MNIST-1D CNN of train_mnist1d.py in Keras (same shapes: padding 1, stride 2)."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    L = tf.keras.layers
    model = tf.keras.Sequential([
        L.Input((length,)), L.Reshape((length, 1)),
        L.ZeroPadding1D(1), L.Conv1D(channels, 5, strides=2, activation="relu"),
        L.ZeroPadding1D(1), L.Conv1D(channels, 3, strides=2, activation="relu"),
        L.ZeroPadding1D(1), L.Conv1D(channels, 3, strides=2, activation="relu"),
        L.Flatten(), L.Dense(classes),
    ])
    return model


def tf_optimizer(name: str, lr: float) -> Any:
    import tensorflow as tf

    if name == "sgd":
        return tf.keras.optimizers.legacy.SGD(learning_rate=lr, momentum=0.9, nesterov=True)
    return tf.keras.optimizers.legacy.Adam(learning_rate=lr)


def tf_compression(spec: str, seed: int, hvd: Any, n_grads: int) -> tuple[Any, Any, str, str | None]:
    """(inner compressor, timed wrapper, scheme description, stock kind or None)."""
    kind = stock_kind(spec)
    if kind is not None:
        inner = hvd.Compression.fp16 if kind == "fp16" else hvd.Compression.none
        scheme = f"horovod {kind}"
    else:
        import hvd_gradq.tensorflow as gq

        inner = gq.from_spec(spec, seed=seed)
        scheme = inner.scheme.spec
    return inner, tf_timed_compressor(inner, n_grads), scheme, kind


def tf_evaluate(model: Any, x: np.ndarray, y: np.ndarray, hvd: Any) -> tuple[float, float]:
    """Accuracy and mean loss over the whole test set (each rank scores its shard)."""
    import tensorflow as tf

    logits = model(x, training=False)
    loss = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float64))
    counts = tf.stack([correct, tf.reduce_sum(tf.cast(loss, tf.float64)), tf.constant(float(len(y)), tf.float64)])
    tot = hvd.allreduce(counts, op=hvd.Sum, name="example.eval").numpy()
    return float(tot[0] / tot[2]), float(tot[1] / tot[2])


def interval_union(marks: np.ndarray) -> float:
    """Total length of the union of intervals ``marks`` (k, 2)."""
    if len(marks) == 0:
        return 0.0
    order = np.argsort(marks[:, 0])
    total, cur0, cur1 = 0.0, None, None
    for a, b in marks[order]:
        if cur1 is None or a > cur1:
            if cur1 is not None:
                total += cur1 - cur0
            cur0, cur1 = a, b
        else:
            cur1 = max(cur1, b)
    if cur1 is not None:
        total += cur1 - cur0
    return float(total)


class StepClock:
    """Step wall times and compressor times, leaving out the first WARMUP_STEPS steps (when
    there are more than that)."""

    def __init__(self, total_steps: int) -> None:
        self.skip = WARMUP_STEPS if total_steps > 2 * WARMUP_STEPS else 0
        self.seen = 0
        self.step_s = 0.0
        self.comp_s = 0.0
        self.timed = 0

    def add(self, step_s: float, comp_s: float) -> None:
        self.seen += 1
        if self.seen > self.skip:
            self.step_s += step_s
            self.comp_s += comp_s
            self.timed += 1


# -- summary ------------------------------------------------------------------------------------------
def fp32_sent_per_step(sizes: list[int], nranks: int, itemsize: int = 4) -> int:
    """Bytes a rank sends per step in a ring allreduce of every gradient (the model hvd_gradq's
    stats use for fp32): 2(N-1)/N x itemsize x n per tensor."""
    return sum(round(2 * (nranks - 1) / nranks * itemsize * n) for n in sizes)


def bytes_summary(stats: dict[str, Any] | None, kind: str | None, sizes: list[int], nranks: int,
                  steps: int) -> dict[str, Any]:
    """Bytes this rank sent in total, against an fp32 ring allreduce of the same gradients.

    hvd_gradq compressors: ``compressor.stats()["total"]["all"]``. Stock Horovod compression:
    the ring-allreduce model (fp32: 4 bytes an element; fp16: 2)."""
    if stats is not None:
        a = stats["total"]["all"]
        return {"bytes_sent": int(a["sent"]), "bytes_fp32": int(a["fp32"]),
                "ratio_vs_fp32": float(a["ratio_vs_fp32"]), "bytes_source": "compressor.stats()"}
    fp32 = fp32_sent_per_step(sizes, nranks) * steps
    sent = fp32_sent_per_step(sizes, nranks, 2 if kind == "fp16" else 4) * steps
    return {"bytes_sent": sent, "bytes_fp32": fp32, "ratio_vs_fp32": fp32 / sent if sent else 0.0,
            "bytes_source": "ring-allreduce model (stock Horovod)"}


def make_summary(args: argparse.Namespace, *, framework: str, example: str, scheme: str, nranks: int,
                 steps: int, epochs_run: float, n_params: int, accuracy: float, test_loss: float,
                 train_loss: float, clock: StepClock, bytes_info: dict[str, Any], wall_s: float) -> dict[str, Any]:
    step_s = clock.step_s / clock.timed if clock.timed else 0.0
    return {
        "example": example, "framework": framework, "compression": args.compression, "scheme": scheme,
        "ranks": nranks, "seed": args.seed, "epochs": epochs_run, "steps": steps,
        "batch_size_per_rank": args.batch_size, "lr": args.lr, "optimizer": args.optimizer, "params": n_params,
        "test_accuracy": accuracy, "test_loss": test_loss, "train_loss": train_loss,
        **bytes_info,
        "step_time_s": step_s,
        "compress_s_per_step": clock.comp_s / clock.timed if clock.timed else 0.0,
        "compress_share": clock.comp_s / clock.step_s if clock.step_s > 0 else 0.0,
        "timed_steps": clock.timed, "wall_s": wall_s,
    }


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def print_summary(s: dict[str, Any]) -> None:
    lines = [
        f"== {s['example']} | {s['compression']} ({s['scheme']}) | {s['ranks']} ranks ==",
        f"  test accuracy     {100 * s['test_accuracy']:.2f}%  (test loss {s['test_loss']:.4f}, "
        f"{s['steps']} steps, {s['epochs']:g} epochs)",
        f"  bytes sent        {human_bytes(s['bytes_sent'])} vs fp32 {human_bytes(s['bytes_fp32'])}: "
        f"x{s['ratio_vs_fp32']:.2f} less  [{s['bytes_source']}, this rank]",
        f"  mean step time    {1000 * s['step_time_s']:.2f} ms  ({s['timed_steps']} steps timed)",
        f"  compress share    {100 * s['compress_share']:.1f}% of step time inside compress+decompress "
        f"({1000 * s['compress_s_per_step']:.2f} ms a step)",
    ]
    print("\n".join(lines), flush=True)


def write_json(path: str, summary: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(summary, indent=2) + "\n")
