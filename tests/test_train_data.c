/* The distillation data guard (harness/train/data.c): how many times a token budget reads the
 * training text, and the one line that says so when it is more than once. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "train/data.h"

static char *note_of(const m2d_windows *w, int steps, int batch, int *printed) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *printed = m2d_windows_repeat_note(w, "train.txt", steps, batch, f);
    fclose(f);
    return buf;
}

/* 105 ids in windows of 10: 10 windows (the tail of 5 unused). 5 steps x 4 = 20 windows: twice,
 * said in one line; 2 x 5 = 10 windows: once exactly, nothing; 3 x 4 = 12: 1.20 times. */
static void repeats_are_counted_and_said(void **state) {
    (void)state;
    int32_t ids[105];
    for (int i = 0; i < 105; i++) ids[i] = i;
    m2d_windows w;
    assert_int_equal(m2d_windows_from_ids(ids, 105, "ids", 10, M2D_ORDER_SEQUENTIAL, 0, &w), 0);
    assert_true(m2d_windows_passes(&w, 20) == 2.0);
    int printed;
    char *s = note_of(&w, 5, 4, &printed);
    assert_int_equal(printed, 1);
    assert_string_equal(s, "moe2dense distill: train.txt: the budget (5 steps x 4 windows of 10 tokens = 200 tokens) "
                           "reads its 105 tokens (10 windows) 2.00 times; the paper streams its training data "
                           "without repeat\n");
    free(s);
    s = note_of(&w, 2, 5, &printed);
    assert_int_equal(printed, 0);
    assert_string_equal(s, "");
    free(s);
    s = note_of(&w, 3, 4, &printed);
    assert_int_equal(printed, 1);
    assert_non_null(strstr(s, " 1.20 times;"));
    free(s);
    m2d_windows_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(repeats_are_counted_and_said),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
