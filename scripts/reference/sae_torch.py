#!/usr/bin/python3
"""TopK SAE training-step timing in PyTorch, the way SAELens's training loop runs it (one size per process).

Usage: /usr/bin/python3 sae_torch.py --d-in 64 [--expansion 8] [--k 32] [--batch 4096]
                                     [--steps 20] [--warmup 3] [--threads 2] [--activations acts.npy]

The step (SAELens's TopKTrainingSAE and SAETrainer, written from their published definitions):
  sae_in     = x - b_dec                                  (apply_b_dec_to_input)
  hidden_pre = sae_in @ W_enc + b_enc                     (N, d_sae)
  f          = zeros.scatter(topk(hidden_pre, k).indices, relu(values))
  sae_out    = f @ W_dec + b_dec
  mse        = (sae_out - x)^2 summed over d_in, mean over rows
  AuxK       = when features are dead: the dead features' k_aux = d_in // 2 largest pre-activations
               (negative ones too) decode the detached residual x - sae_out; weight
               aux_coefficient * min(1, n_dead / k_aux)
  loss.backward(); the W_dec gradient's component along each row removed; Adam.step;
  W_dec rows renormalised to unit norm; each feature's rows since it last fired updated.
Adam(lr 4e-4, betas 0.9/0.999, eps 1e-8); W_dec random unit rows, W_enc = W_dec^T, biases 0;
aux_coefficient 1/32 and a feature dead after 100,000 rows without firing: headlab's defaults
(train/sae_trainer.h), so both sides do the same work. Activations: --activations (N, d_in)
float32 .npy, else random normal rows; 4 batches pre-drawn and cycled (not timed).
Prints one JSON line: step_ms_median, tokens_per_s (batch / median step time, after warmup),
peak_rss_kb.
"""
import argparse
import json
import resource
import statistics
import time

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d-in", type=int, required=True)
    ap.add_argument("--expansion", type=int, default=8)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--activations", help="(N, d_in) float32 .npy; default random normal rows")
    ap.add_argument("--aux-coefficient", type=float, default=1 / 32)
    ap.add_argument("--dead-after", type=int, default=100000)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    d_in, d_sae, N = a.d_in, a.d_in * a.expansion, a.batch

    if a.activations:
        acts = torch.from_numpy(np.load(a.activations).astype(np.float32, copy=False))
        if acts.ndim != 2 or acts.shape[1] != d_in or acts.shape[0] < N:
            raise SystemExit(f"{a.activations}: need (>= {N}, {d_in}) activations, got {tuple(acts.shape)}")
        batches = [acts[i * N:(i + 1) * N].contiguous() for i in range(acts.shape[0] // N)]
    else:
        batches = [torch.randn(N, d_in) for _ in range(4)]

    W_dec = torch.randn(d_sae, d_in)
    W_dec /= W_dec.norm(dim=-1, keepdim=True)
    W_dec = torch.nn.Parameter(W_dec)
    W_enc = torch.nn.Parameter(W_dec.detach().t().clone())
    b_enc = torch.nn.Parameter(torch.zeros(d_sae))
    b_dec = torch.nn.Parameter(torch.zeros(d_in))
    opt = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=4e-4, betas=(0.9, 0.999), eps=1e-8)
    rows_since_fired = torch.zeros(d_sae, dtype=torch.long)

    def step(x):
        sae_in = x - b_dec
        hidden_pre = sae_in @ W_enc + b_enc
        top = hidden_pre.topk(a.k, dim=-1)
        f = torch.zeros_like(hidden_pre).scatter(-1, top.indices, top.values.relu())
        sae_out = f @ W_dec + b_dec
        loss = (sae_out - x).pow(2).sum(dim=-1).mean()
        dead = rows_since_fired >= a.dead_after
        n_dead = int(dead.sum())
        if a.aux_coefficient > 0 and n_dead > 0:
            k_aux = d_in // 2
            scale = min(n_dead / k_aux, 1.0)
            k_aux = min(k_aux, n_dead)
            residual = (x - sae_out).detach()
            aux_pre = torch.where(dead[None], hidden_pre, -torch.inf)
            aux_top = aux_pre.topk(k_aux, dim=-1, sorted=False)
            aux_f = torch.zeros_like(hidden_pre).scatter(-1, aux_top.indices, aux_top.values)
            aux_out = aux_f @ W_dec
            loss = loss + a.aux_coefficient * scale * (aux_out - residual).pow(2).sum(dim=-1).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        with torch.no_grad():
            parallel = (W_dec.grad * W_dec).sum(dim=-1, keepdim=True)
            W_dec.grad -= parallel * W_dec
        opt.step()
        with torch.no_grad():
            W_dec.div_(W_dec.norm(dim=-1, keepdim=True))
            fired = (f > 0).any(dim=0)
            rows_since_fired.add_(N)
            rows_since_fired[fired] = 0
        return loss.item()

    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        step(batches[i % len(batches)])
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    print(json.dumps({"d_in": d_in, "expansion": a.expansion, "d_sae": d_sae, "k": a.k, "batch": N,
                      "threads": a.threads, "steps": a.steps, "step_ms_median": ms,
                      "tokens_per_s": N / (ms / 1e3),
                      "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))


if __name__ == "__main__":
    main()
