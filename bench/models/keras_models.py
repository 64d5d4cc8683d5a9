"""The benchmark's models in Keras (TensorFlow 2.15, Keras 2), the same shapes and tensor order as
:mod:`bench.models.torch_models`: channels-last images, BatchNorm with PyTorch's epsilon and
momentum, ``same`` padding (the output shapes of PyTorch's explicit padding; TF pads stride 2
towards the bottom right, which moves values, not shapes). Built with ``tf.keras`` layers only,
so ``model.trainable_variables`` is what ``DistributedGradientTape`` reduces."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from bench.models import catalog

L = tf.keras.layers


def _bn(x: Any) -> Any:
    return L.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)


def _conv(x: Any, c: int, k: int, stride: int = 1) -> Any:
    return L.Conv2D(c, k, stride, padding="same", use_bias=False)(x)


def _basic(x: Any, width: int, stride: int) -> Any:
    y = L.ReLU()(_bn(_conv(x, width, 3, stride)))
    y = _bn(_conv(y, width, 3))
    return L.ReLU()(L.Add()([y, _shortcut(x, width, stride)]))


def _bottleneck(x: Any, width: int, stride: int) -> Any:
    y = L.ReLU()(_bn(_conv(x, width, 1)))
    y = L.ReLU()(_bn(_conv(y, width, 3, stride)))
    y = _bn(_conv(y, width * 4, 1))
    return L.ReLU()(L.Add()([y, _shortcut(x, width * 4, stride)]))


def _shortcut(x: Any, cout: int, stride: int) -> Any:
    if stride == 1 and x.shape[-1] == cout:
        return x
    return _bn(_conv(x, cout, 1, stride))


def resnet(bottleneck: bool, depths: tuple[int, ...], image: int) -> tf.keras.Model:
    block = _bottleneck if bottleneck else _basic
    inp = tf.keras.Input((image, image, 3))
    x = L.ReLU()(_bn(_conv(inp, 64, 7, 2)))
    x = L.MaxPooling2D(3, 2, padding="same")(x)
    for i, depth in enumerate(depths):
        for j in range(depth):
            x = block(x, 64 * 2**i, 2 if i > 0 and j == 0 else 1)
    x = L.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inp, L.Dense(catalog.CLASSES)(x))


def _conv_bn_relu6(x: Any, c: int, k: int, stride: int = 1) -> Any:
    return L.ReLU(6.0)(_bn(_conv(x, c, k, stride)))


def _inverted(x: Any, cout: int, stride: int, t: int) -> Any:
    cin = x.shape[-1]
    y = _conv_bn_relu6(x, cin * t, 1) if t != 1 else x
    y = L.ReLU(6.0)(_bn(L.DepthwiseConv2D(3, stride, padding="same", use_bias=False)(y)))
    y = _bn(_conv(y, cout, 1))
    return L.Add()([x, y]) if stride == 1 and cin == cout else y


def mobilenet_v2(image: int) -> tf.keras.Model:
    inp = tf.keras.Input((image, image, 3))
    x = _conv_bn_relu6(inp, 32, 3, 2)
    for t, c, n, s in catalog.MOBILENET_V2_STAGES:
        for i in range(n):
            x = _inverted(x, c, s if i == 0 else 1, t)
    x = L.GlobalAveragePooling2D()(_conv_bn_relu6(x, 1280, 1))
    return tf.keras.Model(inp, L.Dense(catalog.CLASSES)(L.Dropout(0.2)(x)))


class _EncoderLayer(L.Layer):
    """One BERT layer (post-LayerNorm): self-attention, then a GELU feed-forward."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        h = catalog.BERT_HIDDEN
        self.q, self.k, self.v, self.o = (L.Dense(h) for _ in range(4))
        self.ln1 = L.LayerNormalization(epsilon=1e-12)
        self.fc1 = L.Dense(catalog.BERT_FFN)
        self.fc2 = L.Dense(h)
        self.ln2 = L.LayerNormalization(epsilon=1e-12)
        self.drop_a, self.drop_1, self.drop_2 = L.Dropout(0.1), L.Dropout(0.1), L.Dropout(0.1)

    def call(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        heads, h = catalog.BERT_HEADS, catalog.BERT_HIDDEN
        b, n = tf.shape(x)[0], tf.shape(x)[1]

        def split(t: tf.Tensor) -> tf.Tensor:
            return tf.transpose(tf.reshape(t, (b, n, heads, h // heads)), (0, 2, 1, 3))

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        w = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / (h // heads) ** 0.5)
        a = tf.reshape(tf.transpose(tf.matmul(self.drop_a(w, training=training), v), (0, 2, 1, 3)), (b, n, h))
        x = self.ln1(x + self.drop_1(self.o(a), training=training))
        return self.ln2(x + self.drop_2(self.fc2(tf.nn.gelu(self.fc1(x))), training=training))


class _Embeddings(L.Layer):
    """Words + positions + token types (all type 0), then LayerNorm: one layer, so that the
    position table, indexed by a range rather than by the input, is part of the model."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        h = catalog.BERT_HIDDEN
        self.words = L.Embedding(catalog.BERT_VOCAB, h)
        self.positions = L.Embedding(catalog.BERT_POSITIONS, h)
        self.types = L.Embedding(catalog.BERT_TYPES, h)
        self.ln = L.LayerNormalization(epsilon=1e-12)

    def call(self, tokens: tf.Tensor) -> tf.Tensor:
        pos = self.positions(tf.range(tf.shape(tokens)[1]))[None]
        return self.ln(self.words(tokens) + pos + self.types(tf.zeros_like(tokens)))


def bert(layers: int, seq: int) -> tf.keras.Model:
    tokens = tf.keras.Input((seq,), dtype=tf.int32)
    x = L.Dropout(0.1)(_Embeddings(name="embeddings")(tokens))
    for i in range(layers):
        x = _EncoderLayer(name=f"layer_{i}")(x)
    pooled = L.Dense(catalog.BERT_HIDDEN, activation="tanh")(x[:, 0])
    return tf.keras.Model(tokens, L.Dense(catalog.BERT_LABELS)(pooled))


def build(name: str, image: int = 64, seq: int = 128, layers: int = catalog.BERT_LAYERS) -> tf.keras.Model:
    """A fresh model by catalog name (initialised from TF's global seed: call
    ``tf.keras.utils.set_random_seed`` first)."""
    if name == "resnet18":
        return resnet(False, (2, 2, 2, 2), image)
    if name == "resnet50":
        return resnet(True, (3, 4, 6, 3), image)
    if name == "mobilenet_v2":
        return mobilenet_v2(image)
    if name == "bert":
        return bert(layers, seq)
    if name == "mlp":
        x = inputs = tf.keras.Input((catalog.MLP_WIDTH,))
        for _ in range(2):
            x = L.Dense(catalog.MLP_WIDTH, activation="relu")(x)
        return tf.keras.Model(inputs, L.Dense(catalog.MLP_CLASSES)(x))
    raise ValueError(f"unknown model {name!r}; known: {sorted(catalog.MODELS)}")


def batch(name: str, size: int, image: int, seq: int, seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    """One synthetic batch (inputs, labels) of ``size``, the same for the same ``seed``."""
    kind = catalog.MODELS[name].kind
    if kind == "text":
        x = tf.random.stateless_uniform((size, seq), (seed, 0), 0, catalog.BERT_VOCAB, tf.int32)
    elif kind == "vector":
        x = tf.random.stateless_normal((size, catalog.MLP_WIDTH), (seed, 0))
    else:
        x = tf.random.stateless_normal((size, image, image, 3), (seed, 0))
    return x, tf.random.stateless_uniform((size,), (seed, 1), 0, catalog.classes(name), tf.int32)


def counts(model: Any) -> tuple[int, int]:
    """(parameters, tensors) that train."""
    vs = model.trainable_variables
    return sum(int(v.shape.num_elements()) for v in vs), len(vs)
