/* bench_st — checkpoint I/O on the tiny teacher: header parse + validation (mmap), model_open
 * (bind + full weights hash), sha256 full vs sampled, and the writer. Wall-clock medians of a
 * few repetitions; the machine is shared, so treat them as rough. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "io/st.h"
#include "base/util.h"
#include "yardstick.h"

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

int main(int argc, char **argv) {
    const char *models = getenv("M2D_MODELS") ? getenv("M2D_MODELS") : "../shared/models";
    char *dir = argc > 1 ? m2d_strdup(argv[1]) : m2d_path_join(models, "tiny-qwen3moe");
    enum { R = 7 };
    double t[R];
    m2d_st *st;
    size_t bytes = 0;
    for (int r = 0; r < R; r++) {
        double t0 = m2d_now();
        if (m2d_st_open(dir, &st) != 0) {
            fprintf(stderr, "bench_st: %s\n", m2d_errmsg());
            return 1;
        }
        t[r] = m2d_now() - t0;
        if (r < R - 1) m2d_st_close(st);
    }
    for (int i = 0; i < m2d_st_count(st); i++) bytes += m2d_st_at(st, i)->nbytes;
    double mb = (double)bytes / (1 << 20);
    printf("checkpoint: %s (%d tensors, %.1f MiB)\n", dir, m2d_st_count(st), mb);
    printf("%-40s %10.3f ms\n", "st_open (parse + validate header)", 1e3 * median(t, R));

    char h[65];
    for (int r = 0; r < R; r++) {
        double t0 = m2d_now();
        m2d_st_hash(st, M2D_ST_HASH_FULL_MAX, h);
        t[r] = m2d_now() - t0;
    }
    double full = median(t, R);
    printf("%-40s %10.3f ms  (%.0f MiB/s)\n", "weights hash, full sha256", 1e3 * full, mb / full);
    for (int r = 0; r < R; r++) {
        double t0 = m2d_now();
        m2d_st_hash(st, 0, h);
        t[r] = m2d_now() - t0;
    }
    double sampled = median(t, R);
    printf("%-40s %10.3f ms  (full/sampled = %.1fx)\n", "weights hash, strided sample", 1e3 * sampled,
           full / sampled);

    for (int r = 0; r < R; r++) {
        m2d_model *m;
        double t0 = m2d_now();
        if (m2d_model_open(dir, &m) != 0) {
            fprintf(stderr, "bench_st: %s\n", m2d_errmsg());
            return 1;
        }
        t[r] = m2d_now() - t0;
        m2d_model_close(m);
    }
    printf("%-40s %10.3f ms\n", "model_open (config+st+bind+hash)", 1e3 * median(t, R));

    char tmpl[] = "/tmp/m2d-bench-XXXXXX";
    char *tmp = mkdtemp(tmpl);
    char *out = m2d_path_join(tmp, "model.safetensors");
    for (int r = 0; r < 3; r++) {
        double t0 = m2d_now();
        m2d_st_writer *w = m2d_st_writer_new();
        for (int i = 0; i < m2d_st_count(st); i++) {
            const m2d_tensor *x = m2d_st_at(st, i);
            m2d_st_writer_add_ref(w, x->name, x->dtype, x->ndim, x->shape, x->data);
        }
        if (m2d_st_writer_write(w, out) != 0) {
            fprintf(stderr, "bench_st: %s\n", m2d_errmsg());
            return 1;
        }
        m2d_st_writer_free(w);
        t[r] = m2d_now() - t0;
    }
    double wt = median(t, 3);
    printf("%-40s %10.3f ms  (%.0f MiB/s, incl. fsync)\n", "writer (all tensors, atomic)", 1e3 * wt, mb / wt);
    unlink(out);
    rmdir(tmp);
    free(out);
    m2d_st_close(st);
    free(dir);
    return 0;
}
