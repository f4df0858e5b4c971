/* mxfp4: the MXFP4 dequantiser and packer (io/mxfp4.h) against hand-worked values, a brute-force
 * nearest-value search, and the rules of the format; transformers' own dequantisation of our
 * packed bytes is checked in tests/test_hf_gptoss.c (goldens from tools/hf_goldens_gptoss.py).
 * Exact comparisons here are exact on every CPU: MXFP4 values are FP4 table entries times powers of
 * two (exact in fp32), packing picks codes by comparisons, so round trips are byte work. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/mxfp4.h"

/* one block: codes 0..15 then 15..0, scale 2^(s-127) */
static void block_of_codes(uint8_t *q, uint8_t *scale, uint8_t s) {
    for (int i = 0; i < 16; i++) {
        int a = (2 * i) % 16, b = (2 * i + 1) % 16;
        if (i >= 8) a = 15 - a, b = 15 - b;
        q[i] = (uint8_t)(a | b << 4);
    }
    *scale = s;
}

static void dequant_hand_worked(void **state) {
    (void)state;
    uint8_t q[16], s;
    float out[32];
    block_of_codes(q, &s, 127 + 3); /* x8 */
    assert_int_equal(m2d_mxfp4_dequant_row(q, &s, 32, out), 0);
    /* element 2i is the low nibble of byte i: bytes 0..7 hold codes (0, 1), (2, 3), .., (14, 15) */
    for (int c = 0; c < 16; c++) assert_true(out[c] == 8.0f * m2d_fp4_values[c]);
    assert_true(out[1] == 4.0f && out[7] == 48.0f && out[15] == -48.0f);
    assert_true(out[8] == 0.0f && signbit(out[8])); /* code 8: -0 */
    assert_true(out[16] == -48.0f && out[17] == -32.0f); /* byte 8: codes (15, 14) */
    /* the smallest and the largest scales that stay finite */
    block_of_codes(q, &s, 0);
    assert_int_equal(m2d_mxfp4_dequant_row(q, &s, 32, out), 0);
    assert_true(out[1] == ldexpf(1.0f, -128)); /* 0.5 * 2^-127, a float subnormal */
    block_of_codes(q, &s, 252);
    assert_int_equal(m2d_mxfp4_dequant_row(q, &s, 32, out), 0);
    assert_true(out[7] == ldexpf(6.0f, 125));
    /* 253: 6 * 2^126 overflows, but a block of small codes is fine; 255 is NaN in E8M0 */
    s = 253;
    assert_int_equal(m2d_mxfp4_dequant_row(q, &s, 32, out), -1);
    uint8_t small[16];
    memset(small, 0x21, sizeof small); /* codes 1, 2: 0.5, 1 */
    assert_int_equal(m2d_mxfp4_dequant_row(small, &s, 32, out), 0);
    assert_true(out[0] == ldexpf(1.0f, 125) && out[1] == ldexpf(1.0f, 126));
    s = 255;
    assert_int_equal(m2d_mxfp4_dequant_row(small, &s, 32, out), -1);
}

static void exact_rows_round_trip(void **state) {
    (void)state;
    uint64_t st = 5;
    enum { N = 32 * 64 };
    uint8_t q[N / 2], s[N / 32], q2[N / 2], s2[N / 32];
    float x[N], y[N], z[N];
    /* random codes and scales whose block maximum is 6 or -6 (then the packer's scale is the same) */
    for (int b = 0; b < N / 32; b++) {
        s[b] = (uint8_t)(100 + tu_rand_u64(&st) % 50);
        for (int i = 0; i < 16; i++) q[b * 16 + i] = (uint8_t)tu_rand_u64(&st);
        q[b * 16 + (b % 16)] = (uint8_t)((q[b * 16 + (b % 16)] & 0xF0) | (b & 1 ? 15 : 7));
    }
    assert_int_equal(m2d_mxfp4_dequant_row(q, s, N, x), 0);
    assert_int_equal(m2d_mxfp4_pack_row(x, N, q2, s2), 0);
    assert_int_equal(m2d_mxfp4_dequant_row(q2, s2, N, y), 0);
    assert_memory_equal(x, y, sizeof x); /* -0 stays -0 */
    assert_memory_equal(s, s2, sizeof s);
    /* packing again is the identity */
    uint8_t q3[N / 2], s3[N / 32];
    assert_int_equal(m2d_mxfp4_pack_row(y, N, q3, s3), 0);
    assert_memory_equal(q2, q3, sizeof q3);
    assert_int_equal(m2d_mxfp4_dequant_row(q3, s3, N, z), 0);
    assert_memory_equal(y, z, sizeof z);
}

/* brute force: the scale is the smallest power of two with max|x| / scale <= 6, each element the
 * nearest of the 16 scaled values, ties to the even code */
static void packer_is_nearest_with_smallest_scale(void **state) {
    (void)state;
    uint64_t st = 11;
    enum { N = 32 * 256 };
    float *x = m2d_malloc(sizeof(float) * N), *y = m2d_malloc(sizeof(float) * N);
    uint8_t *q = m2d_malloc(N / 2), *s = m2d_malloc(N / 32);
    for (int i = 0; i < N; i++) x[i] = (float)(tu_rand_normal(&st) * pow(2.0, (double)(i / 32 % 20) - 10));
    for (int i = 0; i < 32; i++) x[5 * 32 + i] = 0.0f; /* an all-zero block */
    x[7 * 32 + 3] = 6.0f * 0.125f;                      /* a maximum exactly at 6 * 2^e */
    assert_int_equal(m2d_mxfp4_pack_row(x, N, q, s), 0);
    assert_int_equal(m2d_mxfp4_dequant_row(q, s, N, y), 0);
    for (int b = 0; b < N / 32; b++) {
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[b * 32 + i]));
        int e = s[b] - 127;
        if (amax == 0) assert_int_equal(s[b], 127);
        else assert_true(ldexp(6.0, e) >= amax && ldexp(6.0, e - 1) < amax);
        for (int i = 0; i < 32; i++) {
            double v = x[b * 32 + i], best = INFINITY;
            for (int c = 0; c < 16; c++) best = fmin(best, fabs(v - ldexp(m2d_fp4_values[c], e)));
            assert_true(fabs(v - y[b * 32 + i]) == best);
        }
    }
    /* ties go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4 */
    float t[32] = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.75f, -5.0f};
    float want[10] = {6.0f, 0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, -1.0f, -4.0f};
    uint8_t tq[16], ts;
    assert_int_equal(m2d_mxfp4_pack_row(t, 32, tq, &ts), 0);
    assert_int_equal(ts, 127);
    assert_int_equal(m2d_mxfp4_dequant_row(tq, &ts, 32, y), 0);
    for (int i = 0; i < 10; i++) assert_true(y[i] == want[i]);
    free(x), free(y), free(q), free(s);
}

static void packer_refuses_bad_input(void **state) {
    (void)state;
    float x[32] = {0};
    uint8_t q[16], s;
    x[3] = NAN;
    assert_int_equal(m2d_mxfp4_pack_row(x, 32, q, &s), -1);
    assert_non_null(strstr(m2d_errmsg(), "not finite"));
    x[3] = 1e38f; /* needs 2^125: fine */
    assert_int_equal(m2d_mxfp4_pack_row(x, 32, q, &s), 0);
    x[3] = 1e-45f; /* the smallest subnormal needs 2^-152: below E8M0 */
    assert_int_equal(m2d_mxfp4_pack_row(x, 32, q, &s), -1);
    assert_int_equal(m2d_mxfp4_pack_row(x, 31, q, &s), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dequant_hand_worked),
        cmocka_unit_test(exact_rows_round_trip),
        cmocka_unit_test(packer_is_nearest_with_smallest_scale),
        cmocka_unit_test(packer_refuses_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
