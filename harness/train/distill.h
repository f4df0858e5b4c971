/* distill — `moe2dense distill`: knowledge distillation of a dense student from its MoE teacher
 * (paper §3.5, App. J; SPEC §7), end to end: data windows, the trainer's steps, the JSONL log,
 * validation (WikiText-2 gptq perplexity and cross-entropy), checkpoints and --resume, and the
 * output checkpoint.
 *
 * Output in OUT: a Hugging Face checkpoint of the student's architecture (config.json,
 * model.safetensors in the teacher's dtype or fp32, the tokenizer files) and moe2dense.json (the
 * student's own, when it has one, extended with a "distill" object: settings and final metrics),
 * written last. While a run is unfinished OUT holds train-state/ (state.h) and no moe2dense.json.
 *
 * Precision (train.precision, --precision): the teacher's forward and LM head (the KD targets) and
 * the validation engine run in it (AUTO resolved once, at the start); the student trains in fp32.
 * The resolved value is in every log line, the checkpoint's identity and moe2dense.json. */
#ifndef M2D_TRAIN_DISTILL_H
#define M2D_TRAIN_DISTILL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/model.h"
#include "train/data.h"
#include "train/trainer.h"

typedef struct {
    const char *teacher, *student, *data, *out;
    int64_t tokens;         /* --tokens: steps = ceil(tokens / (B L)) when steps is 0 */
    m2d_trainer_opts train; /* L, B, b, recompute, loss, MSE weight, K', optimizer (steps), threads */
    m2d_order order;
    uint64_t seed;
    const char *log;        /* JSONL, or NULL */
    const char *eval_data;  /* WikiText-2 raw file (gptq protocol), or NULL */
    int eval_every;         /* steps between validations (0: only before and after) */
    int eval_seq_len;       /* 0: L */
    int eval_windows;       /* 0: all */
    int save_every;         /* steps between checkpoints (0: none) */
    int stop_after;         /* end after this step with a checkpoint (time-limited jobs); 0: run to S */
    bool resume;
    bool fp32;              /* output in fp32 instead of the teacher's dtype */
    bool quiet;             /* no summary lines on stderr */
} m2d_distill_opts;

typedef struct {
    int steps, steps_done;  /* S, and the steps done when the run returned */
    int64_t tokens;         /* KD positions trained on (steps_done B L) */
    double final_loss;      /* mean step loss over the last max(1, S/10) steps */
    double pre_ppl, post_ppl, post_ce; /* validation before / after (NaN without --eval-data) */
    double wall_s, tokens_per_s;       /* of this invocation's steps (validations and checkpoints included) */
    double step_s, teacher_s;          /* mean wall seconds of one optimizer step of this invocation, and of
                                        * its teacher forward (m2d_step_stats.teacher_s); validations and
                                        * checkpoints excluded */
    size_t peak_rss;
    m2d_precision precision;/* the teacher's and the validation's (train.precision, AUTO resolved) */
    bool finished;          /* all S steps done and OUT written */
} m2d_distill_result;

/* The checks every run makes before it loads a model or touches OUT (the CLI's and the sweep's
 * [distill], each naming the settings its own way: NAMES). */
typedef struct { const char *seq_len, *batch, *micro_batch, *teacher_topk, *eval_seq_len, *recompute; } m2d_distill_names;
extern const m2d_distill_names m2d_distill_flag_names; /* "--seq-len", ... */
/* The micro-batch divides the batch; the window lengths fit the teacher T's context; K' <= its
 * experts. -1 + m2d_err naming the setting. */
int m2d_distill_check_settings(const m2d_distill_opts *o, const m2d_config *t, const m2d_distill_names *names);
/* README "Memory of a run": the anonymous memory of a run of teacher T and dense student S (of
 * STUDENT_PARAMS parameters) with settings O on a machine of RAM bytes (the teacher's mapped file
 * is page cache and not counted), in bytes. */
typedef struct { double student, teacher, activations, logits, total; } m2d_distill_memory;
void m2d_distill_memory_estimate(const m2d_config *t, const m2d_config *s, int64_t student_params,
                                 const m2d_trainer_opts *o, double ram, m2d_distill_memory *m);
double m2d_distill_ram_bytes(void); /* this machine's physical memory */
/* -1 + m2d_err (the estimate, its parts and the RAM, one line) when the estimate exceeds the RAM. */
int m2d_distill_check_memory(const m2d_config *t, const m2d_config *s, int64_t student_params,
                             const m2d_trainer_opts *o, const m2d_distill_names *names);

/* Paper defaults (Table 9) with L = 512, B = 8, forward KL, shuffled windows, seed 0. */
void m2d_distill_defaults(m2d_distill_opts *o);

/* The models of a run, open already (the sweep's distillation stage: a teacher it holds and the
 * converted student in memory). TEACHER: the KD targets, its directory gives the tokenizer (and
 * the output's tokenizer files); STUDENT: the first weights (a student in memory sharing the
 * teacher's file will do); MANIFEST: the student's moe2dense.json text (m2d_convert_manifest),
 * which the output's extends, or NULL. They stay open, unchanged, until the run returns. */
typedef struct {
    const m2d_model *teacher, *student;
    const char *manifest;
} m2d_distill_models;

/* One run, the same steps either way: m2d_distill_run opens O->teacher and O->student after the
 * cheap checks (flags, paths, config.json, tokenizer, texts) and reads the student's
 * moe2dense.json; m2d_distill_run_models runs on M (O->teacher and O->student unused). */
int m2d_distill_run(const m2d_distill_opts *o, m2d_distill_result *r);
int m2d_distill_run_models(const m2d_distill_opts *o, const m2d_distill_models *m, m2d_distill_result *r);

#endif
