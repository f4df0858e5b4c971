/* cmd_distill — `moe2dense distill`: knowledge distillation of a dense student (train/distill.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "cli/cmd.h"
#include "train/distill.h"

static const char USAGE[] =
    "usage: moe2dense distill --teacher DIR --student DIR --data FILE --out DIR (--steps S | --tokens N)\n"
    "           [--seq-len 512] [--batch 8] [--micro-batch b] [--recompute]\n"
    "           [--lr 1e-4] [--min-lr 1e-5] [--warmup 20] [--weight-decay 0.01] [--clip 1.0]\n"
    "           [--loss fkl|rkl|fkl+mse] [--mse-weight 1] [--mse-norm minitron|sum] [--teacher-topk K']\n"
    "           [--order shuffle|sequential] [--seed 0] [--log FILE.jsonl]\n"
    "           [--eval-data FILE [--eval-every N] [--eval-seq-len L] [--eval-windows N]]\n"
    "           [--save-every N] [--stop-after N] [--resume] [--threads T] [--precision P]\n"
    "           [--train-precision fp32|bf16] [--fp32]\n"
    "           [--device cpu|cuda[:N]] [--student-device cpu|cuda[:N]]\n"
    "\n"
    "The teacher (a Hugging Face checkpoint of any family the engine runs: an MoE --\n"
    M2D_CMD_TEACHER_FAMILIES " -- or a dense one, e.g. Qwen3, the\n"
    "dense-to-dense baseline's teacher) runs in the same process on every step and gives\n"
    "full-vocabulary logits. The student (a dense checkpoint: `moe2dense convert` or `moe2dense\n"
    "prune` output; its hidden size and depth may differ from the teacher's, except with --loss\n"
    "fkl+mse) is trained in fp32 master weights initialised from its checkpoint, every tensor\n"
    "trained (paper §3.5, App. J; SPEC §7). The dense students of every supported family train\n"
    "(biases, sinks, sliding windows, scaled RoPE, DeepSeek-V2's latent attention); a student\n"
    "with MoE layers is refused with one line.\n"
    "\n"
    "  --data FILE        training text, encoded whole (no BOS) and cut into consecutive windows\n"
    "                     of L tokens; every position of every window is a distillation position\n"
    "  --steps S          optimizer steps; or --tokens N: S = ceil(N / (B L))\n"
    "  --seq-len L        window length (<= the teacher's max_position_embeddings)\n"
    "  --batch B          windows per optimizer step\n"
    "  --micro-batch b    windows per forward/backward (divides B; gradients accumulate)\n"
    "  --recompute        keep only each layer's input and recompute its activations in the\n"
    "                     backward (activation checkpointing: less memory, ~1/3 more compute)\n"
    "  --lr, --min-lr, --warmup W: s <= W: lr s/W; then min + (lr - min)(1 + cos(pi (s-W)/(S-W)))/2\n"
    "  --weight-decay     AdamW (betas 0.9/0.95, eps 1e-8) decoupled decay, on 2-D tensors only\n"
    "  --clip             global gradient norm clipping (0: off); the log has the norm before it\n"
    "  --loss             fkl: KL(teacher || student) mean over positions (default); rkl: reverse\n"
    "                     KL; fkl+mse: fkl + w * the hidden-state MSE of the decoder layers'\n"
    "                     outputs (--mse-weight w), weighted by --mse-norm\n"
    "  --mse-norm         minitron (default, Minitron / NeMo): the mean over layers of each\n"
    "                     layer's MSE, scaled per micro-batch by the detached ratio of the logit\n"
    "                     loss to it (both weigh the same); sum: the sum over layers, unscaled\n"
    "  --teacher-topk K'  the teacher routes each token to its K' most probable experts, weighted\n"
    "                     by their raw softmax probabilities, not renormalised (paper Eq. 6); without\n"
    "                     it, or with K' = k (the teacher's own top-k: Table 4's \"8 (default)\"), the\n"
    "                     teacher routes as its config says (renormalised where it renormalises)\n"
    "  --order            shuffle: a seeded permutation of the windows per epoch (default);\n"
    "                     sequential: step s takes windows (s-1)B .. sB-1 in file order\n"
    "  --log FILE         one JSON object per step: step, tokens, loss (before the update), div,\n"
    "                     mse, grad_norm (before clipping), lr, tokens_per_s, elapsed_s; and per\n"
    "                     validation: step, tokens, eval, ppl, val_ce, windows, seq_len\n"
    "  --eval-data FILE   WikiText-2 raw file: gptq perplexity and mean cross-entropy before\n"
    "                     training, every --eval-every steps and at the end (window --eval-seq-len,\n"
    "                     default L; at most --eval-windows windows, default all)\n"
    "  --save-every N     checkpoint (weights, AdamW moments, step) into OUT/train-state every N\n"
    "                     steps; --resume continues it, repeating exactly what an uninterrupted\n"
    "                     run does (the same losses, bit for bit)\n"
    "  --stop-after N     end after step N with a checkpoint (for time-limited jobs)\n"
    "  --threads T        compute threads (default: all cores); the run does not depend on T: losses,\n"
    "                     gradient norms and weights are bit for bit the same at any thread count\n"
    "                     (work is split by rows and columns, never a reduction), so a checkpoint\n"
    "                     may be resumed with another T\n"
    "  --precision P      GEMM precision of the TEACHER's forward and LM head (the KD targets: its\n"
    "                     logits, and its layer outputs for fkl+mse) and of the validation perplexity:\n"
    "                     fp32 (default; exact), bf16 (operands rounded to bf16, fp32 accumulation) or\n"
    "                     auto (bf16 where the device computes bf16 natively, else fp32); not the\n"
    "                     student's (--train-precision). The resolved precision is in the log\n"
    "                     (\"precision\"), the checkpoint (a --resume with another one is refused) and\n"
    "                     moe2dense.json\n"
    "  --train-precision  the student's GEMMs (q/k/v/o, gate/up/down, its LM head), forward and\n"
    "                     backward: fp32 (default; exact) or bf16 (mixed precision: activations,\n"
    "                     gradients and the fp32 master weights rounded to bf16 as GEMM operands,\n"
    "                     fp32 accumulation and results): a GPU's tensor cores, a CPU's AMX or\n"
    "                     AVX512-BF16 kernels (BENCHMARKS.md: ~3x fp32 on a 30B student's layers with\n"
    "                     AMX; no gain on tiny students). Master weights, AdamW, attention, norms\n"
    "                     and the loss stay fp32. In the log (\"student_precision\"), the checkpoint\n"
    "                     and moe2dense.json\n"
    "  --device D         where the run goes: cpu (default), cuda or cuda:N (a `make CUDA=1` build\n"
    "                     and a GPU; an absent device is an error, never a CPU run): the teacher's\n"
    "                     forward, the student's training (forward, backward, AdamW, the teacher's\n"
    "                     LM head making the KD targets) and the validation perplexity\n"
    "  --student-device D where the student trains (and is validated) instead: e.g. --device cuda\n"
    "                     --student-device cpu when the GPU holds the teacher but not also the\n"
    "                     student's fp32 weights, gradients and AdamW moments (16 bytes a parameter,\n"
    "                     plus activations); the teacher's hidden states cross through the host\n"
    "  --fp32             write the output in fp32 (default: the teacher's dtype; not --precision)\n"
    "\n"
    "Output in OUT: config.json, model.safetensors, tokenizer files and moe2dense.json (the\n"
    "student's, extended with \"distill\": settings and final metrics), written last. Prints the\n"
    "peak RSS after the first step; README \"Distillation\" gives the memory formula.\n"
    "\n"
    "example:\n"
    "  moe2dense distill --teacher ../shared/models/tiny-qwen3moe --student students/do-acp-k8 \\\n"
    "      --data data/train-text/wikitext-103-train-prefix/wiki.train.tokens --out distilled/do-acp-k8 \\\n"
    "      --tokens 3000000 --seq-len 512 --batch 8 --lr 1e-3 \\\n"
    "      --eval-data data/wikitext-2-raw/wikitext-2-raw/wiki.valid.raw --eval-every 100 --log distill.jsonl\n"
    "(the data files are those `make data` links; students/do-acp-k8 is a `moe2dense convert` output)\n";

typedef struct {
    const char *steps, *tokens, *L, *B, *b, *lr, *min_lr, *warmup, *wd, *clip, *loss, *mse_w, *mse_norm, *topk, *order, *seed,
        *eval_every, *eval_L, *eval_windows, *save_every, *stop_after, *threads, *precision, *train_precision;
    int recompute, resume, fp32;
} raw_opts;

static int parse_ints(raw_opts *a, m2d_distill_opts *o) {
    long v;
    struct { const char *name, *s; long lo, hi; int *dst; } ints[] = {
        {"--steps", a->steps, 1, 100000000, &o->train.optim.steps}, {"--seq-len", a->L, 2, 1 << 20, &o->train.seq_len},
        {"--batch", a->B, 1, 1 << 20, &o->train.batch}, {"--micro-batch", a->b, 1, 1 << 20, &o->train.micro_batch},
        {"--warmup", a->warmup, 0, 100000000, &o->train.optim.warmup},
        {"--teacher-topk", a->topk, 1, 1 << 20, &o->train.teacher_topk},
        {"--eval-every", a->eval_every, 1, 100000000, &o->eval_every},
        {"--eval-seq-len", a->eval_L, 2, 1 << 20, &o->eval_seq_len},
        {"--eval-windows", a->eval_windows, 1, 1 << 30, &o->eval_windows},
        {"--save-every", a->save_every, 1, 100000000, &o->save_every},
        {"--stop-after", a->stop_after, 1, 100000000, &o->stop_after}, {"--threads", a->threads, 1, 4096, &o->train.threads}};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        if (!ints[i].s) continue;
        if (m2d_parse_int("distill", ints[i].name, ints[i].s, ints[i].lo, ints[i].hi, &v)) return -1;
        *ints[i].dst = (int)v;
    }
    if (a->tokens) {
        if (m2d_parse_int("distill", "--tokens", a->tokens, 1, (long)1 << 50, &v)) return -1;
        o->tokens = v;
    }
    if (a->seed) {
        if (m2d_parse_int("distill", "--seed", a->seed, 0, (long)1 << 62, &v)) return -1;
        o->seed = (uint64_t)v;
    }
    return 0;
}

static int parse_doubles(raw_opts *a, m2d_distill_opts *o) {
    struct { const char *name, *s; double *dst; } ds[] = {
        {"--lr", a->lr, &o->train.optim.lr}, {"--min-lr", a->min_lr, &o->train.optim.min_lr},
        {"--weight-decay", a->wd, &o->train.optim.weight_decay}, {"--clip", a->clip, &o->train.optim.clip},
        {"--mse-weight", a->mse_w, &o->train.mse_weight}};
    for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) {
        if (!ds[i].s) continue;
        if (m2d_parse_double("distill", ds[i].name, ds[i].s, ds[i].dst)) return -1;
        if (!(*ds[i].dst >= 0) || !isfinite(*ds[i].dst))
            return m2d_err("distill: %s %s: must be a finite number >= 0", ds[i].name, ds[i].s);
    }
    if (o->train.optim.lr <= 0) return m2d_err("distill: --lr must be positive");
    return 0;
}

static int parse(int argc, char **argv, m2d_distill_opts *o) {
    raw_opts a;
    memset(&a, 0, sizeof a);
    m2d_opt opts[] = {
        {"--teacher", 1, &o->teacher, NULL}, {"--student", 1, &o->student, NULL}, {"--data", 1, &o->data, NULL},
        {"--out", 1, &o->out, NULL}, {"--steps", 1, &a.steps, NULL}, {"--tokens", 1, &a.tokens, NULL},
        {"--seq-len", 1, &a.L, NULL}, {"--batch", 1, &a.B, NULL}, {"--micro-batch", 1, &a.b, NULL},
        {"--recompute", 0, NULL, &a.recompute}, {"--lr", 1, &a.lr, NULL}, {"--min-lr", 1, &a.min_lr, NULL},
        {"--warmup", 1, &a.warmup, NULL}, {"--weight-decay", 1, &a.wd, NULL}, {"--clip", 1, &a.clip, NULL},
        {"--loss", 1, &a.loss, NULL}, {"--mse-weight", 1, &a.mse_w, NULL},
        {"--mse-norm", 1, &a.mse_norm, NULL}, {"--teacher-topk", 1, &a.topk, NULL},
        {"--order", 1, &a.order, NULL}, {"--seed", 1, &a.seed, NULL}, {"--log", 1, &o->log, NULL},
        {"--eval-data", 1, &o->eval_data, NULL}, {"--eval-every", 1, &a.eval_every, NULL},
        {"--eval-seq-len", 1, &a.eval_L, NULL}, {"--eval-windows", 1, &a.eval_windows, NULL},
        {"--save-every", 1, &a.save_every, NULL}, {"--stop-after", 1, &a.stop_after, NULL},
        {"--resume", 0, NULL, &a.resume}, {"--threads", 1, &a.threads, NULL}, {"--fp32", 0, NULL, &a.fp32},
        {"--precision", 1, &a.precision, NULL}, {"--train-precision", 1, &a.train_precision, NULL},
        {"--device", 1, &o->train.teacher_backend, NULL},
        {"--student-device", 1, &o->train.backend, NULL}, {0}};
    if (m2d_parse_opts("distill", argc, argv, opts, NULL, 0, NULL)) return -1;
    if (!o->teacher || !o->student || !o->data || !o->out)
        return m2d_err("distill: --teacher, --student, --data and --out are required (see 'moe2dense help distill')");
    if (parse_ints(&a, o) || parse_doubles(&a, o)) return -1;
    if (a.loss && m2d_loss_parse(a.loss, &o->train.loss)) return m2d_err_prefix("distill: --loss");
    if (a.order && m2d_order_parse(a.order, &o->order)) return m2d_err_prefix("distill: --order");
    if (a.precision && m2d_precision_parse(a.precision, "distill: --precision", &o->train.precision)) return -1;
    if (a.train_precision && m2d_train_precision_parse(a.train_precision, "distill: --train-precision",
                                                       &o->train.train_precision))
        return -1;
    if (o->train.teacher_backend && m2d_device_check(o->train.teacher_backend, "distill: --device")) return -1;
    if (o->train.backend && m2d_device_check(o->train.backend, "distill: --student-device")) return -1;
    if (!o->train.backend) o->train.backend = o->train.teacher_backend; /* --device: the student too */
    if (a.mse_w && o->train.loss != M2D_LOSS_FKL_MSE) return m2d_err("distill: --mse-weight needs --loss fkl+mse");
    if (a.mse_norm && m2d_mse_norm_parse(a.mse_norm, &o->train.mse_norm)) return m2d_err_prefix("distill: --mse-norm");
    if (a.mse_norm && o->train.loss != M2D_LOSS_FKL_MSE) return m2d_err("distill: --mse-norm needs --loss fkl+mse");
    if ((a.eval_every || a.eval_L || a.eval_windows) && !o->eval_data)
        return m2d_err("distill: --eval-every, --eval-seq-len and --eval-windows need --eval-data");
    o->train.recompute = a.recompute, o->resume = a.resume, o->fp32 = a.fp32;
    return 0;
}

static int cmd_distill_run(int argc, char **argv) {
    m2d_distill_opts o;
    m2d_distill_defaults(&o);
    m2d_distill_result r;
    if (parse(argc, argv, &o) || m2d_distill_run(&o, &r)) return m2d_cmd_fail("distill");
    if (!r.finished) {
        printf("stopped after step %d of %d (--stop-after, teacher %s): checkpoint in %s/train-state; continue with "
               "--resume\n", r.steps_done, r.steps, m2d_precision_name(r.precision), o.out);
        return 0;
    }
    printf("wrote %s: %d steps, %lld tokens, final loss %.6f, %.0f tokens/s, peak RSS %.1f MB, teacher %s", o.out,
           r.steps, (long long)r.tokens, r.final_loss, r.tokens_per_s, r.peak_rss / 1048576.0,
           m2d_precision_name(r.precision));
    if (!isnan(r.post_ppl) && !isnan(r.pre_ppl)) printf(", WikiText-2 PPL %.3f -> %.3f", r.pre_ppl, r.post_ppl);
    else if (!isnan(r.post_ppl)) printf(", WikiText-2 PPL %.3f (resumed: the PPL before training is in the log)", r.post_ppl);
    printf("\n");
    return 0;
}

static char *distill_usage(void) { return m2d_cmd_usage_families(USAGE); }

M2D_COMMAND_BUILT(distill, "distill", "train a dense student on a teacher's outputs (knowledge distillation)",
                  distill_usage, cmd_distill_run)
