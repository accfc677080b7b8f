"""Token-by-token decoding: a GPT-2 decode step as a graph, and a greedy loop over its compiled model.

A language model generates one token per call of its *decode step*: the new token's query row
attends over the keys and values of every earlier token, kept in a cache. Here the step is an
ordinary graph with one extra operator: per layer, `cache_write` puts the new key and value
rows into caches of a declared maximum length (graph inputs, which the compiled model owns as
state and writes in place, `graph.kv_cache`), and the fused attention reads the whole cache
under the padding-lengths mask (`lengths` = position + 1), which skips the key tiles past the
valid prefix. Every shape is static, so the step is tuned and compiled once and serves every
position up to the maximum; no cache is copied per token.

`gpt2_decode_step` writes the step from a transformers `GPT2LMHeadModel`'s configuration and
weights (the eager model's computation, layer by layer: embeddings, pre-norm blocks with
Conv1D projections and the tanh GELU, the tied LM head); `greedy_generate` runs the prompt
through it token by token and then picks the most likely token each step, as
`GPT2LMHeadModel.generate(do_sample=False)` does.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ansor.graph.ir import Graph, GraphError

class GrowingCacheError(ValueError):
    """A graph that appends the new key/value rows to a past it is given (a concat along a
    dynamic length, as a decode loop passing `past_key_values` to `torch.compile(dynamic=True)`
    is traced): bucketed dynamic shapes cannot serve it (a past padded to its bucket would put
    padding among the keys), so it is refused with the way that serves it."""


def refuse_growing_cache(error: Exception) -> Exception:
    """The refusal to raise for `error`, a `PaddingError` of a bucketed build: a
    GrowingCacheError, one line naming the concat and `gpt2_decode_step`, when the refused node
    is a concat (a cache grown by appending); else `error` itself."""
    node = getattr(error, "node", None)
    if node is None or node.op != "concat":
        return error
    return GrowingCacheError(
        f"ansor: concat %{node.output} appends along a dynamic length (as a key/value cache passed back as "
        f"past_key_values does), which bucketed dynamic shapes cannot serve; decode with caches written in "
        f"place instead: ansor.build(ansor.graph.decode.gpt2_decode_step(model, max_length)), greedy_generate")


#: The graph inputs of a decode step besides the caches.
TOKEN_INPUT, POSITION_INPUT = "input_ids", "position"


def cache_input_names(layers: int) -> list[str]:
    """The cache inputs of a step of `layers` layers, in graph order: key then value per layer."""
    return [name for layer in range(layers) for name in (f"past_key_{layer}", f"past_value_{layer}")]


def gpt2_decode_step(model: Any, max_length: int) -> Graph:
    """The decode step of a transformers `GPT2LMHeadModel` (batch 1, one new token) with caches
    of `max_length` positions: inputs `input_ids` [1, 1] int64, `position` [1] int64 and the
    caches [1, heads, max_length, head dim] float32 (`cache_input_names`); output the logits
    [1, 1, vocabulary]. Configurations the step does not write are refused by name."""
    cfg = model.config
    refused = {"add_cross_attention": False, "scale_attn_by_inverse_layer_idx": False,
               "reorder_and_upcast_attn": False, "scale_attn_weights": True}
    for key, wanted in refused.items():
        if getattr(cfg, key, wanted) != wanted:
            raise GraphError(f"gpt2_decode_step: {key}={getattr(cfg, key)} is not supported")
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
        raise GraphError(f"gpt2_decode_step: activation {cfg.activation_function!r} is not supported")
    if not 1 <= max_length <= cfg.n_positions:
        raise GraphError(f"gpt2_decode_step: max_length {max_length} must lie in [1, {cfg.n_positions}] "
                         f"(the model's position table)")
    width, heads = cfg.n_embd, cfg.n_head
    head_dim = width // heads
    weights = {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}
    approximate = "none" if cfg.activation_function == "gelu" else "tanh"

    g = Graph()
    ids = g.add_input(TOKEN_INPUT, (1, 1), "int64")
    position = g.add_input(POSITION_INPUT, (1,), "int64")
    caches = [g.add_input(name, (1, heads, max_length, head_dim), "float32")
              for name in cache_input_names(cfg.n_layer)]

    def const(name: str, transpose: bool = False) -> str:
        array = weights[name]
        return g.add_constant(np.ascontiguousarray(array.T if transpose else array))

    def conv1d(x: str, prefix: str, source: str) -> str:
        """transformers' Conv1D: x @ weight + bias, weight [in, out] (a linear's transposed)."""
        return g.add_node("linear", [x, const(f"{prefix}.weight", True), const(f"{prefix}.bias")], None, source)

    def layer_norm(x: str, prefix: str) -> str:
        return g.add_node("layer_norm", [x, const(f"{prefix}.weight"), const(f"{prefix}.bias")],
                          {"eps": float(cfg.layer_norm_epsilon)}, prefix)

    tokens = g.add_node("embedding", [const("transformer.wte.weight"), ids], {"negative_ids": False}, "wte")
    where = g.add_node("reshape", [position], {"shape": (1, 1)}, "wpe")
    x = g.add_node("add", [tokens, g.add_node("embedding", [const("transformer.wpe.weight"), where],
                                              {"negative_ids": False}, "wpe")], None, "embeddings")
    one = g.add_constant(np.asarray(1, dtype=np.int64))
    lengths = g.add_node("cast", [g.add_node("add", [position, one], None, "lengths")], {"dtype": "int32"}, "lengths")
    for layer in range(cfg.n_layer):
        p = f"transformer.h.{layer}"
        h = layer_norm(x, f"{p}.ln_1")
        qkv_weight, qkv_bias = weights[f"{p}.attn.c_attn.weight"], weights[f"{p}.attn.c_attn.bias"]
        rows = []
        for part in range(3):  # the merged projection as three: the graph rewrites merge them again where it pays
            cols = slice(part * width, (part + 1) * width)
            y = g.add_node("linear", [h, g.add_constant(np.ascontiguousarray(qkv_weight[:, cols].T)),
                                      g.add_constant(np.ascontiguousarray(qkv_bias[cols]))], None, f"{p}.attn.c_attn")
            # one token: [1, 1, heads * head_dim] is [1, heads, 1, head_dim] in the same order
            rows.append(g.add_node("reshape", [y], {"shape": (1, heads, 1, head_dim)}, f"{p}.attn"))
        q, k, v = rows
        keys = g.add_node("cache_write", [caches[2 * layer], k, position], None, f"{p}.attn.key_cache")
        values = g.add_node("cache_write", [caches[2 * layer + 1], v, position], None, f"{p}.attn.value_cache")
        a = g.add_node("attention", [q, keys, values, lengths],
                       {"scale": 1.0 / math.sqrt(head_dim), "causal": False, "mask": "lengths"}, f"{p}.attn")
        a = conv1d(g.add_node("reshape", [a], {"shape": (1, 1, width)}, f"{p}.attn"), f"{p}.attn.c_proj", f"{p}.attn.c_proj")
        x = g.add_node("add", [x, a], None, f"{p}.attn")
        h = conv1d(layer_norm(x, f"{p}.ln_2"), f"{p}.mlp.c_fc", f"{p}.mlp.c_fc")
        h = g.add_node("gelu", [h], {"approximate": approximate}, f"{p}.mlp")
        x = g.add_node("add", [x, conv1d(h, f"{p}.mlp.c_proj", f"{p}.mlp.c_proj")], None, f"{p}.mlp")
    x = layer_norm(x, "transformer.ln_f")
    head = weights.get("lm_head.weight", weights["transformer.wte.weight"])
    logits = g.add_node("linear", [x, g.add_constant(np.ascontiguousarray(head))], None, "lm_head")
    g.outputs = [logits]
    g.validate()
    return g


def greedy_generate(step: Any, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """`new_tokens` tokens chosen greedily after `prompt` by a compiled decode step (`step`, a
    `CompiledModel` of `gpt2_decode_step` or any graph with its inputs): its caches are reset,
    the prompt is fed one token per call, then each call feeds the token the previous one
    chose. Ties go to the lower token id, as torch.argmax. Refuses a sequence longer than the
    caches."""
    if not prompt:
        raise ValueError("greedy_generate: the prompt must hold at least one token")
    capacity = _cache_length(step)
    if len(prompt) + new_tokens - 1 > capacity:
        raise ValueError(f"greedy_generate: {len(prompt)} prompt tokens and {new_tokens} new ones need "
                         f"{len(prompt) + new_tokens - 1} cache positions, the step has {capacity}")
    step.reset_state()
    token = np.zeros((1, 1), dtype=np.int64)
    position = np.zeros((1,), dtype=np.int64)
    generated: list[int] = []
    logits = None
    for index in range(len(prompt) + new_tokens - 1):
        token[0, 0] = prompt[index] if index < len(prompt) else generated[-1]
        position[0] = index
        logits = step(token, position)
        if index >= len(prompt) - 1:
            generated.append(int(np.argmax(logits.reshape(-1))))
    return generated


def _cache_length(step: Any) -> int:
    state = getattr(step, "state", None)
    if not state:
        raise TypeError("greedy_generate: the step has no key/value caches (build gpt2_decode_step's graph)")
    return min(buffer.shape[2] for buffer in state.values())
