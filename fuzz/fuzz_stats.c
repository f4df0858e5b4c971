/* libFuzzer target for the calibration statistics reader (the sweep's cache and convert --stats):
 * any input loads or fails with one error line naming the file, never crashes, leaks or reads out
 * of bounds. So that the fuzzer gets past the payload checksum to the header and value checks, a
 * data_sha256 of 64 zeros in the input is replaced by the real checksum of the payload first. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "calib/calib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char ZEROS[] = "0000000000000000000000000000000000000000000000000000000000000000";

/* Replace the placeholder checksum in the header of BUF with the payload's own. */
static void fill_checksum(uint8_t *buf, size_t size) {
    if (size < 16) return;
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)buf[8 + i] << (8 * i);
    if (hl > size - 16) return;
    uint8_t *hdr = buf + 16, *end = hdr + hl;
    for (uint8_t *p = hdr; p + 64 <= end; p++)
        if (!memcmp(p, ZEROS, 64)) {
            char sha[65];
            m2d_sha256_hex(end, size - 16 - (size_t)hl, sha);
            memcpy(p, sha, 64);
            return;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    fill_checksum(buf, size);
    m2d_stats *s = NULL;
    if (m2d_stats_parse("fuzz.m2dstats", buf, size, &s) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "fuzz.m2dstats: ", 15) != 0 || strchr(msg, '\n')) abort();
    } else {
        /* what the reader promises: every value finite, counts sum to N k */
        for (int l = 0; l < s->n_layers; l++) {
            double total = 0;
            for (int e = 0; e < s->E; e++) {
                if (!isfinite(s->layers[l].n[e]) || s->layers[l].n[e] < 0) abort();
                total += s->layers[l].n[e];
            }
            if (total != s->N * s->k) abort();
        }
        m2d_calib_stats_free(s);
    }
    free(buf);
    return 0;
}
