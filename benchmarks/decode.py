"""GPT-2 decoding token by token: ansor's compiled decode step beside PyTorch eager and onnxruntime.

    python benchmarks/decode.py --tokens 64 --width 256 --database decode.db --quick-seconds 60

A `GPT2LMHeadModel` (2 layers, `--width`, random weights) generates `--tokens` greedy tokens
after a random prompt three ways: ansor (`graph.decode.gpt2_decode_step` built once, caches of
`--max-length` written in place, `greedy_generate`), PyTorch eager with its own KV cache
(`model(token, past_key_values=...)` per token, as `generate` runs it), and onnxruntime on a
decode step exported from the same weights with the past as inputs and the present (past
concatenated with the new row) as outputs, the form transformers' ONNX exports take. The
tokens of all three are checked equal first; then whole generations are timed in turns
(several rounds, medians, the paired ratio per round), so a loaded machine weighs on all of
them alike. PyTorch and onnxruntime also run on one thread (rows of their own): a step this
small gains little from a second core, and on a busy machine their parallel regions wait for
it. Without a database the kernels are untuned default schedules.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import numpy as np
from common import TURN_PAUSE_S, machine_name

from ansor.baselines import paired_ratio, time_in_turns


def gpt2(width: int, heads: int, vocab: int, seed: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=2, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=1024,
                     initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


def torch_generate(model, prompt: list[int], tokens: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        generated = [int(out.logits[0, -1].argmax())]
        for _ in range(tokens - 1):
            out = model(torch.tensor([[generated[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            generated.append(int(out.logits[0, -1].argmax()))
    return generated


class _StepWithPast:
    """GPT-2's decode step written with torch from the model's weights, past in, present out
    (for the ONNX export: transformers' cache objects do not export as plain tensors)."""

    def __new__(cls, model):
        import torch

        class Step(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, ids, position, *past):
                t = self.m.transformer
                cfg = self.m.config
                heads, dim = cfg.n_head, cfg.n_embd // cfg.n_head
                x = t.wte(ids) + t.wpe(position.view(1, 1))
                present = []
                for layer, block in enumerate(t.h):
                    q, k, v = block.attn.c_attn(block.ln_1(x)).split(cfg.n_embd, dim=2)
                    q, k, v = (y.view(1, 1, heads, dim).transpose(1, 2) for y in (q, k, v))
                    k = torch.cat([past[2 * layer], k], dim=2)
                    v = torch.cat([past[2 * layer + 1], v], dim=2)
                    present += [k, v]
                    w = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(dim), dim=-1)
                    a = (w @ v).transpose(1, 2).reshape(1, 1, cfg.n_embd)
                    x = x + block.attn.c_proj(a)
                    x = x + block.mlp(block.ln_2(x))
                return (self.m.lm_head(t.ln_f(x)), *present)

        return Step().eval()


def one_thread_torch(fn):
    """`fn` run with PyTorch on one thread (its thread count put back after): on a busy machine a
    parallel region waits for its second thread, so a small model's step can run faster alone."""
    import torch

    def run():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(threads)

    return run


def onnx_generate_fn(model, prompt: list[int], tokens: int, threads: int | None = None):
    """A callable generating with onnxruntime on the exported step (None without onnxruntime),
    with `threads` intra-op threads (None: one per core)."""
    try:
        import onnxruntime as ort
        import torch
    except ImportError:
        return None
    cfg = model.config
    heads, dim = cfg.n_head, cfg.n_embd // cfg.n_head
    step = _StepWithPast(model)
    past = [torch.zeros(1, heads, 1, dim) for _ in range(4)]
    names = [f"past_{i}" for i in range(4)]
    path = os.path.join(tempfile.mkdtemp(), "decode_step.onnx")
    torch.onnx.export(step, (torch.tensor([[1]]), torch.tensor([1]), *past), path, dynamo=False,
                      input_names=["ids", "position", *names],
                      output_names=["logits", *[f"present_{i}" for i in range(4)]],
                      dynamic_axes={n: {2: "past"} for n in names}, opset_version=17)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def generate() -> list[int]:
        caches = [np.zeros((1, heads, 0, dim), np.float32) for _ in range(4)]
        generated: list[int] = []
        for index in range(len(prompt) + tokens - 1):
            token = prompt[index] if index < len(prompt) else generated[-1]
            outs = session.run(None, {"ids": np.array([[token]], np.int64), "position": np.array([index], np.int64),
                                      **dict(zip(names, caches))})
            caches = outs[1:]
            if index >= len(prompt) - 1:
                generated.append(int(np.argmax(outs[0].reshape(-1))))
        return generated

    return generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--database", default=None, help="records to build from (none: default schedules)")
    parser.add_argument("--quick-seconds", type=float, default=0.0, help="quick search of kernels without records")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import torch

    from ansor.graph.compiled import build_model
    from ansor.graph.decode import gpt2_decode_step, greedy_generate
    from ansor.store import open_store

    torch.set_num_threads(os.cpu_count() or 1)
    model = gpt2(args.width, args.heads, args.vocab, seed=0)
    prompt = np.random.default_rng(0).integers(0, args.vocab, args.prompt).tolist()
    store = open_store(args.database)[0] if args.database else None
    step = build_model(gpt2_decode_step(model, args.max_length), store, check=True,
                       quick_seconds=args.quick_seconds)
    print(step.summary(), file=sys.stderr)

    fns = {"ansor": lambda: greedy_generate(step, prompt, args.tokens),
           "pytorch eager (KV cache)": lambda: torch_generate(model, prompt, args.tokens)}
    if (os.cpu_count() or 1) > 1:
        fns["pytorch eager (KV cache), 1 thread"] = one_thread_torch(fns["pytorch eager (KV cache)"])
    onnx = onnx_generate_fn(model, prompt, args.tokens)
    if onnx is not None:
        fns["onnxruntime (past in, present out)"] = onnx
        if (os.cpu_count() or 1) > 1:
            fns["onnxruntime, 1 thread"] = onnx_generate_fn(model, prompt, args.tokens, threads=1)
    tokens = {name: fn() for name, fn in fns.items()}
    reference = tokens["pytorch eager (KV cache)"]
    for name, got in tokens.items():
        print(f"{name}: tokens {'identical' if got == reference else 'DIFFERENT'} ({len(set(got))} distinct)")
    if any(got != reference for got in tokens.values()):
        return 1

    timings = time_in_turns(fns, rounds=args.rounds, pause_s=TURN_PAUSE_S)
    print(f"GPT-2 2 layers, width {args.width}, vocab {args.vocab}: {args.prompt} prompt + {args.tokens} "
          f"greedy tokens, caches of {args.max_length}; {machine_name()}, timed in turns, "
          f"{args.rounds} rounds (medians)")
    base = timings["ansor"]
    for name, t in timings.items():
        ratio = "" if name == "ansor" else f"  {paired_ratio(t, base):.2f}x ansor's time"
        print(f"  {name:38s} {t.median * 1e3:8.2f} ms  ({t.median / (args.prompt + args.tokens - 1) * 1e6:7.1f} us/token){ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
