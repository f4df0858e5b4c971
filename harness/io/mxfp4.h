/* mxfp4 — the OCP Microscaling FP4 format in which GPT-OSS checkpoints store expert weights
 * (tensors NAME_blocks + NAME_scales, config.json quantization_config.quant_method "mxfp4").
 *
 * A row of n values (n a multiple of 32) is n/32 blocks. Block b holds 16 bytes of E2M1 codes,
 * element 2i in the low nibble of byte i and element 2i+1 in the high nibble, and one E8M0 scale
 * byte s:   value = FP4[code] * 2^(s - 127),
 * FP4 (E2M1, code bits s e e m) = 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (codes 8..15).
 * This is what transformers' integrations/mxfp4.py (convert_moe_packed_tensors) dequantises:
 * tests/test_hf_gptoss.c compares a checkpoint packed here with transformers' own dequantisation.
 *
 * Every such value with a finite result is exact in bfloat16 (at most two significant bits, an
 * exponent within bf16's range), so dequantising to bf16 loses nothing. */
#ifndef M2D_MXFP4_H
#define M2D_MXFP4_H

#include <stdint.h>

#define M2D_MXFP4_BLOCK 32 /* values per scale */

/* The 16 FP4 (E2M1) values by code. */
extern const float m2d_fp4_values[16];

/* n values (n % 32 == 0) of one row from BLOCKS [n/2 bytes] and SCALES [n/32] into OUT (fp32).
 * -1 (no message) when a value is not finite (scale 255 is NaN in E8M0; 252 is the largest scale
 * every code stays finite with: 6 * 2^125). */
int m2d_mxfp4_dequant_row(const uint8_t *blocks, const uint8_t *scales, int64_t n, float *out);

/* The packer (the inverse, for tests and tools): n values (n % 32 == 0) into BLOCKS and SCALES.
 * Scale of a block: the smallest power of two 2^(s-127) with max|x| / 2^(s-127) <= 6, so no element
 * saturates (the rounding-up rule of OpenAI's MXFP4 quantiser); an all-zero block gets s = 127.
 * Each x / 2^(s-127) rounds to the nearest FP4 value, ties to the even code (mantissa bit 0).
 * Exactly representable rows round-trip unchanged. -1 + m2d_err when a value is not finite or
 * the scale falls outside E8M0's [0, 254]. */
int m2d_mxfp4_pack_row(const float *x, int64_t n, uint8_t *blocks, uint8_t *scales);

#endif
