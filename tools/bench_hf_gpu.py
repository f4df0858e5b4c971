#!/usr/bin/env python3
"""PyTorch + transformers on the same GPU and checkpoints as bench/bench_cuda.c: pp512 and
PPL-eval (2048 tokens, every position scored) tokens/s in bf16, eager and SDPA attention; and,
given the MoE and then the dense checkpoint, one distillation step as bench_cuda's distill row
runs it (the teacher in bf16, the student trained in fp32: forward KL, clipping, AdamW).

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


def load(path, dtype, attn="sdpa"):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn).to(DEVICE)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation=attn).to(DEVICE)


def distill(teacher_path, student_path, L=512):
    """An optimizer step of the student on one window: the teacher's logits (bf16, no grad), the
    student's forward and backward in fp32, KL(p_T || p_S) summed over positions, the gradient
    clipped to norm 1, torch.optim.AdamW; the mean of 3 steps after a warm-up."""
    teacher, student = load(teacher_path, torch.bfloat16).eval(), load(student_path, torch.float32).train()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    t = tokens(L - 1, teacher.config.vocab_size)

    def step():
        with torch.no_grad():
            pt = torch.log_softmax(teacher(t).logits.float(), -1)
        ls = torch.log_softmax(student(t).logits, -1)
        loss = torch.nn.functional.kl_div(ls, pt, log_target=True, reduction="sum")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    sync()
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    dt = (time.perf_counter() - t0) / 3
    print(f"| distillation step (L = {L}, 1 window) | PyTorch eager, teacher bf16, student fp32 | {dt * 1e3:.1f} ms | {L / dt:.0f} tokens/s |",
          flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    import transformers
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu'}")
    print("| checkpoint | implementation | pp512 tok/s | ppl-2048 tok/s |\n|---|---|---|---|")
    for path in sys.argv[1:]:
        for attn in ("eager", "sdpa"):
            bench(path, attn)
    if len(sys.argv) == 3:
        distill(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
