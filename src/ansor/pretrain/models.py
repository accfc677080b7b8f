"""Reference models with random but fixed weights, built from `transformers` configurations.

Their fused subgraphs are part of the pretraining corpus (what `ansor tune` sees of real
networks), and the model benchmarks time the same networks, so both name them here once.
torch and transformers are imported only when a model is made (the `models` extra).
"""

from __future__ import annotations

from typing import Any

#: The names `make_model` knows. The last three are not in the pretraining corpus: they check
#: that what works on the corpus's networks carries over to others (depthwise 7x7 convolutions,
#: channels-last LayerNorm and GELU MLPs; a ViT encoder layer; a pre-norm decoder layer with
#: RMSNorm, rotary positions, grouped-query attention and a gated SiLU MLP).
MODEL_NAMES = ("resnet18", "resnet50", "mobilenet_v2", "bert_layer", "convnext", "vit_layer", "llama_layer")


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
    if name == "convnext":
        config = transformers.ConvNextConfig(hidden_sizes=[48, 96, 192, 384], depths=[2, 2, 4, 2], num_labels=1000)
        return Logits(transformers.ConvNextForImageClassification(config)), image
    if name == "vit_layer":
        config = transformers.ViTConfig(hidden_size=384, num_attention_heads=6, intermediate_size=1536,
                                        num_hidden_layers=1, image_size=224, patch_size=16)
        return _last_hidden_state(transformers.ViTModel(config, add_pooling_layer=False), "pixel_values"), image
    if name == "llama_layer":
        config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                          num_key_value_heads=4, num_hidden_layers=1, vocab_size=1000)
        return _last_hidden_state(transformers.LlamaModel(config), "inputs_embeds"), (torch.randn(1, 128, 512),)
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


def _last_hidden_state(model: Any, argument: str) -> Any:
    """A `transformers` base model called with one keyword input, returning its last hidden
    state alone (no cache: one forward pass, as the model benchmarks time it)."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            extra = {"use_cache": False} if argument == "inputs_embeds" else {}
            return self.model(**{argument: x}, **extra).last_hidden_state

    return Hidden()
