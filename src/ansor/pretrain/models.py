"""Reference models with random but fixed weights, built from `transformers` configurations.

Their fused subgraphs are part of the pretraining corpus (what `ansor tune` sees of real
networks), and the model benchmarks time the same networks, so both name them here once.
torch and transformers are imported only when a model is made (the `models` extra).
"""

from __future__ import annotations

from typing import Any

#: The names `make_model` knows.
MODEL_NAMES = ("resnet18", "resnet50", "mobilenet_v2", "bert_layer")


def make_model(name: str) -> tuple[Any, tuple[Any, ...]]:
    """(torch module, example inputs) of a named model at batch 1. The weights are random but
    the same on every call (seeded), so records tuned for one run's subgraphs match another's.

    Raises:
        ValueError: `name` is not one of `MODEL_NAMES`.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    import torch
    import transformers

    torch.manual_seed(0)

    class Logits(torch.nn.Module):
        """The classifier's logits alone: the importer takes a module that returns tensors."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(x).logits

    image = (torch.randn(1, 3, 224, 224),)
    if name == "resnet18":
        config = transformers.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                           layer_type="basic", embedding_size=64, num_labels=1000)
        return Logits(transformers.ResNetForImageClassification(config)), image
    if name == "resnet50":
        config = transformers.ResNetConfig(layer_type="bottleneck", num_labels=1000)
        return Logits(transformers.ResNetForImageClassification(config)), image
    if name == "mobilenet_v2":
        config = transformers.MobileNetV2Config(num_labels=1000)
        return Logits(transformers.MobileNetV2ForImageClassification(config)), image
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=768, num_attention_heads=12,
                                     intermediate_size=3072)
    layer = transformers.BertModel(config, add_pooling_layer=False).encoder.layer[0]

    class Layer(torch.nn.Module):
        """One encoder layer called on hidden states alone."""

        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, h):
            return self.layer(h)

    return Layer(), (torch.randn(1, 128, 768),)
