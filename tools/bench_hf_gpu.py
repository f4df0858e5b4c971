#!/usr/bin/env python3
"""PyTorch + transformers on the same GPU and checkpoints as bench/bench_cuda.c: pp512 and
PPL-eval (2048 tokens, every position scored) tokens/s in bf16, eager and SDPA attention.

usage: tools/bench_hf_gpu.py DIR [DIR ...]   (the checkpoints bench_cuda wrote)
Run by tools/gpu_check.sh on the GPU machine (its python3 has torch and transformers); never part
of the build or of `make test`. Timings: best of several runs after a warm-up, each ended by
torch.cuda.synchronize(); the same token generator as bench_cuda. M2D_HF_DEVICE=cpu runs it on the
CPU (a smoke test of this script on a machine without a GPU; the numbers mean nothing there)."""
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM

DEVICE = os.environ.get("M2D_HF_DEVICE", "cuda")


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def tokens(n, vocab):
    s, out = 12345, []
    for _ in range(n + 1):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append((s >> 33) % vocab)
    return torch.tensor([out], device=DEVICE)


def best_time(fn, reps):
    best = float("inf")
    for r in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if r:
            best = min(best, time.perf_counter() - t0)
    return best


@torch.inference_mode()
def bench(path, attn):
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation=attn)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, attn_implementation=attn)
    model = model.to(DEVICE).eval()
    vocab = model.config.vocab_size
    t = tokens(2048, vocab)

    def pp():  # prompt processing: logits of the last position only
        model(t[:, :512], logits_to_keep=1)

    def ppl():  # every position scored: log-softmax gathered at the next token
        logits = model(t[:, :2047]).logits.float()
        torch.log_softmax(logits, -1).gather(-1, t[:, 1:2048, None]).sum()

    tp, tl = best_time(pp, 5), best_time(ppl, 3)
    print(f"| {path.rstrip('/').split('/')[-1]:<28} | transformers bf16 {attn:<5} | {512 / tp:10.0f} | {2047 / tl:10.0f} |",
          flush=True)
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    import transformers
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}")
    print("| checkpoint | implementation | pp512 tok/s | ppl-2048 tok/s |\n|---|---|---|---|")
    for path in sys.argv[1:]:
        for attn in ("eager", "sdpa"):
            bench(path, attn)


if __name__ == "__main__":
    main()
