/* pyrandom: bit-for-bit against CPython's random module.
 *
 * Expected values were produced with Python 3.11.7 by this snippet (run on this machine):
 *   import random
 *   r = random.Random(1234); [r.getrandbits(32) for _ in range(4)], r.getrandbits(40), r.random()
 *   r = random.Random(0); [r.getrandbits(32) for _ in range(3)]
 *   r = random.Random(-5); [r.getrandbits(32) for _ in range(2)]
 *   r = random.Random(2**40+7); [r.getrandbits(32) for _ in range(2)]
 *   r = random.Random(1234); r.sample(range(20), 5), r.sample(range(20), 5)        # pool algorithm
 *   r = random.Random(1234); r.sample(range(1119), 25), r.sample(range(1119), 25)  # set algorithm
 *   r = random.Random(0); r.sample(range(10042), 11), r.sample(range(30), 10)      # set, then pool
 *   r = random.Random(1234); [r.sample(range(10234), 5) for _ in range(3)]         # across documents
 * When python3 is on PATH the test also re-runs a few of these live. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "evals/pyrandom.h"
#include "base/util.h"

static void check_sample(m2d_pyrandom *r, int n, int k, const int *want) {
    int got[64];
    assert_int_equal(m2d_pyrandom_sample(r, n, k, got), 0);
    for (int i = 0; i < k; i++) assert_int_equal(got[i], want[i]);
}

static void getrandbits_and_seeding(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 1234);
    const uint32_t w1234[] = {4150886329u, 3342196574u, 1892932127u, 501869158u};
    for (int i = 0; i < 4; i++) assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), w1234[i]);
    assert_int_equal(m2d_pyrandom_getrandbits(&r, 40), 98816423444ull);
    assert_true(m2d_pyrandom_random(&r) == 0.9109759624491242);
    m2d_pyrandom_seed(&r, 0);
    const uint32_t w0[] = {3626764237u, 1654615998u, 3255389356u};
    for (int i = 0; i < 3; i++) assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), w0[i]);
    m2d_pyrandom_seed(&r, -5); /* abs(seed) */
    assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), 2675342405u);
    assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), 1097127993u);
    m2d_pyrandom_seed(&r, (1LL << 40) + 7); /* two-word key */
    assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), 2635837658u);
    assert_int_equal(m2d_pyrandom_getrandbits(&r, 32), 3209733218u);
}

static void sample_pool_algorithm(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 1234);
    check_sample(&r, 20, 5, (int[]){14, 3, 0, 2, 1});
    check_sample(&r, 20, 5, (int[]){2, 3, 11, 7, 0});
}

static void sample_set_algorithm(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 1234);
    check_sample(&r, 1119, 25, (int[]){902, 239, 15, 185, 71, 171, 201, 726, 484, 35, 63, 32, 708,
                                       991, 949, 304, 186, 374, 234, 29, 1030, 996, 511, 132, 1108});
    check_sample(&r, 1119, 25, (int[]){954, 140, 182, 1054, 94, 552, 129, 619, 985, 727, 545, 510, 409,
                                       928, 1085, 39, 1040, 144, 11, 683, 294, 968, 772, 342, 110});
}

static void sample_seed0_both(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 0);
    check_sample(&r, 10042, 11, (int[]){6311, 6890, 663, 4242, 8376, 7961, 6634, 4969, 7808, 5866, 9558});
    check_sample(&r, 30, 10, (int[]){28, 6, 16, 4, 9, 26, 3, 19, 8, 17});
}

static void sample_consumed_across_documents(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 1234);
    const int want[3][5] = {{7220, 1914, 122, 1485, 9539}, {572, 1375, 1612, 5810, 3879}, {285, 504, 259, 5670, 10211}};
    for (int d = 0; d < 3; d++) check_sample(&r, 10234, 5, want[d]);
}

static void sample_rejects_k_above_n(void **state) {
    (void)state;
    m2d_pyrandom r;
    m2d_pyrandom_seed(&r, 1);
    int out[4];
    assert_int_equal(m2d_pyrandom_sample(&r, 3, 4, out), -1);
    assert_int_equal(m2d_pyrandom_sample(&r, 0, 0, out), 0);
}

/* Live cross-check against the interpreter for many (n, k) around the algorithm switch. */
static void sample_live_python(void **state) {
    (void)state;
    if (system("python3 -c 'import random' >/dev/null 2>&1") != 0) TU_SKIP("python3 not available");
    const char *py = "python3 -c \"import random\n"
                     "for seed in (1234, 0, 7):\n"
                     "  r = random.Random(seed)\n"
                     "  for n, k in ((21,5),(22,5),(85,6),(86,6),(84,6),(280,25),(277,25),(278,25),(5,5),(1,1),(2000,26)):\n"
                     "    print(' '.join(map(str, r.sample(range(n), k))))\n\"";
    char *out = NULL;
    assert_int_equal(tu_run(py, &out, NULL), 0);
    const int nk[][2] = {{21, 5}, {22, 5}, {85, 6}, {86, 6}, {84, 6}, {280, 25}, {277, 25}, {278, 25}, {5, 5}, {1, 1}, {2000, 26}};
    const int64_t seeds[] = {1234, 0, 7};
    char *p = out;
    for (int s = 0; s < 3; s++) {
        m2d_pyrandom r;
        m2d_pyrandom_seed(&r, seeds[s]);
        for (size_t c = 0; c < M2D_ARRAY_LEN(nk); c++) {
            int got[64];
            assert_int_equal(m2d_pyrandom_sample(&r, nk[c][0], nk[c][1], got), 0);
            for (int i = 0; i < nk[c][1]; i++) {
                char *e;
                long v = strtol(p, &e, 10);
                assert_true(e != p);
                assert_int_equal(v, got[i]);
                p = e;
            }
        }
    }
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(getrandbits_and_seeding),
        cmocka_unit_test(sample_pool_algorithm),
        cmocka_unit_test(sample_set_algorithm),
        cmocka_unit_test(sample_seed0_both),
        cmocka_unit_test(sample_consumed_across_documents),
        cmocka_unit_test(sample_rejects_k_above_n),
        cmocka_unit_test(sample_live_python),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
