/* sweep_distill — the distillation stage of a sweep (paper §3.5: the converted students are
 * distilled from the teacher before the downstream evaluation).
 *
 * After the perplexity pass, the configurations chosen by [distill].configs ("best-per-pair": for
 * each scoring x grouping, the (K, scaling) with the lowest pre-distillation PPL, as the paper's
 * Table 12; "best-per-scoring-K": per scoring the lowest pre-distillation PPL at K = k and at K = 2k,
 * as its Tables 8, 16 and 17; "all": every evaluated student; or a list of config ids) are distilled one after another with
 * the backend's distill hook into OUT.distill/<config_id>/ (a Hugging Face checkpoint, its
 * training log next to it as <config_id>.jsonl). Each distilled student is then scored with the
 * experiment's own perplexity protocol (distill_ppl, comparable with ppl) and, when the
 * experiment has [mc] tasks, on those tasks: with a distill stage the MC columns hold the
 * distilled students' accuracies (mc_student = "distilled") and the plain MC stage does not run.
 *
 * Results go crash-safely into the sidecar OUT.distill.csv (its header records the distillation
 * settings; a resumed run with other settings is refused), then into the distillation columns of
 * OUT (m2d_sweep_distill_columns) for every row whose student has the same fingerprint. A
 * configuration interrupted mid-training resumes from its checkpoint in OUT.distill/<config_id>.
 *
 * The ablation (paper Tables 4, 5): with distill.loss or distill.teacher_topk a list, each selected
 * student is distilled once per (loss, teacher_topk) -- losses outer, K' inner -- into
 * OUT.distill/<config_id>.<loss>.k<K'>/; the sidecar gains the columns loss and teacher_topk after
 * config_id (K' 0 recorded as the teacher's k: its own routing), its header records both as
 * "per-row" (the lists may grow, and a resume runs only the new combinations), and OUT's columns get
 * the first combination. With scalars the sidecar is as before. */
#ifndef M2D_SWEEP_DISTILL_H
#define M2D_SWEEP_DISTILL_H

#include "sweep/grid.h"
#include "sweep/sweep.h"
#include "sweep/sweep_backend.h"
#include "sweep/sweep_csv.h"

/* [distill] checked before any work, by the run and the dry run alike: its settings against the
 * teacher's config.json (micro_batch divides batch, seq_len fits, each teacher_topk <= E; without it
 * against the [teacher] hints), the host memory the
 * students' training on DEVICE ("cpu" or NULL: all of it; a GPU holds the student's state) needs
 * against this machine's RAM, and distill.data (training text of at least one window). -1 +
 * m2d_err naming the experiment's file and table. */
int m2d_sweep_distill_check(const m2d_experiment *x, const char *device);
/* Run the stage for the results file OUT of experiment X (whose header is META); sets
 * sum->distill_selected and sum->distill_evaluated. B must have distill. */
int m2d_sweep_distill_stage(const m2d_experiment *x, m2d_sweep_backend *b, const char *out, const m2d_sweep_meta *meta,
                            m2d_sweep_summary *sum);

#endif
