/* libFuzzer target: arbitrary bytes as config.json. Parsing must never crash or leak, errors
 * stay one line naming config.json, and an accepted config is internally consistent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "base/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m2d_config c;
    const m2d_arch *arch;
    if (m2d_config_parse((const char *)data, size, "config.json", &c, &arch) != 0) {
        const char *msg = m2d_errmsg();
        if (strncmp(msg, "config.json: ", 13) != 0 || strchr(msg, '\n')) abort();
        return 0;
    }
    if (!arch || c.num_hidden_layers <= 0 || c.hidden_size <= 0 || c.head_dim <= 0) abort();
    if (c.num_attention_heads % c.num_key_value_heads) abort();
    if (c.num_experts_per_tok > c.num_experts) abort();
    for (int l = 0; l < c.num_hidden_layers; l++)
        if (c.layer_is_moe[l] && c.num_experts <= 0) abort();
    m2d_param_counts p = m2d_model_param_counts(&c);
    (void)p;
    m2d_config_free(&c);
    return 0;
}
