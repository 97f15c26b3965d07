#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The PyTorch baseline of benchmarks/training_step.cpp: one training step (forward, backward
by autograd, an SGD update of every parameter) of the same two models, float32, in PyTorch's
eager mode on the CPU, the model whole in one process:

  mlp_step          loss = mean((tanh(x W1) W2 - t)^2), x and t (batch, width)
  transformer_step  layer norm, multi-head self-attention with a residual connection, layer
                    norm, a tanh MLP of 4 x width hidden units with a residual connection;
                    loss = mean((block(x) - t)^2), x and t (sequences, length, width)

with the sizes and the initial scales of training_step.cpp. Each step starts from the last
one's parameters. Timed as bench_common.hpp times: a warm-up step, batches of about 20 ms,
the best of 3, per step. Runs once per thread count given (torch.set_num_threads), and
prints CSV rows in the suite's format (impl torch_eager_<threads>t):

  impl,collective,devices,bytes,actual_bytes,seconds

  python3 benchmarks/torch_training_step.py --threads 4,1 [--batch 64 --width 1024 ...]
"""
import argparse
import math
import sys
import time

import torch


def layer_norm(x):
    centered = x - x.mean(dim=-1, keepdim=True)
    variance = (centered * centered).mean(dim=-1, keepdim=True)
    return centered / torch.sqrt(variance + 1e-5)


def mlp_loss(params, x, t):
    w1, w2 = params
    r = torch.tanh(x @ w1) @ w2 - t
    return (r * r).mean()


def block_loss(params, x, t):
    wq, wk, wv, wo, w1, w2 = params  # wq, wk, wv (head, feature, head_width), wo (head, head_width, feature)
    n = layer_norm(x)
    scale = 1.0 / math.sqrt(wq.shape[2])
    q = torch.einsum("slw,hwd->shld", n, wq) * scale
    k = torch.einsum("slw,hwd->shld", n, wk)
    v = torch.einsum("slw,hwd->shld", n, wv)
    mixed = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v  # (sequence, head, position, head_width)
    h = x + torch.einsum("shld,hdw->slw", mixed, wo)
    r = h + torch.tanh(layer_norm(h) @ w1) @ w2 - t
    return (r * r).mean()


def sgd_step(loss_fn, params, x, t, learning_rate=0.01):
    loss = loss_fn(params, x, t)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        updated = [(p - learning_rate * g).requires_grad_() for p, g in zip(params, grads)]
    return updated, loss.item()


def best_time(step, reps=3):
    step()
    start = time.perf_counter()
    step()
    k = max(1, min(2000, int(0.02 / max(time.perf_counter() - start, 1e-9))))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(k):
            step()
        best = min(best, (time.perf_counter() - start) / k)
    return best


def time_model(name, loss_fn, params, x, t):
    state = {"params": [p.requires_grad_() for p in params], "first": None}

    def step():
        state["params"], loss = sgd_step(loss_fn, state["params"], x, t)
        if state["first"] is None:
            state["first"] = loss

    seconds = best_time(step)
    return seconds, state["first"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="4,1")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--block-width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    a = parser.parse_args()
    torch.manual_seed(5)
    randn = lambda *shape, scale=1.0: torch.randn(*shape, dtype=torch.float32) * scale  # noqa: E731

    x = randn(a.batch, a.width)
    t = randn(a.batch, a.width)
    mlp = [randn(a.width, a.hidden, scale=1 / math.sqrt(a.width)), randn(a.hidden, a.width, scale=1 / math.sqrt(a.hidden))]

    hw, hidden = a.block_width // a.heads, 4 * a.block_width
    bx = randn(a.sequences, a.length, a.block_width)
    bt = randn(a.sequences, a.length, a.block_width)
    s = 1 / math.sqrt(a.block_width)
    block = [randn(a.heads, a.block_width, hw, scale=s), randn(a.heads, a.block_width, hw, scale=s),
             randn(a.heads, a.block_width, hw, scale=s), randn(a.heads, hw, a.block_width, scale=s),
             randn(a.block_width, hidden, scale=s), randn(hidden, a.block_width, scale=1 / math.sqrt(hidden))]

    print("impl,collective,devices,bytes,actual_bytes,seconds")
    for threads in (int(n) for n in a.threads.split(",")):
        torch.set_num_threads(threads)
        impl = f"torch_eager_{threads}t"
        seconds, loss = time_model("mlp", mlp_loss, [p.clone() for p in mlp], x, t)
        print(f"{impl},mlp_step,4,{x.numel() * 4},{x.numel() * 4},{seconds:.9g}")
        print(f"  {impl}: mlp_step {seconds * 1e3:.2f} ms (loss {loss:.6f})", file=sys.stderr)
        seconds, loss = time_model("block", block_loss, [p.clone() for p in block], bx, bt)
        print(f"{impl},transformer_step,4,{bx.numel() * 4},{bx.numel() * 4},{seconds:.9g}")
        print(f"  {impl}: transformer_step {seconds * 1e3:.2f} ms (loss {loss:.6f})", file=sys.stderr)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
