/* familyckpt — grid checkpoints (the generator of testmodel.h, seeded per tensor name) of the
 * families whose layouts testmodel.c does not write: MixtralForCausalLM, and GptOssForCausalLM
 * with its experts unquantised or MXFP4. Names, shapes and dtypes are the ones transformers'
 * save_pretrained writes, so that a config.json written by transformers gives its
 * model.safetensors byte for byte (tools/hf_goldens_families.py makes those with transformers'
 * classes; tests/test_mixtral.c and test_gptoss.c rebuild them).
 * MXFP4 experts: the grid values of the unquantised name (".../experts.gate_up_proj") laid out as
 * the stored [E, rows, cols] matrices (nn.Linear [out, in]: gate_up rows 2j gate, 2j + 1 up),
 * packed by io/mxfp4.h's packer into NAME_blocks and NAME_scales (U8). */
#ifndef M2D_TEST_FAMILYCKPT_H
#define M2D_TEST_FAMILYCKPT_H

#include <stdint.h>

/* DIR/config.json (CONFIG_JSON verbatim) and DIR/model.safetensors for the architecture it names. */
int tu_family_checkpoint(const char *dir, const char *config_json, uint64_t seed);

#endif
