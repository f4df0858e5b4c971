/* state — the checkpoint of an unfinished distillation (--save-every, --resume): the master
 * weights and both AdamW moments (fp32, bit for bit), the number of steps done, and the run's
 * identity (teacher, student and data hashes, every setting that changes the numbers). The
 * data position needs no more than the step: a sample's window depends only on the seed, the
 * order and its index (data.h); nothing else is random. So a resumed run repeats exactly the
 * steps an uninterrupted run would have done (tested bit for bit).
 *
 * Layout, in DIR (OUT/train-state): step-S.weights|adam_m|adam_v.safetensors (one 1-D F32 tensor
 * each), then state.json naming them, written last (atomically) so that a crash mid-save leaves
 * the previous complete checkpoint in force; the previous step's files are removed after.
 * state.json holds the SHA-256 of each piece's values ("sha256": {"weights": ..., ...}); a resume
 * checks them and that every value is finite (the second moment also >= 0): a damaged piece is
 * refused with one line naming the file and the tensor, never trained on. */
#ifndef M2D_TRAIN_STATE_H
#define M2D_TRAIN_STATE_H

#include "io/st.h"
#include "train/params.h"

/* The identity of a run: "key=value" strings (compared on resume, key by key). */
typedef struct {
    char **items;
    int n, cap;
} m2d_run_identity;
void m2d_run_identity_add(m2d_run_identity *id, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void m2d_run_identity_free(m2d_run_identity *id);

int m2d_train_state_exists(const char *dir);
/* Save after step STEP (creates DIR), with the losses of steps 1..STEP (losses[0..step)). */
int m2d_train_state_save(const char *dir, m2d_train_params *p, int step, const m2d_run_identity *id,
                         const double *losses);
/* Load into P; *step = the steps done, LOSSES[0..*step) (room for MAX_STEPS) their losses. -1 +
 * m2d_err naming the file and the field when the checkpoint is damaged, was made by a run with
 * another identity, or is past MAX_STEPS. */
int m2d_train_state_load(const char *dir, m2d_train_params *p, const m2d_run_identity *id, int max_steps, int *step,
                         double *losses);
/* The checks of a resume, on one input each (also the fuzz targets'): state.json's TEXT (PATH in
 * errors) against the run -- *step, LOSSES[0..*step) and each piece's SHA-256; and piece PART (0
 * weights, 1 adam_m, 2 adam_v) opened as ST against TOTAL and SHA256 -- *data its values. */
int m2d_train_state_parse(const char *path, const char *text, size_t n, const m2d_run_identity *id, size_t total,
                          int max_steps, int *step, double *losses, char sha256[3][65]);
int m2d_train_state_check_piece(const char *path, const m2d_st *st, int part, size_t total, const char *sha256,
                                const float **data);
/* Remove what an interrupted save left in DIR (temp files of its writes, pieces of a step that
 * state.json does not name); how many. Only while holding OUT's lock. */
int m2d_train_state_remove_leftovers(const char *dir);
/* Remove DIR and the files this module writes in it. */
int m2d_train_state_remove(const char *dir);

#endif
