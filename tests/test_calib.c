/* calib: window choice, calibration hash, fast (BLAS) pass vs the obviously-correct per-token
 * accumulator (random test checkpoints and the tiny trained teacher), stats file round trip and
 * every way a stats file can be bad (missing, truncated, garbled, stale). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calib/calib.h"
#include "engine/backend.h"
#include "model/model.h"
#include "testmodel.h"
#include "base/util.h"

/* ---------------- windows and hash ---------------- */

static void windows_consecutive_and_seeded(void **state) {
    (void)state;
    int64_t s[8];
    int n;
    assert_int_equal(m2d_calib_windows(1000, 100, 4, 0, 0, s, &n), 0);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(s[i], 100 * i);
    /* fewer windows than asked: all of them */
    assert_int_equal(m2d_calib_windows(250, 100, 8, 0, 0, s, &n), 0);
    assert_int_equal(n, 2);
    /* not even one */
    assert_int_equal(m2d_calib_windows(99, 100, 8, 0, 0, s, &n), -1);
    assert_non_null(strstr(m2d_errmsg(), "fewer than one window"));
    /* seeded: reproducible, distinct, aligned, sorted, in range; another seed differs */
    int64_t a[8], b[8], c[8];
    int na, nb, nc;
    assert_int_equal(m2d_calib_windows(10000, 100, 8, 1, 42, a, &na), 0);
    assert_int_equal(m2d_calib_windows(10000, 100, 8, 1, 42, b, &nb), 0);
    assert_int_equal(m2d_calib_windows(10000, 100, 8, 1, 43, c, &nc), 0);
    assert_int_equal(na, 8);
    assert_memory_equal(a, b, sizeof a); /* integer window starts: exact */
    assert_true(memcmp(a, c, sizeof a) != 0);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(a[i] % 100, 0);
        assert_true(a[i] >= 0 && a[i] + 100 <= 10000);
        if (i) assert_true(a[i] > a[i - 1]);
    }
    /* seeded with N = M picks every window */
    assert_int_equal(m2d_calib_windows(400, 100, 4, 1, 7, a, &na), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(a[i], 100 * i);
}

static void calib_hash_changes_with_inputs(void **state) {
    (void)state;
    int32_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = i;
    int64_t st[2] = {0, 32};
    char h0[65], h1[65], h2[65], h3[65];
    m2d_calib_hash(ids, st, 2, 32, "softmax-topk-renorm", h0);
    m2d_calib_hash(ids, st, 2, 32, "softmax-topk", h1);
    m2d_calib_hash(ids, st, 2, 16, "softmax-topk-renorm", h2);
    ids[40] = 7;
    m2d_calib_hash(ids, st, 2, 32, "softmax-topk-renorm", h3);
    assert_string_not_equal(h0, h1);
    assert_string_not_equal(h0, h2);
    assert_string_not_equal(h0, h3);
    ids[40] = 40;
    m2d_calib_hash(ids, st, 2, 32, "softmax-topk-renorm", h1);
    assert_string_equal(h0, h1);
}

/* WikiText articles start at level-1 titles; windows are the documents' first L tokens. */
static void document_windows(void **state) {
    (void)state;
    const char *text = "pre\n = A = \n a a\n = = sub = = \n x\n = B = \n b\n";
    size_t *cs;
    int nd;
    m2d_calib_split_documents(text, strlen(text), &cs, &nd);
    assert_int_equal(nd, 3); /* the prefix, article A (with its subsection), article B */
    assert_int_equal(cs[0], 0);
    assert_string_equal(text + cs[1], " = A = \n a a\n = = sub = = \n x\n = B = \n b\n");
    assert_string_equal(text + cs[2], " = B = \n b\n");
    free(cs);
    /* documents of 5, 1 (skipped: one token), 40 and 3 tokens; L = 16 cuts the long one */
    int64_t docs[4] = {0, 5, 6, 46}, st[4];
    int lens[4], n;
    assert_int_equal(m2d_calib_doc_windows(docs, 4, 49, 16, 8, 0, 0, st, lens, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(st[0], 0), assert_int_equal(lens[0], 5);
    assert_int_equal(st[1], 6), assert_int_equal(lens[1], 16);
    assert_int_equal(st[2], 46), assert_int_equal(lens[2], 3);
    assert_int_equal(m2d_calib_doc_windows(docs, 4, 49, 16, 2, 1, 5, st, lens, &n), 0);
    assert_int_equal(n, 2);
    assert_true(st[0] < st[1]);
    /* the hash sees the lengths */
    int32_t ids[49];
    for (int i = 0; i < 49; i++) ids[i] = i;
    char h0[65], h1[65];
    int l2[3] = {5, 16, 3};
    int64_t s2[3] = {0, 6, 46};
    m2d_calib_hash_windows(ids, s2, l2, 3, 16, "softmax-topk", h0);
    l2[1] = 15;
    m2d_calib_hash_windows(ids, s2, l2, 3, 16, "softmax-topk", h1);
    assert_string_not_equal(h0, h1);
}

/* ---------------- fast path vs reference ---------------- */

static double max_abs(const double *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* Tolerance: both paths evaluate f_e(t) with the same fp32 engine kernel but on different batch
 * sizes (1 token vs a block), which may change the fp32 summation order inside the GEMMs; a
 * d- or d_e-term fp32 dot product then differs by at most ~(d + d_e)·2⁻²⁴ relative (≈1.6e-5 for
 * the tiny teacher, d + d_e = 264), typically far less. The fp64 sums add nothing visible. So every
 * array must agree to 2e-5 of its largest entry. Statistics that do not involve f (counts, router
 * probabilities, gates) see identical inputs in the same order and must agree exactly. */
static void assert_close(const char *what, int layer, const double *got, const double *ref, size_t n, double rtol) {
    double scale = max_abs(ref, n), worst = 0;
    size_t wi = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (d > worst) { worst = d; wi = i; }
    }
    if (worst > rtol * scale + 1e-300) {
        print_message("%s layer %d: index %zu got %.17g ref %.17g (scale %.3g)\n", what, layer, wi, got[wi], ref[wi], scale);
        fail();
    }
}

static void compare_stats(const m2d_stats *f, const m2d_stats *r) {
    assert_int_equal(f->n_layers, r->n_layers);
    assert_string_equal(f->calib_hash, r->calib_hash); /* sha256 of token ids and window lengths: integers */
    assert_true(f->N == r->N);
    for (int l = 0; l < f->n_layers; l++) {
        const m2d_layer_stats *a = &f->layers[l], *b = &r->layers[l];
        size_t E = (size_t)a->E, Ed = E * a->d;
        assert_int_equal(a->n_samples, b->n_samples);
        /* exact on every CPU (these and sum_r, sum_r2 below): one machine, both paths run the same
         * engine forward (the fast one hands it a routed output only where that is the engine's own
         * bit for bit), so probabilities and gates are the same bits, added by the same scalar fp64
         * code in token order; counts are integers */
        assert_memory_equal(a->n, b->n, E * sizeof(double));
        assert_memory_equal(a->sum_p, b->sum_p, E * sizeof(double));
        assert_memory_equal(a->sum_p_sel, b->sum_p_sel, E * sizeof(double));
        assert_memory_equal(a->sum_g, b->sum_g, E * sizeof(double));
        assert_memory_equal(a->sum_g2, b->sum_g2, E * sizeof(double));
        assert_memory_equal(a->es_act, b->es_act, E * sizeof(double));
        const double rt = 2e-5;
        assert_close("sum_f", a->layer, a->sum_f, b->sum_f, E, rt);
        assert_close("sum_f2", a->layer, a->sum_f2, b->sum_f2, E, rt);
        assert_close("sum_gf", a->layer, a->sum_gf, b->sum_gf, E, rt);
        assert_close("sum_g2f2", a->layer, a->sum_g2f2, b->sum_g2f2, E, rt);
        assert_close("sum_gf2", a->layer, a->sum_gf2, b->sum_gf2, E, rt);
        assert_close("sum_g2f", a->layer, a->sum_g2f, b->sum_g2f, E, rt);
        assert_close("es_mag", a->layer, a->es_mag, b->es_mag, E, rt);
        assert_close("es_mag_gated", a->layer, a->es_mag_gated, b->es_mag_gated, E, rt);
        assert_memory_equal(a->sum_r, b->sum_r, E * sizeof(double));
        assert_memory_equal(a->sum_r2, b->sum_r2, E * sizeof(double));
        assert_close("sum_rf", a->layer, a->sum_rf, b->sum_rf, E, rt);
        assert_close("sum_r2f2", a->layer, a->sum_r2f2, b->sum_r2f2, E, rt);
        assert_close("damage", a->layer, a->damage, b->damage, E, rt);
        /* router logits: fp64 GEMM + SYRK against dot products (fp64 over nb tokens: ~1e-15
         * relative), both from the same inputs: both paths run the same engine forward, and the
         * fast one hands the engine its routed output only where that is the engine's own bit for
         * bit (m2d_gemm_onednn_rows_independent; on AMX in bf16 it is not, and a substitute there
         * moved the residual stream, hence the router logits, by ~1e-8 relative) */
        assert_close("logit_gram", a->layer, a->logit_gram, b->logit_gram, E * E, 1e-12);
        assert_close("gram", a->layer, a->gram, b->gram, E * E, rt);
        assert_close("mu", a->layer, a->mu, b->mu, Ed, rt);
        assert_close("routed_mean", a->layer, a->routed_mean, b->routed_mean, Ed, rt);
        /* variance = E[x²] − mean²: compare against the scale of E[x²] (the cancellation's input) */
        double *sq = m2d_malloc(Ed * sizeof(double));
        for (size_t i = 0; i < Ed; i++) sq[i] = b->routed_var[i] + b->routed_mean[i] * b->routed_mean[i];
        double s = max_abs(sq, Ed), worst = 0;
        for (size_t i = 0; i < Ed; i++) worst = fmax(worst, fabs(a->routed_var[i] - b->routed_var[i]));
        assert_true(worst <= 4e-5 * s);
        free(sq);
        /* Gram is symmetric PSD-ish: exact symmetry and diag = Σ_t ‖f_e‖² over all tokens */
        for (size_t i = 0; i < E; i++)
            for (size_t j = 0; j < E; j++) assert_true(a->gram[i * E + j] == a->gram[j * E + i]);
    }
}

static m2d_model *open_testmodel(const char *dir, uint64_t seed, m2d_dtype dt) {
    m2d_testmodel_opts o;
    m2d_testmodel_defaults(&o);
    o.seed = seed;
    o.dtype = dt;
    if (m2d_testmodel_write(dir, &o)) fail_msg("%s", m2d_errmsg());
    m2d_model *m;
    if (m2d_model_open(dir, &m)) fail_msg("%s", m2d_errmsg());
    return m;
}

static int32_t *random_ids(int n, int vocab, uint64_t seed) {
    int32_t *ids = m2d_malloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(tu_rand_u64(&seed) % (uint64_t)vocab);
    return ids;
}

static void fast_matches_reference_testmodel(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_model *m = open_testmodel(dir, 3, M2D_F32);
    int32_t *ids = random_ids(400, m->cfg.vocab_size, 11);
    m2d_calib_opts o = {.seq_len = 48, .n_samples = 5, .seeded = 1, .seed = 9, .n_threads = 2, .data_path = "ids"};
    m2d_stats *fast, *ref;
    assert_int_equal(m2d_calib_run(m, ids, 400, &o, &fast), 0);
    o.reference = 1;
    assert_int_equal(m2d_calib_run(m, ids, 400, &o, &ref), 0);
    compare_stats(fast, ref);
    /* windows recorded (and how they were chosen), model identity recorded */
    assert_int_equal(fast->n_windows, 5);
    assert_string_equal(fast->window_choice, "seeded:9");
    assert_int_equal(fast->seq_len, 48);
    int64_t w[5];
    int n;
    m2d_calib_windows(400, 48, 5, 1, 9, w, &n);
    assert_memory_equal(fast->window_starts, w, sizeof w); /* integers */
    assert_string_equal(fast->model_hash, m->model_hash); /* a hash of the checkpoint's config and tensor bytes */
    assert_true(fast->N == 240);
    for (int l = 0; l < fast->n_layers; l++) {
        double tot = 0;
        for (int e = 0; e < fast->E; e++) tot += fast->layers[l].n[e];
        assert_true(tot == 240.0 * fast->k); /* every token routed to k experts (integer counts: exact) */
    }
    m2d_calib_stats_free(fast);
    m2d_calib_stats_free(ref);
    free(ids);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

static int32_t *read_golden_tokens(const char *models, int *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny-qwen3moe/golden/tokens.txt", models);
    size_t len;
    char *text = m2d_read_file(path, &len);
    if (!text) return NULL;
    int32_t *ids = m2d_malloc(len * sizeof *ids);
    int k = 0;
    char *p = text, *end;
    for (long v = strtol(p, &end, 10); end != p; p = end, v = strtol(p, &end, 10)) ids[k++] = (int32_t)v;
    free(text);
    *n = k;
    return ids;
}

/* Document windows of different lengths: fast == reference, lengths recorded and read back, and
 * ES-Act (per-sample length-normalised) no longer equals SF/k, which it does on fixed windows. */
static void document_windows_calibrate(void **state) {
    (void)state;
    char *dir = tu_tmpdir();
    m2d_model *m = open_testmodel(dir, 3, M2D_F32);
    int32_t *ids = random_ids(120, m->cfg.vocab_size, 5);
    int64_t docs[3] = {0, 10, 50};
    m2d_calib_opts o = {.seq_len = 32, .n_samples = 3, .n_threads = 1, .doc_starts = docs, .n_docs = 3};
    m2d_stats *fast, *ref, *fixed;
    assert_int_equal(m2d_calib_run(m, ids, 120, &o, &fast), 0);
    o.reference = 1;
    assert_int_equal(m2d_calib_run(m, ids, 120, &o, &ref), 0);
    compare_stats(fast, ref);
    assert_non_null(fast->window_lens);
    assert_int_equal(fast->window_lens[0], 10), assert_int_equal(fast->window_lens[1], 32);
    assert_int_equal(fast->window_lens[2], 32);
    assert_true(fast->N == 74);
    const m2d_layer_stats *a = &fast->layers[0];
    double worst = 0;
    for (int e = 0; e < a->E; e++) worst = fmax(worst, fabs(a->es_act[e] - a->n[e] / a->N));
    assert_true(worst > 1e-3);
    char *path = m2d_path_join(dir, "doc.stats");
    assert_int_equal(m2d_stats_write(fast, path), 0);
    m2d_stats *back;
    assert_int_equal(m2d_stats_read(path, &back), 0);
    assert_memory_equal(back->window_lens, fast->window_lens, 3 * sizeof(int)); /* integers */
    assert_string_equal(back->calib_hash, fast->calib_hash);
    m2d_calib_stats_free(back);
    o.doc_starts = NULL, o.reference = 0;
    assert_int_equal(m2d_calib_run(m, ids, 120, &o, &fixed), 0);
    a = &fixed->layers[0];
    for (int e = 0; e < a->E; e++) assert_true(fabs(a->es_act[e] - a->n[e] / a->N) < 1e-12);
    m2d_calib_stats_free(fast);
    m2d_calib_stats_free(ref);
    m2d_calib_stats_free(fixed);
    free(path);
    free(ids);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* the tiny teacher and its golden tokens; 1 when ../shared/models is absent */
static int open_tiny_teacher(m2d_model **m, int32_t **ids, int *n) {
    const char *models = tu_models_dir();
    if (!models) return 1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tiny-qwen3moe", models);
    if (m2d_model_open(dir, m)) fail_msg("%s", m2d_errmsg());
    *ids = read_golden_tokens(models, n);
    assert_non_null(*ids);
    return 0;
}

static void fast_matches_reference_tiny_teacher(void **state) {
    (void)state;
    m2d_model *m;
    int n = 0;
    int32_t *ids;
    if (open_tiny_teacher(&m, &ids, &n)) TU_SKIP("no ../shared/models");
    assert_int_equal(n, 64);
    m2d_calib_opts o = {.seq_len = 16, .n_samples = 3, .seeded = 1, .seed = 1, .n_threads = 2};
    m2d_stats *fast, *ref;
    assert_int_equal(m2d_calib_run(m, ids, n, &o, &fast), 0);
    o.reference = 1;
    assert_int_equal(m2d_calib_run(m, ids, n, &o, &ref), 0);
    assert_int_equal(fast->n_layers, 4);
    assert_int_equal(fast->E, 64);
    assert_string_equal(fast->gate_convention, "softmax-topk-renorm");
    compare_stats(fast, ref);
    /* gates renormalised over top-k: Σ_e Σg_e = N exactly up to fp32 rounding of each gate */
    for (int l = 0; l < fast->n_layers; l++) {
        double sg = 0;
        for (int e = 0; e < 64; e++) sg += fast->layers[l].sum_g[e];
        assert_true(fabs(sg - fast->N) < 1e-5 * fast->N);
    }
    m2d_calib_stats_free(fast);
    m2d_calib_stats_free(ref);
    free(ids);
    m2d_model_close(m);
}

/* Layer-major calibration (issue 25), in memory and spilled to a file, writes the same stats file
 * byte for byte as window-major, in fp32 and bf16: exact by construction (engine.h
 * m2d_pass_opts: the same ops on the same rows, each layer's windows in the same order, so every
 * fp64 accumulator adds the same terms in the same order). */
static void layer_major_stats_equal_window_major(void **state) {
    (void)state;
    m2d_model *m;
    int n = 0;
    int32_t *ids;
    if (open_tiny_teacher(&m, &ids, &n)) TU_SKIP("no ../shared/models");
    char *dir = tu_tmpdir();
    const m2d_pass_mode modes[3] = {M2D_PASS_WINDOW, M2D_PASS_LAYER, M2D_PASS_LAYER};
    const m2d_precision precs[2] = {M2D_PREC_FP32, M2D_PREC_BF16};
    for (int p = 0; p < 2; p++) {
        char *bytes[3];
        size_t len[3];
        for (int i = 0; i < 3; i++) {
            m2d_calib_opts o = {.seq_len = 16, .n_samples = 3, .n_threads = 2, .precision = (int)precs[p],
                                .pass = modes[i], .mem_budget = i == 2 ? 1 : 0, .spill_dir = dir};
            m2d_stats *st;
            assert_int_equal(m2d_calib_run(m, ids, n, &o, &st), 0);
            char *path = m2d_strfmt("%s/%d.stats", dir, i);
            assert_int_equal(m2d_stats_write(st, path), 0);
            bytes[i] = m2d_read_file(path, &len[i]);
            assert_non_null(bytes[i]);
            m2d_calib_stats_free(st);
            free(path);
        }
        for (int i = 1; i < 3; i++) {
            assert_int_equal(len[i], len[0]);
            assert_memory_equal(bytes[i], bytes[0], len[0]);
        }
        for (int i = 0; i < 3; i++) free(bytes[i]);
    }
    free(ids);
    m2d_model_close(m);
    tu_rm_rf(dir);
    free(dir);
}

/* bf16 calibration (issue 13): the fast path equals the per-token reference in the same precision
 * (compare_stats; the Gram's per-token fp32 sums err by <= gamma_d sum|f_i f_j|, 1.1e-5 relative at
 * d = 192, inside its 2e-5), and what bf16 activations change against fp32: routing decisions
 * (top-k sets) and the Gram. Bounds: each GEMM's activations rounded to bf16 move expert outputs
 * by ~2^-8 relative, so Gram entries (sums of products) by ~2 x 2^-8 = 0.8 % at most; routing
 * flips only for near-tied router logits: < 2 % of the N k assignments (measured values printed). */
static void bf16_calibration_tiny_teacher(void **state) {
    (void)state;
    m2d_model *m;
    int n = 0;
    int32_t *ids;
    if (open_tiny_teacher(&m, &ids, &n)) TU_SKIP("no ../shared/models");
    m2d_calib_opts o = {.seq_len = 16, .n_samples = 3, .seeded = 1, .seed = 1, .n_threads = 2, .precision = M2D_PREC_BF16};
    m2d_stats *fast, *ref, *f32;
    assert_int_equal(m2d_calib_run(m, ids, n, &o, &fast), 0);
    assert_string_equal(fast->precision, "bf16");
    o.reference = 1;
    assert_int_equal(m2d_calib_run(m, ids, n, &o, &ref), 0);
    compare_stats(fast, ref);
    o.reference = 0;
    o.precision = M2D_PREC_FP32;
    assert_int_equal(m2d_calib_run(m, ids, n, &o, &f32), 0);
    assert_string_equal(f32->precision, "fp32");
    double moved = 0, gram_rel = 0;
    for (int l = 0; l < fast->n_layers; l++) {
        const m2d_layer_stats *a = &fast->layers[l], *b = &f32->layers[l];
        size_t E = (size_t)a->E;
        for (size_t e = 0; e < E; e++) moved += fabs(a->n[e] - b->n[e]) / 2;
        double scale = max_abs(b->gram, E * E), worst = 0;
        for (size_t i = 0; i < E * E; i++) worst = fmax(worst, fabs(a->gram[i] - b->gram[i]));
        gram_rel = fmax(gram_rel, worst / scale);
    }
    double assignments = fast->N * fast->k * fast->n_layers;
    print_message("bf16 vs fp32 calibration: %.0f of %.0f routing assignments moved (%.3g %%), max Gram difference "
                  "%.3g of its scale\n", moved, assignments, 100 * moved / assignments, gram_rel);
    assert_true(moved < 0.02 * assignments);
    assert_true(gram_rel > 0 && gram_rel < 8e-3);
    m2d_calib_stats_free(fast);
    m2d_calib_stats_free(ref);
    m2d_calib_stats_free(f32);
    free(ids);
    m2d_model_close(m);
}

/* ---------------- calibration on the GPU (issue 23) ---------------- */

static int build_has_backend(const char *name) {
    for (int i = 0; i < m2d_backend_count(); i++)
        if (strcmp(m2d_backend_kind_at(i)->name, name) == 0) return 1;
    return 0;
}

/* the experts whose sum_p ranks in the top K, as a bitmask over E <= 64 experts; 0 when the K-th
 * and (K+1)-th are within TOL of each other (a near-tie no tolerance can order) */
static uint64_t top_by_sum_p(const m2d_layer_stats *a, int K, double tol) {
    uint64_t set = 0;
    double last = 0;
    for (int j = 0; j <= K; j++) {
        int best = -1;
        for (int e = 0; e < a->E; e++)
            if (!(set >> e & 1) && (best < 0 || a->sum_p[e] > a->sum_p[best])) best = e;
        if (j == K) return last - a->sum_p[best] < tol ? 0 : set;
        set |= 1ull << best;
        last = a->sum_p[best];
    }
    return set;
}

/* `calibrate --device cuda` computes the CPU's statistics: the tiny teacher's fp32 calibration on
 * both backends. Expert outputs differ by fp32 GEMM summation order only (~(d + d_e) 2^-24
 * relative, as compare_stats' 2e-5); router logits likewise, so routing flips only at near-ties
 * (measured, printed; with none, the routed sums are compared too). The experts ranked by router
 * probability mass (a scoring's selection) are the same sets. A build without the cuda backend
 * refuses the device in one line instead of running on the CPU. */
static void gpu_calibration_matches_cpu(void **state) {
    (void)state;
    m2d_model *m;
    int n = 0;
    int32_t *ids;
    if (open_tiny_teacher(&m, &ids, &n)) TU_SKIP("no ../shared/models");
    m2d_calib_opts o = {.seq_len = 16, .n_samples = 3, .seeded = 1, .seed = 1, .n_threads = 2, .device = "cuda"};
    m2d_stats *gpu = NULL, *cpu = NULL;
    int rc = m2d_calib_run(m, ids, n, &o, &gpu);
    if (!build_has_backend("cuda")) {
        assert_int_equal(rc, -1);
        assert_non_null(strstr(m2d_errmsg(), "unknown"));
    } else if (rc && strstr(m2d_errmsg(), "no CUDA device")) {
        if (getenv("M2D_REQUIRE_GPU")) fail_msg("M2D_REQUIRE_GPU is set, but: %s", m2d_errmsg());
        free(ids), m2d_model_close(m);
        TU_SKIP("no GPU");
    } else {
        if (rc) fail_msg("%s", m2d_errmsg());
        o.device = NULL;
        assert_int_equal(m2d_calib_run(m, ids, n, &o, &cpu), 0);
        assert_string_equal(gpu->calib_hash, cpu->calib_hash);
        double moved = 0, rt = 2e-5;
        for (int l = 0; l < cpu->n_layers; l++)
            for (int e = 0; e < cpu->layers[l].E; e++) moved += fabs(gpu->layers[l].n[e] - cpu->layers[l].n[e]) / 2;
        print_message("cuda vs cpu calibration: %.0f of %.0f routing assignments moved\n", moved,
                      cpu->N * cpu->k * cpu->n_layers);
        for (int l = 0; l < cpu->n_layers; l++) {
            const m2d_layer_stats *a = &gpu->layers[l], *b = &cpu->layers[l];
            size_t E = (size_t)a->E;
            assert_true(E <= 64);
            if (moved == 0) { /* the same routing: the routed sums too */
                assert_memory_equal(a->n, b->n, E * sizeof(double)); /* counts of the same sets: exact */
                assert_close("sum_g", a->layer, a->sum_g, b->sum_g, E, rt);
                assert_close("sum_f", a->layer, a->sum_f, b->sum_f, E, rt);
                assert_close("sum_gf2", a->layer, a->sum_gf2, b->sum_gf2, E, rt);
                assert_close("damage", a->layer, a->damage, b->damage, E, rt);
                assert_close("routed_mean", a->layer, a->routed_mean, b->routed_mean, E * (size_t)a->d, rt);
            }
            assert_close("sum_p", a->layer, a->sum_p, b->sum_p, E, rt);
            assert_close("logit_gram", a->layer, a->logit_gram, b->logit_gram, E * E, rt);
            assert_close("gram", a->layer, a->gram, b->gram, E * E, rt);
            assert_close("mu", a->layer, a->mu, b->mu, E * (size_t)a->d, rt);
            uint64_t sa = top_by_sum_p(a, 16, rt * max_abs(b->sum_p, E)), sb = top_by_sum_p(b, 16, rt * max_abs(b->sum_p, E));
            assert_true(sa == sb);
        }
    }
    m2d_calib_stats_free(gpu);
    m2d_calib_stats_free(cpu);
    free(ids);
    m2d_model_close(m);
}

/* ---------------- stats file ---------------- */

typedef struct {
    char *dir, *path;
    m2d_model *m;
    m2d_stats *s;
} file_fixture;

static int file_setup(void **state) {
    file_fixture *f = m2d_calloc(1, sizeof *f);
    f->dir = tu_tmpdir();
    char *md = m2d_path_join(f->dir, "model");
    f->m = open_testmodel(md, 5, M2D_BF16);
    free(md);
    int32_t *ids = random_ids(200, f->m->cfg.vocab_size, 3);
    m2d_calib_opts o = {.seq_len = 32, .n_samples = 3, .n_threads = 1, .data_path = "x.txt"};
    if (m2d_calib_run(f->m, ids, 200, &o, &f->s)) fail_msg("%s", m2d_errmsg());
    free(ids);
    f->path = m2d_path_join(f->dir, "stats.bin");
    if (m2d_stats_write(f->s, f->path)) fail_msg("%s", m2d_errmsg());
    *state = f;
    return 0;
}

static int file_teardown(void **state) {
    file_fixture *f = *state;
    m2d_calib_stats_free(f->s);
    m2d_model_close(f->m);
    tu_rm_rf(f->dir);
    free(f->dir);
    free(f->path);
    free(f);
    return 0;
}

static void stats_file_roundtrip(void **state) {
    file_fixture *f = *state;
    m2d_stats *r;
    assert_int_equal(m2d_stats_read(f->path, &r), 0);
    assert_int_equal(m2d_stats_check_model(r, f->path, f->m), 0);
    assert_string_equal(r->model_hash, f->s->model_hash);
    assert_string_equal(r->calib_hash, f->s->calib_hash);
    assert_string_equal(r->gate_convention, f->s->gate_convention);
    assert_string_equal(r->data_path, "x.txt");
    assert_int_equal(r->n_windows, 3);
    assert_int_equal(r->seq_len, 32);
    for (int w = 0; w < 3; w++) assert_int_equal(r->window_starts[w], 32 * w);
    assert_string_equal(r->window_choice, "first");
    assert_string_equal(r->precision, "fp32");
    assert_int_equal(r->E, f->s->E);
    assert_int_equal(r->d_e, f->s->d_e);
    assert_true(r->N == 96);
    for (int l = 0; l < r->n_layers; l++) {
        const m2d_layer_stats *a = &r->layers[l], *b = &f->s->layers[l];
        size_t E = (size_t)a->E, Ed = E * a->d;
        assert_int_equal(a->layer, b->layer);
        assert_int_equal(a->n_samples, 3);
        assert_true(a->N == b->N);
        /* bit-exact: the file stores the raw sums (fp64 bytes), the reader finalises the same way
         * (the same code on the same machine) */
        assert_memory_equal(a->gram, b->gram, E * E * sizeof(double));
        assert_memory_equal(a->mu, b->mu, Ed * sizeof(double));
        assert_memory_equal(a->routed_var, b->routed_var, Ed * sizeof(double));
        assert_memory_equal(a->es_mag, b->es_mag, E * sizeof(double));
        assert_memory_equal(a->sum_g2f, b->sum_g2f, E * sizeof(double));
        assert_memory_equal(a->n, b->n, E * sizeof(double));
    }
    m2d_calib_stats_free(r);
}

static void expect_read_error(const char *path, const char *needle) {
    m2d_stats *r = NULL;
    assert_int_equal(m2d_stats_read(path, &r), -1);
    if (!strstr(m2d_errmsg(), needle)) fail_msg("error '%s' lacks '%s'", m2d_errmsg(), needle);
    assert_non_null(strstr(m2d_errmsg(), path));
}

static void stats_file_bad_inputs(void **state) {
    file_fixture *f = *state;
    size_t n;
    char *good = m2d_read_file(f->path, &n);
    char *bad = m2d_path_join(f->dir, "bad.bin");
    expect_read_error("/nonexistent/stats.bin", "/nonexistent/stats.bin");
    /* truncated: inside the payload, inside the header, inside the magic */
    tu_write(bad, good, n - 8);
    expect_read_error(bad, "truncated");
    tu_write(bad, good, 40);
    expect_read_error(bad, "header");
    tu_write(bad, good, 5);
    expect_read_error(bad, "magic");
    /* one payload byte flipped */
    char *g2 = m2d_malloc(n);
    memcpy(g2, good, n);
    g2[n - 100] ^= 0x01;
    tu_write(bad, g2, n);
    expect_read_error(bad, "data_sha256");
    /* garbled header JSON */
    memcpy(g2, good, n);
    g2[16] = '#';
    tu_write(bad, g2, n);
    expect_read_error(bad, "header");
    /* header fields: wrong version, E that does not match the payload */
    memcpy(g2, good, n);
    char *v = strstr(g2 + 16, "\"version\":2");
    assert_non_null(v);
    v[10] = '7';
    tu_write(bad, g2, n);
    expect_read_error(bad, "version");
    v[10] = '1'; /* a version-1 file (before the renormalised-gate sums): refused, recalibrate */
    tu_write(bad, g2, n);
    expect_read_error(bad, "recalibrate");
    memcpy(g2, good, n);
    char *e = strstr(g2 + 16, "\"E\":8");
    assert_non_null(e);
    e[4] = '9';
    tu_write(bad, g2, n);
    expect_read_error(bad, "data_bytes");
    /* precision: not one of ours; absent (files from before it existed) reads as fp32 */
    memcpy(g2, good, n);
    char *pr = strstr(g2 + 16, ",\"precision\":\"fp32\"");
    assert_non_null(pr);
    memcpy(pr + 14, "fp64", 4);
    tu_write(bad, g2, n);
    expect_read_error(bad, "field 'precision'");
    memset(pr, ' ', strlen(",\"precision\":\"fp32\""));
    tu_write(bad, g2, n);
    m2d_stats *old;
    assert_int_equal(m2d_stats_read(bad, &old), 0);
    assert_string_equal(old->precision, "fp32");
    m2d_calib_stats_free(old);
    /* not a stats file at all */
    tu_write(bad, "{\"hello\": 1}\n", 13);
    expect_read_error(bad, "magic");
    free(g2);
    free(good);
    free(bad);
}

/* A payload whose checksum is right but whose values no calibration produces (written by
 * m2d_stats_write, so the sha256 matches): refused at load, naming the layer and the field. */
static void expect_payload_error(file_fixture *f, const char *needle) {
    char *bad = m2d_path_join(f->dir, "payload.bin");
    if (m2d_stats_write(f->s, bad)) fail_msg("%s", m2d_errmsg());
    expect_read_error(bad, needle);
    assert_null(strchr(m2d_errmsg(), '\n'));
    free(bad);
}

static void stats_payload_values_checked(void **state) {
    file_fixture *f = *state;
    m2d_layer_stats *ls = &f->s->layers[1];
    int E = f->s->E, layer = ls->layer;
    char *want = NULL;
    double keep = ls->sum_f_all[3];
    ls->sum_f_all[3] = NAN;
    want = m2d_strfmt("layer %d: field 'sum_f_all'[3]: nan is not finite", layer);
    expect_payload_error(f, want);
    free(want);
    ls->sum_f_all[3] = keep;
    keep = ls->sum_g2[2];
    ls->sum_g2[2] = -1;
    want = m2d_strfmt("layer %d: field 'sum_g2'[2]: -1 is negative", layer);
    expect_payload_error(f, want);
    free(want);
    ls->sum_g2[2] = keep;
    /* all-zero routing counts: no token was routed anywhere */
    double *n_keep = m2d_malloc((size_t)E * sizeof *n_keep);
    memcpy(n_keep, ls->n, (size_t)E * sizeof *n_keep);
    memset(ls->n, 0, (size_t)E * sizeof *ls->n);
    want = m2d_strfmt("layer %d: field 'n': the routed counts sum to 0", layer);
    expect_payload_error(f, want);
    free(want);
    memcpy(ls->n, n_keep, (size_t)E * sizeof *n_keep);
    free(n_keep);
    /* an off-diagonal Gram entry beyond Cauchy-Schwarz */
    keep = ls->gram[1 * E + 0];
    ls->gram[1 * E + 0] = 1e6 * (1 + ls->gram[0] + ls->gram[E + 1]);
    want = m2d_strfmt("layer %d: field 'gram'[1][0]", layer);
    expect_payload_error(f, want);
    free(want);
    ls->gram[1 * E + 0] = keep;
    /* a Gram matrix that is not symmetric, and the router logits' Gram checked the same way */
    ls->gram[2 * E + 1] = nextafter(ls->gram[2 * E + 1], INFINITY);
    want = m2d_strfmt("layer %d: field 'gram'[2][1]", layer);
    expect_payload_error(f, want);
    free(want);
    ls->gram[2 * E + 1] = ls->gram[1 * E + 2];
    keep = ls->logit_gram[3 * E + 3];
    ls->logit_gram[3 * E + 3] = -1;
    want = m2d_strfmt("layer %d: field 'logit_gram'[3][3]: negative diagonal", layer);
    expect_payload_error(f, want);
    free(want);
    ls->logit_gram[3 * E + 3] = keep;
    /* every sum of non-negative values is checked, whatever its place in the file */
    double *nonneg[] = {ls->sum_rf, ls->sum_rf2, ls->sum_r2f2, ls->damage, ls->es_act_sum, ls->es_mag_sum,
                        ls->es_magg_sum, ls->sum_f_routed_sq};
    const char *names[] = {"sum_rf", "sum_rf2", "sum_r2f2", "damage", "es_act_sum", "es_mag_sum", "es_magg_sum",
                           "sum_f_routed_sq"};
    for (size_t i = 0; i < sizeof nonneg / sizeof *nonneg; i++) {
        keep = nonneg[i][1];
        nonneg[i][1] = -3;
        want = m2d_strfmt("layer %d: field '%s'[1]: -3 is negative", layer, names[i]);
        expect_payload_error(f, want);
        free(want);
        nonneg[i][1] = keep;
    }
    /* and restored, it loads */
    char *ok = m2d_path_join(f->dir, "payload.bin");
    if (m2d_stats_write(f->s, ok)) fail_msg("%s", m2d_errmsg());
    m2d_stats *r;
    assert_int_equal(m2d_stats_read(ok, &r), 0);
    m2d_calib_stats_free(r);
    free(ok);
}

/* A header of a few hundred bytes claiming E = 65536 and d = 2^20 (1.6 TB of sums a layer) with a
 * matching data_bytes: refused for the missing payload before anything of that size is allocated
 * (m2d_calloc would abort the process). */
static void stats_header_size_checked_before_allocation(void **state) {
    file_fixture *f = *state;
    size_t n;
    char *good = m2d_read_file(f->path, &n);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)(unsigned char)good[8 + i] << (8 * i);
    cJSON *h = cJSON_ParseWithLength(good + 16, (size_t)hl);
    assert_non_null(h);
    double E = 65536, d = 1048576, nl = cJSON_GetNumberValue(cJSON_GetObjectItem(h, "n_layers"));
    /* 21 arrays of E, 2 of E x E, 3 of E x d (stats_file.c ARRAYS), in doubles */
    double bytes = (21 * E + 2 * E * E + 3 * E * d) * nl * 8;
    cJSON_SetNumberValue(cJSON_GetObjectItem(h, "E"), E);
    cJSON_SetNumberValue(cJSON_GetObjectItem(h, "d"), d);
    cJSON_SetNumberValue(cJSON_GetObjectItem(h, "data_bytes"), bytes);
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t jl = strlen(js), pad = (8 - (16 + jl) % 8) % 8;
    char *buf = m2d_calloc(16 + jl + pad + 64, 1); /* 64 payload bytes: far from what it claims */
    memcpy(buf, good, 8);
    for (int i = 0; i < 8; i++) buf[8 + i] = (char)(((uint64_t)(jl + pad) >> (8 * i)) & 0xff);
    memcpy(buf + 16, js, jl);
    memset(buf + 16 + jl, ' ', pad);
    char *bad = m2d_path_join(f->dir, "huge.bin");
    tu_write(bad, buf, 16 + jl + pad + 64);
    expect_read_error(bad, "field 'data_bytes': the file holds 64 payload bytes");
    free(bad), free(buf), free(js), free(good);
}

static void stats_stale_model_detected(void **state) {
    file_fixture *f = *state;
    m2d_stats *r;
    assert_int_equal(m2d_stats_read(f->path, &r), 0);
    /* same shapes, other weights: the model hash differs */
    char *md = m2d_path_join(f->dir, "other");
    m2d_model *o = open_testmodel(md, 6, M2D_BF16);
    assert_int_equal(m2d_stats_check_model(r, f->path, o), -1);
    assert_non_null(strstr(m2d_errmsg(), "model_hash"));
    assert_non_null(strstr(m2d_errmsg(), f->path));
    m2d_model_close(o);
    tu_rm_rf(md);
    /* the same weights under another rope_theta (the config is part of the model): stale too */
    m2d_testmodel_opts to;
    m2d_testmodel_defaults(&to);
    to.seed = 5, to.dtype = M2D_BF16, to.rope_theta *= 2; /* file_setup's model but for rope_theta */
    if (m2d_testmodel_write(md, &to)) fail_msg("%s", m2d_errmsg());
    if (m2d_model_open(md, &o)) fail_msg("%s", m2d_errmsg());
    assert_string_equal(o->weights_hash, f->m->weights_hash);
    assert_int_equal(m2d_stats_check_model(r, f->path, o), -1);
    assert_non_null(strstr(m2d_errmsg(), "model_hash"));
    m2d_model_close(o);
    tu_rm_rf(md);
    free(md);
    m2d_calib_stats_free(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(windows_consecutive_and_seeded),
        cmocka_unit_test(calib_hash_changes_with_inputs),
        cmocka_unit_test(fast_matches_reference_testmodel),
        cmocka_unit_test(document_windows),
        cmocka_unit_test(document_windows_calibrate),
        cmocka_unit_test(fast_matches_reference_tiny_teacher),
        cmocka_unit_test(bf16_calibration_tiny_teacher),
        cmocka_unit_test(layer_major_stats_equal_window_major),
        cmocka_unit_test(gpu_calibration_matches_cpu),
        cmocka_unit_test_setup_teardown(stats_file_roundtrip, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(stats_file_bad_inputs, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(stats_payload_values_checked, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(stats_header_size_checked_before_allocation, file_setup, file_teardown),
        cmocka_unit_test_setup_teardown(stats_stale_model_detected, file_setup, file_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
