/* tkpost — the post_processor of a tokenizer.json (HF `processors`) for one sequence encoded with
 * add_special_tokens=True: the ids that TemplateProcessing (its "single" template), RobertaProcessing
 * and BertProcessing put before and after the text's ids (e.g. Llama / Mixtral / DeepSeek's BOS);
 * ByteLevel adds none (it only trims offsets); a Sequence applies its processors in turn (at most
 * one of them adding ids: HF's behaviour for two is an artefact, refused here). */
#ifndef M2D_TKPOST_H
#define M2D_TKPOST_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

typedef struct {
    int32_t *pre, *post; /* malloc'd, NULL when empty */
    size_t n_pre, n_post;
} m2d_tkpost;

/* PP: the "post_processor" object of PATH's tokenizer.json (NULL or JSON null: none). Unsupported
 * types and malformed templates are a one-line error naming the field. ids above max_id are refused. */
int m2d_tkpost_load(const char *path, const cJSON *pp, int32_t max_id, m2d_tkpost *out);
void m2d_tkpost_free(m2d_tkpost *p);

#endif
