"""Golden outputs of Hugging Face transformers for the Mixtral and GPT-OSS families, for
tests/test_mixtral.c and tests/test_gptoss.c: committed in tests/golden/hf/ (`make hf-goldens`),
made afresh and compared live by `make verify-hf`. The pattern of tools/hf_goldens.py (whose grid
generator, tokenizer and helpers this imports), in its own file so that families are added
side by side. Runs in tests/ref/.venv-hf.

usage: hf_goldens_families.py --bin BUILD/moe2dense --out DIR [--only NAME,...]
       hf_goldens_families.py --compare NEW_DIR OLD_DIR

Per model (MODELS below), built with transformers' own class from a small config that keeps every
structural feature of the family (Mixtral: sliding window shorter than the test sequence, GQA,
head_dim != hidden / heads; GPT-OSS: attention sinks, sliding and full layers with a window shorter
than the sequence, YaRN, biases everywhere, the clamped SwiGLU with its clamp reached, top-k
softmax routing, and MXFP4 experts):
 1. the grid generator's weights (tests/testmodel.h), from_pretrained, save_pretrained: config.json
    and model.safetensors as transformers writes them (tests/familyckpt.c rebuilds them);
    MXFP4 models: transformers cannot quantise on a CPU, so the experts are packed by this file's
    packer (a mirror of harness/io/mxfp4.c: the C test must rebuild the same bytes), written with
    safetensors next to config.json in the Hub's spelling (rope_scaling, quantization_config), and
    loaded back through transformers' own MXFP4 dequantiser (integrations/mxfp4.py), whose values
    must equal this file's dequantisation exactly; their sha256 (float32, stored [E, rows, cols]
    layout) goes into the golden for the C dequantiser;
 2. the forward in float64 (eager attention and experts): logit rows, log-sum-exp and next-token
    logits, each MoE layer's routing (top-k experts and gates from transformers' router module);
 3. calibration statistics over the same tokens (SPEC §1) from transformers' modules: the full
    softmax p_e, the native gates, every expert's output f_e(x) on every token (the experts module
    called with each expert alone at weight 1): n_e, Σp_e, Σp_e over routed tokens, Σg_e, Σ‖f_e‖
    over routed tokens, and the Gram matrix Σ_t <f_i, f_j>.
Students (STUDENTS): moe2dense calibrate + convert on a teacher; transformers loads the student
(goldens as in 2) and writes it back with save_pretrained, which must give the same bytes.
"""
import json
import os
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from hf_goldens import (N_TOKENS, VOCAB, byte_tokenizer, checkpoint, cli, compare_golden,  # noqa: E402
                        fnv1a64, golden_record, grid_tensor, read_text, run, sha256, student_plan)

MIXTRAL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, eos_token_id=256, bos_token_id=None)
GPTOSS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
              max_position_embeddings=256, eos_token_id=256, pad_token_id=None,
              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})

# name -> (class, config, dtype, seed, MXFP4 experts)
MODELS = {
    # bf16, a window (16) shorter than the sequence (48), head_dim 24 != 64 / 4, top-2 of 8
    "mixtral": ("MixtralForCausalLM", dict(MIXTRAL, num_local_experts=8, num_experts_per_tok=2, head_dim=24,
                                           sliding_window=16), torch.bfloat16, 21, False),
    # f32, no window (null), tied embeddings, top-3 of 6, 4 query heads on 1 kv head
    "mixtral-f32": ("MixtralForCausalLM", dict(MIXTRAL, num_local_experts=6, num_experts_per_tok=3, sliding_window=None,
                                               num_key_value_heads=1, tie_word_embeddings=True, rms_norm_eps=1e-6),
                    torch.float32, 22, False),
    # bf16 experts unquantised; swiglu_limit 0.5 so that the clamps are reached by these weights
    "gptoss": ("GptOssForCausalLM", dict(GPTOSS, swiglu_limit=0.5), torch.bfloat16, 23, False),
    # MXFP4 experts, config.json in the Hub's spelling (rope_scaling, quantization_config), limit 7
    "gptoss-mxfp4": ("GptOssForCausalLM", dict(GPTOSS, layer_types=["sliding_attention", "full_attention",
                                                                    "full_attention"]), torch.bfloat16, 24, True),
}

CALIBRATE = ["--seq-len", "32", "--samples", "8", "--threads", "1"]
# name -> (teacher, class, calibrate args, convert args); counts, round-robin groups and uniform
# scaling (1/k: exact in binary) keep the student independent of float rounding in calibration
STUDENTS = {
    "mixtral-student": ("mixtral", "MistralForCausalLM", CALIBRATE,
                        ["--scoring", "freq", "--grouping", "rr", "--scaling", "uniform", "-K", "4"]),
    "gptoss-student": ("gptoss-mxfp4", "GptOssForCausalLM", CALIBRATE,
                       ["--scoring", "freq", "--grouping", "rr", "--scaling", "uniform", "-K", "4"]),
    "gptoss-student-moe": ("gptoss", "GptOssForCausalLM", CALIBRATE,
                           ["--target", "moe", "--scoring", "freq", "--grouping", "rr", "-K", "3", "--groups", "3"]),
}


# ---- MXFP4: the mirror of harness/io/mxfp4.c ----------------------------------------------------

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_pack(x):
    """x [..., C] (float32, C % 32 == 0) -> blocks [..., C/32, 16] and scales [..., C/32] (uint8):
    scale = the smallest 2^e with max|x| <= 6 * 2^e (127 for an all-zero block), each element the
    nearest FP4 value of x / 2^e, ties to the even code."""
    *pre, C = x.shape
    b = x.reshape(-1, C // 32, 32).astype(np.float64)
    amax = np.abs(b).max(-1)
    e = np.zeros(amax.shape, dtype=np.int64)
    nz = amax > 0
    e[nz] = np.ceil(np.log2(amax[nz] / 6.0)).astype(np.int64)
    while True:  # exact corrections, as the C loop
        up = nz & (np.ldexp(6.0, e) < amax)
        down = nz & (np.ldexp(6.0, e - 1) >= amax)
        if not up.any() and not down.any():
            break
        e += up.astype(np.int64) - down.astype(np.int64)
    assert (e + 127 >= 0).all() and (e + 127 <= 254).all()
    a = np.abs(np.ldexp(b, -e[..., None]))
    d = np.abs(a[..., None] - FP4[:8])
    best = d.min(-1, keepdims=True)
    cand = d == best
    score = cand * 2 + cand * (np.arange(8) % 2 == 0)  # among equals, the even code
    code = score.argmax(-1) | np.where(np.signbit(b), 8, 0)
    q = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return q.reshape(*pre, C // 32, 16), (e + 127).astype(np.uint8).reshape(*pre, C // 32)


def mxfp4_dequant(blocks, scales):
    """blocks [..., G, 16], scales [..., G] -> [..., G * 32] float64 (exact)"""
    lo, hi = blocks & 15, blocks >> 4
    codes = np.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    v = np.ldexp(FP4[codes], scales.astype(np.int64)[..., None] - 127)
    return v.reshape(*blocks.shape[:-2], -1)


def quantise(unq_dir, out, cfg_text, seed):
    """The experts of the checkpoint in UNQ_DIR packed (grid values of each unquantised name in the
    stored [E, rows, cols] layout), every other tensor as it is, CFG_TEXT as config.json."""
    with safe_open(f"{unq_dir}/model.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    dequant = {}
    for name in [k for k in tensors if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]:
        E, a, b = tensors.pop(name).shape  # gate_up [E, d, 2de], down [E, de, d]: stored as [E, b, a]
        x = grid_tensor(name, (E, b, a), seed).numpy()
        blocks, scales = mxfp4_pack(x)
        tensors[f"{name}_blocks"] = torch.from_numpy(blocks)
        tensors[f"{name}_scales"] = torch.from_numpy(scales)
        dequant[name] = mxfp4_dequant(blocks, scales)
        # nearest FP4 value: within half the widest gap (4 to 6) of the block's scale
        assert np.all(np.abs(dequant[name] - x) <= np.ldexp(1.0, scales.astype(np.int64).repeat(32, -1) - 127))
    os.makedirs(out, exist_ok=True)
    save_file(tensors, f"{out}/model.safetensors", metadata={"format": "pt"})
    with open(f"{out}/config.json", "w", encoding="utf-8") as f:
        f.write(cfg_text)
    return dequant


def hub_config(cfg_text):
    """The config.json transformers wrote, respelled as the Hub's gpt-oss config.json is: rope_theta +
    rope_scaling, experts_per_token next to num_experts_per_tok, quantization_config mxfp4."""
    c = json.loads(cfg_text)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp
    c["experts_per_token"] = c["num_experts_per_tok"]
    c["quantization_config"] = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
    return json.dumps(c, indent=2, sort_keys=True) + "\n"


def check_transformers_dequant(model_dir, dequant):
    """transformers' own MXFP4 dequantisation of the packed experts == ours, exactly; sha256 of the
    values (float32, stored layout) for the C test."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    model = load(model_dir)
    hashes = {}
    for name, want in sorted(dequant.items()):
        layer, proj = int(name.split(".")[2]), name.rsplit(".", 1)[1]
        got = getattr(model.model.layers[layer].mlp.experts, proj).detach().transpose(1, 2).numpy()
        assert np.array_equal(got, want), f"{name}: transformers dequantises our MXFP4 differently"
        with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
            direct = convert_moe_packed_tensors(f.get_tensor(f"{name}_blocks"), f.get_tensor(f"{name}_scales"),
                                                dtype=torch.float64).transpose(1, 2).numpy()
        assert np.array_equal(direct, want), f"{name}: convert_moe_packed_tensors differs"
        hashes[name] = sha256_bytes(want.astype("<f4").tobytes())
    return hashes


def sha256_bytes(b):
    import hashlib
    return hashlib.sha256(b).hexdigest()


# ---- forward, routing, calibration statistics ----------------------------------------------------

def load(model_dir):
    kw = {"quantization_config": transformers.Mxfp4Config(dequantize=True)} \
        if "quantization_config" in json.loads(read_text(f"{model_dir}/config.json")) else {}
    cls = getattr(transformers, json.loads(read_text(f"{model_dir}/config.json"))["architectures"][0])
    moe = "Mistral" not in cls.__name__
    model = cls.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager",
                                **({"experts_implementation": "eager"} if moe else {}), **kw)
    return model.eval()


def moe_parts(layer):
    """(router module, experts module) of an MoE layer, or None (a dense or one-expert layer)"""
    mlp = layer.mlp
    router = getattr(mlp, "router", None) or getattr(mlp, "gate", None)
    if not isinstance(router, torch.nn.Module) or getattr(router, "num_experts", 1) <= 1:
        return None
    return router, mlp.experts


def forward(model_dir, tokens):
    model = load(model_dir)
    cap = {}
    for i, layer in enumerate(model.model.layers):
        parts = moe_parts(layer)
        if parts is None:
            continue

        def hook(mod, inp, out, i=i):
            logits, scores, idx = out
            cap[i] = (inp[0].detach().clone(), logits.detach().clone(), idx.detach().clone(), scores.detach().clone())
        parts[0].register_forward_hook(hook)
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
        calib = {i: calib_stats(moe_parts(model.model.layers[i])[1], *cap[i]) for i in sorted(cap)}
    routing = {i: (cap[i][2].tolist(), cap[i][3].tolist()) for i in sorted(cap)}
    return logits, routing, calib


def calib_stats(experts, x, logits, idx, gates):
    """SPEC §1 over the tokens of one forward (float64)"""
    n, E = logits.shape
    p = torch.softmax(logits.double(), -1)
    f = torch.stack([experts(x, torch.full((n, 1), e), torch.ones(n, 1, dtype=x.dtype)) for e in range(E)])  # [E, n, d]
    norms = f.norm(dim=-1)  # [E, n]
    routed = torch.zeros(E, n, dtype=torch.bool)
    g = torch.zeros(E, n, dtype=torch.float64)
    for t in range(n):
        for j in range(idx.shape[1]):
            routed[idx[t, j], t] = True
            g[idx[t, j], t] = gates[t, j].double()
    P = p.T
    r = routed.double()
    return {"n": r.sum(1).tolist(), "sum_p": P.sum(1).tolist(), "sum_p_sel": (P * r).sum(1).tolist(),
            "sum_g": g.sum(1).tolist(), "sum_f": (norms * r).sum(1).tolist(),
            "gram": torch.einsum("itd,jtd->ij", f, f).reshape(-1).tolist(),
            "logit_gram": (logits.double().T @ logits.double()).reshape(-1).tolist()}


def goldens(name, cls_name, model_dir, tokens, extra):
    logits, routing, calib = forward(model_dir, tokens)
    return {**golden_record(name, cls_name, model_dir, tokens, logits, extra),
            "routing": [{"layer": l, "experts": routing[l][0],
                         "gates": [[float(f"{v:.9g}") for v in row] for row in routing[l][1]]} for l in sorted(routing)],
            **({"calib": [{"layer": l, **{k: [float(f"{v:.12g}") for v in vs] for k, vs in calib[l].items()}}
                          for l in sorted(calib)]} if calib else {})}


# ---- the run ----------------------------------------------------------------------------------------

def make_model(name, work):
    cls_name, cfg, dtype, seed, quantised = MODELS[name]
    d = f"{work}/{name}"
    if not quantised:
        checkpoint(cls_name, cfg, dtype, seed, d)
        return {"seed": seed}
    checkpoint(cls_name, cfg, dtype, seed, f"{work}/{name}-unquantised")
    dequant = quantise(f"{work}/{name}-unquantised", d, hub_config(read_text(f"{work}/{name}-unquantised/config.json")),
                       seed)
    return {"seed": seed, "mxfp4_sha256": check_transformers_dequant(d, dequant)}


def make_all(binary, out, work, only=None):
    tok_json = f"{out}/tokenizer.json"
    if not os.path.exists(tok_json):
        byte_tokenizer(tok_json)
    words = ["the", "expert", "router", "dense", "of", "and", "model", "token", "layer", "a", "merge", "group"]
    rng = np.random.default_rng(12)
    calib_text = " ".join(words[i] for i in rng.integers(0, len(words), 160)) + "\n"
    students = {n: v for n, v in STUDENTS.items() if only is None or n in only}
    wanted = None if only is None else set(only) | {v[0] for v in students.values()}
    result = {}
    for name in MODELS:
        if wanted is not None and name not in wanted:
            continue
        extra = make_model(name, work)
        shutil.copy(tok_json, f"{work}/{name}")
        tokens = [int(t) for t in np.random.default_rng(fnv1a64(name) >> 32).integers(0, 257, N_TOKENS)]
        result[name] = goldens(name, MODELS[name][0], f"{work}/{name}", tokens, extra)
    for name, (teacher, cls_name, cal, conv) in students.items():
        t, s = f"{work}/{teacher}", f"{work}/{name}"
        with open(f"{work}/calib.txt", "w", encoding="utf-8") as f:
            f.write(calib_text)
        run([binary, "calibrate", "--model", t, "--data", f"{work}/calib.txt", "--out", f"{work}/{name}.stats", *cal])
        run([binary, "convert", "--model", t, "--stats", f"{work}/{name}.stats", *conv, "--out", s])
        resaved = f"{work}/{name}-resaved"
        getattr(transformers, cls_name).from_pretrained(s, dtype="auto").save_pretrained(resaved)
        result[name] = goldens(name, cls_name, s, result[teacher]["tokens"], {
            "teacher": teacher, "calibrate": cal, "convert": conv, "plan": student_plan(s),
            "calib_text": calib_text,
            "resaved_sha256": sha256(f"{resaved}/model.safetensors")})
    for name, g in result.items():
        with open(f"{out}/{name}.json", "w", encoding="utf-8") as f:
            json.dump(g, f, indent=1)
            f.write("\n")
    return result


def compare(new_dir, old_dir):
    keys = ("config_json", "safetensors_sha256", "tokens", "positions", "mxfp4_sha256")
    return [b for name in [*MODELS, *STUDENTS] for b in compare_golden(name, new_dir, old_dir, keys)]


def main():
    cli(make_all, compare, "hf_goldens_families.py", "m2d-hf-families-")


if __name__ == "__main__":
    main()
