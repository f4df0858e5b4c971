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

#include <cjson/cJSON.h>
#include <stdint.h>

#include "engine/engine.h"

/* DIR/config.json (CONFIG_JSON verbatim) and DIR/model.safetensors for the architecture it names. */
int tu_family_checkpoint(const char *dir, const char *config_json, uint64_t seed);

/* WORK/NAME holding golden G's checkpoint (its config_json, seed; from its tensor list when the
 * golden has one: hf_build_listed) and the golden tokenizer (an hf_build_fn of tests/hfcheck.h;
 * fails the test on error); malloc'd. */
char *tu_family_build(const cJSON *g, const char *work);
/* Golden GOLDEN's config.json text with the fields of the JSON object SET replaced (or added) and
 * field DEL dropped (either may be NULL); malloc'd. */
char *tu_family_edited_config(const char *golden, const char *set, const char *del);
/* That edited config fails to parse with an error naming FIELD (fails the test otherwise). */
void tu_family_config_error(const char *golden, const char *set, const char *del, const char *field);
/* Golden GOLDEN's teacher: the engine's logits on N tokens against the float64 reference forward
 * (tests/reffwd.h, 2e-5), and its log-probs through the KV cache (extend [0, SPLIT), [SPLIT, N);
 * truncate to TRUNC; two branches) against the full forward (1e-4). Put SPLIT and TRUNC past the
 * model's sliding window so that the window cuts into the cached keys. */
void tu_family_engine_check(const char *golden, const char *work, int n, int split, int trunc);
/* The log-probs of three windows of TOK (N tokens, targets TG; lengths N, N - 1 and N / 2, scored
 * from 0, 1 and N / 4) through m2d_engine_logprobs_windows: layer-major in memory, layer-major
 * spilled to a file in SPILL_DIR and layer-major in groups of one window equal the window-major
 * ones bit for bit, in precision P. */
void tu_layer_major_check(const m2d_model *m, const int32_t *tok, const int32_t *tg, int n, const char *spill_dir,
                          m2d_precision p);
/* experiments.toml's "cross-model" experiment (paper section 4.6) run by `moe2dense sweep` on golden
 * GOLDEN's teacher (--set model=DIR, small windows): every configuration ok, with a perplexity and
 * an arc_easy accuracy. Needs `make data`; run from the repository root. */
void tu_family_cross_model(const char *golden, const char *work);

#endif
