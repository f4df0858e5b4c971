"""An independent reference of `moe2dense distill`: the same knowledge-distillation steps done with
Hugging Face transformers' own Qwen3 / Qwen3-MoE modelling (and GPT-OSS's, OLMoE's, DeepSeek-V2's and Mixtral's: FAMILIES) and torch (autograd, torch.optim.AdamW,
torch.nn.utils.clip_grad_norm_), for tests/test_distill.c. Runs in tests/ref/.venv-hf.

usage: distill_ref.py --out DIR [--only NAMES]  write the goldens (tests/golden/distill/, make distill-goldens;
                                                 --only: those cases, comma-separated)
       distill_ref.py --compare NEW_DIR OLD_DIR  the goldens made now against the committed ones
       distill_ref.py --bench ...                time the same step as bench/bench_train.c (BENCHMARKS.md), or
                                                 with --device cuda --teacher-dtype bf16 --attn sdpa as
                                                 bench/bench_cuda.c's distillation row (tools/gpu_run.sh)

Per case (CASES below):
 1. teacher (Qwen3MoeForCausalLM) and dense student (Qwen3ForCausalLM, intermediate = k * d_e) from
    the grid generator of tests/testmodel.h (tools/hf_goldens.py), saved with save_pretrained; the
    golden keeps both config.json texts and the sha256 of both model.safetensors, which
    tests/test_distill.c rebuilds byte for byte with moe2dense's writer (OLMoE, DeepSeek-V2 and Mixtral's
    Mistral student from the tensor list the golden keeps, GPT-OSS and Mixtral with tests/familyckpt.c);
 2. data: a text encoded by the byte-level tokenizer of hf_goldens.py, cut into consecutive windows
    of L tokens taken in file order (--order sequential: step s uses windows (s-1)B .. sB-1);
 3. S optimizer steps in float32: teacher logits (full vocabulary; with teacher_topk the routers
    take the K' most probable experts weighted by their raw probabilities, paper Eq. 6), the loss
    (forward KL mean over all positions, reverse KL, or forward KL + mse_weight * the mean squared
    difference of every decoder layer's output, summed over layers ("sum") or balanced as Minitron /
    NeMo ("minitron": each layer's MSE times the detached logit loss over the layers' mean MSE, over
    the layer count)), gradient accumulation over
    micro-batches of b windows, clip_grad_norm_ (the norm before clipping is logged), AdamW
    (betas 0.9/0.95, eps 1e-8, weight decay on tensors of 2+ dimensions only), the learning rate
    of SPEC §7 set before each step;
 4. per step: loss (before the update), grad_norm, lr; at the end the L2 norm of each tensor's
    total update (final - initial weights), named as moe2dense names the checkpoint's tensors
    (update_norms: transformers fuses a one-expert student's experts).
"""
import argparse
import hashlib
import json
import math
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from hf_goldens import byte_tokenizer, checkpoint, sha256, read_text, tensor_list  # noqa: E402

VOCAB = 320
TEACHER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=32, num_experts=8,
               num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, rms_norm_eps=1e-6,
               max_position_embeddings=128, tie_word_embeddings=False, eos_token_id=256)
STUDENT = dict({k: v for k, v in TEACHER.items()
                if k not in ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob",
                             "decoder_sparse_step", "mlp_only_layers")}, intermediate_size=64)

# name -> settings of the run (the C test runs the same)
CASES = {
    "fkl": dict(seq_len=24, batch=4, micro_batch=2, steps=6, warmup=2, lr=3e-3, min_lr=3e-4, weight_decay=0.01,
                clip=0.5, loss="fkl", mse_weight=0.0, teacher_topk=0),
    "rkl-topk": dict(seq_len=16, batch=2, micro_batch=2, steps=5, warmup=1, lr=2e-3, min_lr=2e-4,
                     weight_decay=0.05, clip=0.0, loss="rkl", mse_weight=0.0, teacher_topk=5),
    "fkl-mse": dict(seq_len=16, batch=2, micro_batch=1, steps=5, warmup=0, lr=2e-3, min_lr=1e-4, weight_decay=0.01,
                    clip=1.0, loss="fkl+mse", mse_weight=0.5, teacher_topk=0),
    # Minitron / NeMo's balancing (`--mse-norm minitron`, the default): the mean over layers of each
    # layer's MSE, weighted per micro-batch by the detached ratio of the logit loss to it
    "fkl-mse-minitron": dict(seq_len=16, batch=2, micro_batch=1, steps=5, warmup=0, lr=2e-3, min_lr=1e-4,
                             weight_decay=0.01, clip=1.0, loss="fkl+mse", mse_weight=0.5, teacher_topk=0,
                             mse_norm="minitron"),
}
# Issue 24: the other families' dense students train too. name -> (teacher class, config; student
# class, config): GPT-OSS (q/k/v/o and gate/up/down biases, sinks, a window of 5 cutting into 16
# positions, YaRN over an original context of 16, the clamped SwiGLU with limit 0.6 so that the
# clamps are reached) and OLMoE (the whole-projection q/k norm, clip_qkv 1.5 clamping a good part of
# q, k, v; attention biases); students of one expert routed top-1, as the converter writes them.
# The clamps are kinks: a case must not have a value within fp32 rounding of one after a step, or
# two exact implementations part by more than the C test's tolerances (measured: at limit 0.5, torch
# against itself with the initial weights perturbed by 1e-7 relative moves the step-2 gradient norm
# by 5.7e-5; at 0.6 by 1.2e-7, as the Qwen3 cases).
GPTOSS_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
                layer_types=["sliding_attention", "full_attention"], swiglu_limit=0.6, max_position_embeddings=128,
                eos_token_id=256, pad_token_id=None,
                rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                 "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
OLMOE_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
               norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, clip_qkv=1.5,
               attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
               rms_norm_eps=1e-5, max_position_embeddings=128, tie_word_embeddings=False, eos_token_id=256,
               pad_token_id=1)
# DeepSeek-V2 (multi-head latent attention): q LoRA, values narrower than the heads (12 of 8 + 8: the
# loader pads o_proj, whose padding must never train nor be written), YaRN with mscale !=
# mscale_all_dim (a RoPE attention factor and a softmax mscale), a first dense layer, a shared
# expert; its dense student (every layer dense, width (k + shared) * d_e, MLA unchanged)
DEEPSEEK_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=8,
                  n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, topk_method="greedy",
                  routed_scaling_factor=1.0, norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                  v_head_dim=12, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 16, "beta_fast": 32,
                                                  "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.5},
                  rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False, eos_token_id=256)
# Mixtral (the golden teacher of tests/golden/hf/mixtral.json: head_dim 24 wider than hidden / heads,
# rope_theta 1e6, renormalised top-2 of 8; its window narrowed from 16 to 5 to cut into 16 positions)
# and its dense student MistralForCausalLM (intermediate k * d_e, the window and head_dim kept)
MIXTRAL_T = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24, sliding_window=5,
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-5,
                 max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=256, pad_token_id=None)
FAMILIES = {
    "gptoss": ("GptOssForCausalLM", GPTOSS_T, "GptOssForCausalLM",
               dict(GPTOSS_T, num_local_experts=1, num_experts_per_tok=1, intermediate_size=64)),
    "olmoe": ("OlmoeForCausalLM", OLMOE_T, "OlmoeForCausalLM",
              dict(OLMOE_T, num_experts=1, num_experts_per_tok=1, intermediate_size=64)),
    "deepseekv2": ("DeepseekV2ForCausalLM", DEEPSEEK_T, "DeepseekV2ForCausalLM",
                   dict(DEEPSEEK_T, first_k_dense_replace=2, intermediate_size=48)),
    "mixtral": ("MixtralForCausalLM", MIXTRAL_T, "MistralForCausalLM",
                dict({k: v for k, v in MIXTRAL_T.items() if k not in ("num_local_experts", "num_experts_per_tok")},
                     intermediate_size=64)),
}
CASES.update({
    "gptoss-fkl": dict(seq_len=16, batch=2, micro_batch=1, steps=4, warmup=1, lr=2e-3, min_lr=2e-4, weight_decay=0.01,
                       clip=1.0, loss="fkl", mse_weight=0.0, teacher_topk=0, family="gptoss"),
    "olmoe-rkl": dict(seq_len=16, batch=2, micro_batch=2, steps=4, warmup=1, lr=2e-3, min_lr=2e-4, weight_decay=0.01,
                      clip=1.0, loss="rkl", mse_weight=0.0, teacher_topk=0, family="olmoe"),
    "deepseekv2-fkl": dict(seq_len=16, batch=2, micro_batch=1, steps=4, warmup=1, lr=2e-3, min_lr=2e-4,
                           weight_decay=0.01, clip=1.0, loss="fkl", mse_weight=0.0, teacher_topk=0,
                           family="deepseekv2"),
    "mixtral-fkl": dict(seq_len=16, batch=2, micro_batch=1, steps=4, warmup=1, lr=2e-3, min_lr=2e-4, weight_decay=0.01,
                        clip=1.0, loss="fkl", mse_weight=0.0, teacher_topk=0, family="mixtral"),
})
# --train-precision bf16: the student's projections and LM head on bf16 operands (bf16_linear)
CASES["fkl-bf16"] = dict(CASES["fkl"], train_precision="bf16")
WORDS = ["the", "expert", "router", "dense", "of", "and", "model", "token", "layer", "a", "merge", "group",
         "student", "teacher", "distill", "loss"]


def lr_at(c, s):
    if s <= c["warmup"]:
        return c["lr"] * s / c["warmup"]
    if c["steps"] <= c["warmup"]:
        return c["min_lr"]
    t = (s - c["warmup"]) / (c["steps"] - c["warmup"])
    return c["min_lr"] + (c["lr"] - c["min_lr"]) * 0.5 * (1.0 + math.cos(math.pi * t))


def load(cls_name, d, attn="eager"):
    """fp32, the modelling's eager paths (the goldens' reference), or attention ATTN and the
    experts' default implementation (a speed comparison)"""
    moe = "Moe" in cls_name or cls_name in ("GptOssForCausalLM", "DeepseekV2ForCausalLM", "MixtralForCausalLM")
    kw = {"experts_implementation": "eager"} if moe and attn == "eager" else {}
    m = getattr(transformers, cls_name).from_pretrained(d, dtype=torch.float32, attn_implementation=attn, **kw)
    return m


def layer_outputs(model):
    """Forward hooks recording every decoder layer's output (the residual stream after it)."""
    outs = []
    for layer in model.model.layers:
        layer.register_forward_hook(lambda _m, _i, o: outs.append(o[0] if isinstance(o, tuple) else o))
    return outs


def set_route_topk(teacher, k):
    for layer in teacher.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if isinstance(gate, torch.nn.Module) and hasattr(gate, "top_k"):
            gate.top_k = k
            gate.norm_topk_prob = False  # Eq. 6: raw probabilities


def divergence(zt, zs, kind):
    lt, ls = torch.log_softmax(zt, -1), torch.log_softmax(zs, -1)
    if kind == "rkl":
        return (ls.exp() * (ls - lt)).sum(-1)
    return (lt.exp() * (lt - ls)).sum(-1)


def bf16_values(t):
    """T rounded to bf16 (nearest even), as float32 values"""
    return t.to(torch.bfloat16).to(torch.float32)


class Bf16Linear(torch.autograd.Function):
    """y = x W^T + b with x and W rounded to bf16 and float32 sums; the backward rounds dy, W and x
    the same way (dx = bf(dy) bf(W), dW = bf(dy)^T bf(x)), the bias's gradient from dy as it is:
    moe2dense's --train-precision bf16 (PyTorch's autocast would also round y to bf16)"""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        y = bf16_values(x) @ bf16_values(w).T
        return y + b if b is not None else y

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        g = bf16_values(gy)
        gx = g @ bf16_values(w)
        gw = g.reshape(-1, g.shape[-1]).T @ bf16_values(x).reshape(-1, x.shape[-1])
        gb = gy.reshape(-1, gy.shape[-1]).sum(0) if ctx.has_bias else None
        return gx, gw, gb


def bf16_linears(model):
    """every nn.Linear of MODEL (its projections and LM head) through Bf16Linear"""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = (lambda mod: lambda x: Bf16Linear.apply(x, mod.weight, mod.bias))(m)


def run_case(c, teacher, student, ids):
    L, B, b = c["seq_len"], c["batch"], c["micro_batch"]
    if c["teacher_topk"]:
        set_route_topk(teacher, c["teacher_topk"])
    t_outs, s_outs = layer_outputs(teacher), layer_outputs(student)
    named = list(student.named_parameters())
    # weight decay on tensors of 2+ dimensions, as moe2dense: not on norms, biases and sinks, nor on
    # GPT-OSS's fused expert biases ([E, n]: one bias vector per expert, 1-D tensors in moe2dense)
    def decays(n, p):
        return p.dim() >= 2 and not n.endswith("_bias")
    decay = [p for n, p in named if decays(n, p)]
    no_decay = [p for n, p in named if not decays(n, p)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95), eps=1e-8)
    initial = {n: p.detach().clone() for n, p in named}
    steps = []
    for s in range(1, c["steps"] + 1):
        lr = lr_at(c, s)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(B // b):
            first = (s - 1) * B + mb * b
            x = torch.tensor([ids[(first + j) * L:(first + j + 1) * L] for j in range(b)])
            t_outs.clear(), s_outs.clear()
            with torch.no_grad():
                zt = teacher(x).logits
            zs = student(x).logits
            loss = divergence(zt, zs, c["loss"]).sum() / (B * L)
            if c["mse_weight"]:
                mses = [((hs - ho.detach()) ** 2).sum() / (B * L * hs.shape[-1]) for ho, hs in zip(t_outs, s_outs)]
                if c.get("mse_norm") == "minitron":  # L_logits / mean_l(L_l), detached, over the layer count
                    l_is = sum(m.detach() for m in mses) / len(mses)
                    w = c["mse_weight"] * (loss.detach() / l_is / len(mses) if l_is > 0 else 0.0)
                else:  # "sum": every layer's MSE times the weight
                    w = c["mse_weight"]
                for m in mses:
                    loss = loss + w * m
            loss.backward()
            total += loss.item()
        params = [p for _, p in named]
        if c["clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, c["clip"]).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
        opt.step()
        steps.append({"step": s, "loss": total, "grad_norm": norm, "lr": lr})
    updates = {}
    for n, p in named:
        updates.update(update_norms(n, (p.detach() - initial[n]).double(), c.get("family")))
    return steps, updates


def update_norms(name, delta, family):
    """{tensor name: L2 norm of its update} in the checkpoint's tensors as moe2dense reads them:
    transformers fuses a one-expert student's experts into gate_up_proj and down_proj; OLMoE's
    gate_up is [E, 2 d_e, d] (gate rows, then up rows: experts.0.{gate,up,down}_proj.weight), GPT-OSS's
    [E, d, 2 d_e] (columns 2j gate, 2j + 1 up) with biases, split and named as arch_gptoss.c does"""
    stem, _, leaf = name.rpartition(".")
    if not stem.endswith("mlp.experts"):
        return {name: float(torch.linalg.vector_norm(delta))}
    assert delta.shape[0] == 1, f"{name}: one expert expected"
    d = delta[0]
    if family == "olmoe":
        if leaf == "down_proj":
            return {f"{stem}.0.down_proj.weight": float(torch.linalg.vector_norm(d))}
        h = d.shape[0] // 2
        return {f"{stem}.0.gate_proj.weight": float(torch.linalg.vector_norm(d[:h])),
                f"{stem}.0.up_proj.weight": float(torch.linalg.vector_norm(d[h:]))}
    bias = leaf.endswith("_bias")
    if leaf.startswith("down_proj"):
        return {f"{stem}[0].down_proj" + (".bias" if bias else ""): float(torch.linalg.vector_norm(d))}
    suffix = ".bias" if bias else " (from gate_up_proj)"
    return {f"{stem}[0].gate_proj{suffix}": float(torch.linalg.vector_norm(d[..., 0::2])),
            f"{stem}[0].up_proj{suffix}": float(torch.linalg.vector_norm(d[..., 1::2]))}


def make_case(name, c, work, tok_json, text):
    t_dir, s_dir = f"{work}/{name}-teacher", f"{work}/{name}-student"
    t_cls, t_cfg, s_cls, s_cfg = FAMILIES.get(c.get("family"), ("Qwen3MoeForCausalLM", TEACHER, "Qwen3ForCausalLM",
                                                                 STUDENT))
    checkpoint(t_cls, t_cfg, torch.bfloat16, 11, t_dir)
    checkpoint(s_cls, s_cfg, torch.bfloat16, 12, s_dir)
    ids = Tokenizer.from_file(tok_json).encode(text, add_special_tokens=False).ids
    need = c["steps"] * c["batch"] * c["seq_len"]
    assert len(ids) >= need, f"{name}: {len(ids)} tokens < {need}"
    teacher, student = load(t_cls, t_dir), load(s_cls, s_dir)
    teacher.eval(), student.train()
    if c.get("train_precision") == "bf16":
        bf16_linears(student)
    steps, updates = run_case(c, teacher, student, ids)
    parts = {}
    for part, d, seed in (("teacher", t_dir, 11), ("student", s_dir, 12)):
        parts[part] = {"seed": seed, "config_json": read_text(f"{d}/config.json"),
                       "safetensors_sha256": sha256(f"{d}/model.safetensors")}
        # the C test writes it from its tensor list (testmodel.h): no writer of its own for the layout
        if c.get("family") in ("olmoe", "deepseekv2") or (c.get("family") == "mixtral" and part == "student"):
            parts[part].update(name=f"{name}-{part}", tensors=tensor_list(d))
    return {"name": name, "settings": c,
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
            "teacher": parts["teacher"], "student": parts["student"],
            "text": text, "tokens_sha256": hashlib.sha256(np.array(ids, dtype="<i4").tobytes()).hexdigest(),
            "n_tokens": len(ids),
            "steps": [{k: (float(f"{v:.12g}") if isinstance(v, float) else v) for k, v in st.items()} for st in steps],
            "update_norms": {k: float(f"{v:.9g}") for k, v in sorted(updates.items())}}


def make_all(out, only=None):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the reference numbers do not depend on a thread count
    rng = np.random.default_rng(11)
    text = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 400)) + "\n"
    with tempfile.TemporaryDirectory(prefix="m2d-distill-") as work:
        tok_json = f"{out}/tokenizer.json"  # the byte-level tokenizer the test encodes the text with
        byte_tokenizer(tok_json)
        for name, c in CASES.items():
            if only and name not in only:
                continue
            g = make_case(name, c, work, tok_json, text)
            with open(f"{out}/{name}.json", "w", encoding="utf-8") as f:
                json.dump(g, f, indent=1)
                f.write("\n")
            print(f"{name}: " + ", ".join(f"{s['loss']:.6f}" for s in g["steps"]))


def compare(new_dir, old_dir):
    bad = []
    for name in CASES:
        with open(f"{new_dir}/{name}.json", encoding="utf-8") as f:
            g = json.load(f)
        with open(f"{old_dir}/{name}.json", encoding="utf-8") as f:
            o = json.load(f)
        for key in ("settings", "text", "tokens_sha256"):
            if g[key] != o[key]:
                bad.append(f"{name}: {key} differs")
        for part in ("teacher", "student"):
            if g[part] != o[part]:
                bad.append(f"{name}: {part} checkpoint differs")
        for a, b in zip(g["steps"], o["steps"]):
            for k in ("loss", "grad_norm", "lr"):
                if abs(a[k] - b[k]) > 1e-6 * max(1.0, abs(b[k])):
                    bad.append(f"{name}: step {a['step']} {k} {a[k]} vs {b[k]}")
    return bad


# ---- benchmark: the same KD step as bench/bench_train.c, timed ----

def bench(a):
    torch.set_num_threads(a.threads)
    teacher = load("Qwen3MoeForCausalLM", a.teacher, a.attn)
    student = load("Qwen3ForCausalLM", a.student, a.attn)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    tdtype = torch.bfloat16 if (a.teacher_dtype or a.dtype) == "bf16" else torch.float32
    teacher.to(a.device, tdtype).eval(), student.to(a.device, dtype).train()
    rng = np.random.default_rng(1)
    V = student.config.vocab_size
    opt = torch.optim.AdamW(student.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    times = []
    for it in range(a.warmup + a.iters):
        x = torch.tensor(rng.integers(0, V, (a.batch, a.seq_len)), device=a.device)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            zt = teacher(x).logits.float()
        zs = student(x).logits.float()
        loss = divergence(zt, zs, "fkl").mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        sync()
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
    tok_s = a.batch * a.seq_len / (sum(times) / len(times))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"impl": "pytorch", "device": a.device, "dtype": a.dtype, "teacher_dtype": a.teacher_dtype or a.dtype,
                      "attn": a.attn, "threads": a.threads, "tokens_per_s": tok_s,
                      "step_s": sum(times) / len(times), "peak_rss_bytes": rss,
                      "torch": torch.__version__.split("+")[0]}))


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("--out")
    ap.add_argument("--only", help="comma-separated case names (default: every case)")
    ap.add_argument("--compare", nargs=2, metavar=("NEW_DIR", "OLD_DIR"))
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--teacher")
    ap.add_argument("--student")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--teacher-dtype", choices=["fp32", "bf16"], help="default: --dtype")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--attn", choices=["eager", "sdpa"], default="eager")
    a = ap.parse_args()
    if a.bench:
        return bench(a)
    if a.compare:
        bad = compare(*a.compare)
        for b in bad:
            print(f"distill_ref.py: {b}", file=sys.stderr)
        sys.exit(1 if bad else 0)
    if not a.out:
        ap.error("--out, --compare or --bench is required")
    only = set(a.only.split(",")) if a.only else None
    if only and only - set(CASES):
        ap.error(f"--only: unknown cases {sorted(only - set(CASES))}")
    make_all(a.out, only)


if __name__ == "__main__":
    main()
