#!/usr/bin/env python3
"""Small clients trained together against one after another (issue 42, docs/performance.md "Where a
small client's time goes"): B clients of N examples each, one local epoch of batch 32 and plain
SGD, the MLP (784-200-10) and the CNN of McMahan et al. (two 5x5 convolutions of 32 and 64
channels, 2x2 max-pools, fc 512, fc 10), on one PyTorch device and thread count. "sequential" trains
the clients one after another with their own parameter tensors; "batched" stacks the B clients'
parameters and trains them as one computation: batched matrix products (torch.baddbmm) for the
fully connected layers, grouped convolutions (groups = B) for the convolutions, the loss the sum of
each client's mean, so that each client's gradient is its own. Before timing, both are checked to
give each client the same parameters after its epoch (max |a - b| printed; past --tolerance the
script fails).

Usage: /usr/bin/python3 bench/batched_training.py [--clients 10,100] [--examples 60] [--device cpu]
       [--threads 1] [--models mlp,cnn] [--repeats 3]
Prints one JSON object per (model, clients): the seconds of each way (the best of --repeats), their
ratio (sequential / batched: above 1, batching is faster) and the largest parameter difference.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

BS = 32
LR = 0.05


def mlp_params(g, b):
    w1 = torch.randn(200, 784, generator=g) * 0.03
    w2 = torch.randn(10, 200, generator=g) * 0.07
    return [w1.expand(b, -1, -1).clone(), torch.zeros(b, 200), w2.expand(b, -1, -1).clone(), torch.zeros(b, 10)]


def cnn_params(g, b):
    shapes = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)]
    out = []
    for s in shapes:
        t = torch.randn(*s, generator=g) * (0.05 if len(s) > 1 else 0.0)
        out.append(t.expand(b, *s).clone())
    return out


def mlp_one(p, x):  # p: one client's tensors
    return F.relu(x @ p[0].t() + p[1]) @ p[2].t() + p[3]


def mlp_many(p, x):  # x [B, n, 784]
    h = F.relu(torch.baddbmm(p[1].unsqueeze(1), x, p[0].transpose(1, 2)))
    return torch.baddbmm(p[3].unsqueeze(1), h, p[2].transpose(1, 2))


def cnn_one(p, x):  # x [n, 784]
    x = x.view(-1, 1, 28, 28)
    x = F.max_pool2d(F.relu(F.conv2d(x, p[0], p[1], padding=2)), 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, p[2], p[3], padding=2)), 2)
    x = F.relu(x.flatten(1) @ p[4].t() + p[5])
    return x @ p[6].t() + p[7]


def cnn_many(p, x):  # x [B, n, 784]: the clients as groups of channels
    b, n = x.shape[0], x.shape[1]
    x = x.transpose(0, 1).reshape(n, b, 28, 28)
    x = F.max_pool2d(F.relu(F.conv2d(x, p[0].reshape(b * 32, 1, 5, 5), p[1].reshape(-1), padding=2, groups=b)), 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, p[2].reshape(b * 64, 32, 5, 5), p[3].reshape(-1), padding=2, groups=b)), 2)
    x = x.reshape(n, b, 64 * 49).transpose(0, 1)  # [B, n, 3136]
    x = F.relu(torch.baddbmm(p[5].unsqueeze(1), x, p[4].transpose(1, 2)))
    return torch.baddbmm(p[7].unsqueeze(1), x, p[6].transpose(1, 2))


def sequential(params, one, X, Y):
    out = []
    for k in range(X.shape[0]):
        p = [t[k].clone().requires_grad_() for t in params]
        for s in range(0, X.shape[1], BS):
            loss = F.cross_entropy(one(p, X[k, s:s + BS]), Y[k, s:s + BS])
            grads = torch.autograd.grad(loss, p)
            with torch.no_grad():
                for t, g in zip(p, grads):
                    t.sub_(g, alpha=LR)
        out.append([t.detach() for t in p])
    return out


def batched(params, many, X, Y):
    p = [t.clone().requires_grad_() for t in params]
    classes = params[-1].shape[1]
    for s in range(0, X.shape[1], BS):
        x, y = X[:, s:s + BS], Y[:, s:s + BS]
        logits = many(p, x)
        loss = F.cross_entropy(logits.reshape(-1, classes), y.reshape(-1), reduction="sum") / x.shape[1]
        grads = torch.autograd.grad(loss, p)
        with torch.no_grad():
            for t, g in zip(p, grads):
                t.sub_(g, alpha=LR)
    return [[t[k].detach() for t in p] for k in range(X.shape[0])]


def best(f, repeats, device):
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        f()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="10,100")
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="the largest parameter difference between the two ways accepted (else exit 1)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    models = {"mlp": (mlp_params, mlp_one, mlp_many), "cnn": (cnn_params, cnn_one, cnn_many)}
    for name in a.models.split(","):
        make, one, many = models[name]
        for b in [int(x) for x in a.clients.split(",")]:
            g = torch.Generator().manual_seed(1)
            params = [t.to(dev) for t in make(g, b)]
            X = torch.rand(b, a.examples, 784, generator=g).to(dev)
            Y = torch.randint(0, 10, (b, a.examples), generator=g).to(dev)
            s_out, b_out = sequential(params, one, X, Y), batched(params, many, X, Y)
            diff = max(float((u - v).abs().max()) for cs, cb in zip(s_out, b_out) for u, v in zip(cs, cb))
            if not diff <= a.tolerance:
                raise SystemExit(f"batched_training: {name} with {b} clients: the two ways differ by {diff} "
                                 f"(more than --tolerance {a.tolerance})")
            ts = best(lambda: sequential(params, one, X, Y), a.repeats, dev)
            tb = best(lambda: batched(params, many, X, Y), a.repeats, dev)
            print(json.dumps({"model": name, "clients": b, "examples": a.examples, "device": a.device,
                              "threads": a.threads, "torch": torch.__version__, "sequential_s": round(ts, 4),
                              "batched_s": round(tb, 4), "sequential_over_batched": round(ts / tb, 2),
                              "max_param_diff": diff}), flush=True)


if __name__ == "__main__":
    main()
