"""The benchmark's models in PyTorch, with the published architectures' shapes (torchvision is not
needed): what matters to a gradient exchange is every tensor's shape and their order, so these
follow torchvision's ``resnet18``, ``resnet50`` (v1.5: the stride on the 3x3 conv) and
``mobilenet_v2`` layer for layer, and BERT-base's encoder (post-LayerNorm, GELU) with a 2-way
classifier. Counts are checked against :mod:`bench.models.catalog` by the unit tests."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bench.models import catalog


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c)


class _Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = _bn(width)
        self.conv2 = nn.Conv2d(width, cout, 3, 1, 1, bias=False)
        self.bn2 = _bn(cout)
        self.down = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = _bn(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = _bn(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = _bn(cout)
        self.down = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (self.down(x) if self.down is not None else x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module | None:
    """The projection shortcut (1x1 conv + BN) where the shape changes, else none (identity)."""
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout))


class ResNet(nn.Module):
    """ResNet (He et al. 2016) as torchvision builds it: 7x7 stem, max-pool, four stages."""

    def __init__(self, block: type[_Basic] | type[_Bottleneck], depths: tuple[int, ...],
                 classes: int = catalog.CLASSES) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = _bn(64)
        stages: list[nn.Module] = []
        cin = 64
        for i, depth in enumerate(depths):
            width = 64 * 2**i
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.stages(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), _bn(cout),
                         nn.ReLU6(inplace=True))


class _Inverted(nn.Module):
    """MobileNetV2's inverted residual: 1x1 expand (t > 1), 3x3 depthwise, 1x1 linear projection."""

    def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
        super().__init__()
        hidden = cin * t
        layers: list[nn.Module] = [_conv_bn_relu6(cin, hidden, 1)] if t != 1 else []
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), _bn(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes: int = catalog.CLASSES) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in catalog.MOBILENET_V2_STAGES:
            for i in range(n):
                layers.append(_Inverted(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn_relu6(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


class _EncoderLayer(nn.Module):
    """One BERT layer: self-attention and a GELU feed-forward, each followed by residual + LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        h = catalog.BERT_HIDDEN
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.ln1 = nn.LayerNorm(h, eps=1e-12)
        self.fc1 = nn.Linear(h, catalog.BERT_FFN)
        self.fc2 = nn.Linear(catalog.BERT_FFN, h)
        self.ln2 = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        heads = catalog.BERT_HEADS

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, heads, h // heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)),
                                           dropout_p=0.1 if self.training else 0.0)
        x = self.ln1(x + self.drop(self.o(a.transpose(1, 2).reshape(b, n, h))))
        return self.ln2(x + self.drop(self.fc2(F.gelu(self.fc1(x)))))


class Bert(nn.Module):
    """A BERT-base-like encoder stack with its pooler and a classifier on the [CLS] token."""

    def __init__(self, layers: int = catalog.BERT_LAYERS) -> None:
        super().__init__()
        h = catalog.BERT_HIDDEN
        self.words = nn.Embedding(catalog.BERT_VOCAB, h)
        self.positions = nn.Embedding(catalog.BERT_POSITIONS, h)
        self.types = nn.Embedding(catalog.BERT_TYPES, h)
        self.ln = nn.LayerNorm(h, eps=1e-12)
        self.drop = nn.Dropout(0.1)
        self.layers = nn.Sequential(*(_EncoderLayer() for _ in range(layers)))
        self.pooler = nn.Linear(h, h)
        self.head = nn.Linear(h, catalog.BERT_LABELS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.words(tokens) + self.positions(pos)[None] + self.types(torch.zeros_like(tokens))
        x = self.layers(self.drop(self.ln(x)))
        return self.head(torch.tanh(self.pooler(x[:, 0])))


def build(name: str, layers: int = catalog.BERT_LAYERS) -> nn.Module:
    """A fresh model by catalog name (initialised from torch's global generator: seed it first)."""
    if name == "resnet18":
        return ResNet(_Basic, (2, 2, 2, 2))
    if name == "resnet50":
        return ResNet(_Bottleneck, (3, 4, 6, 3))
    if name == "mobilenet_v2":
        return MobileNetV2()
    if name == "bert":
        return Bert(layers)
    if name == "mlp":
        w = catalog.MLP_WIDTH
        return nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, catalog.MLP_CLASSES))
    raise ValueError(f"unknown model {name!r}; known: {sorted(catalog.MODELS)}")


def batch(name: str, size: int, image: int, seq: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One synthetic batch (inputs, labels) of ``size`` from ``gen``: images ``image`` x ``image``
    for the CNNs, ``seq`` tokens for BERT, MLP_WIDTH features for the MLP."""
    kind = catalog.MODELS[name].kind
    if kind == "text":
        x = torch.randint(0, catalog.BERT_VOCAB, (size, seq), generator=gen)
    elif kind == "vector":
        x = torch.randn(size, catalog.MLP_WIDTH, generator=gen)
    else:
        x = torch.randn(size, 3, image, image, generator=gen)
    return x, torch.randint(0, catalog.classes(name), (size,), generator=gen)


def counts(model: Any) -> tuple[int, int]:
    """(parameters, tensors) that train."""
    ps = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() for p in ps), len(ps)
