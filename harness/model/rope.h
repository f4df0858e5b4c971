/* rope — rotary position embedding parameters of config.json, and the frequencies they define,
 * exactly as Hugging Face transformers computes them (modeling_rope_utils.py: the "default",
 * "linear" and "yarn" initialisers, and DeepSeek's yarn_get_mscale / yarn_apply_mscale).
 *
 * Both spellings of config.json load (SPEC §9): the Hub's top-level `rope_theta` + `rope_scaling`
 * (with `type` or `rope_type`), and the `rope_parameters` object that save_pretrained of
 * transformers >= 5 writes (`rope_type`, `rope_theta` and the scaling keys inside). A rope type or
 * a key this module does not implement is an error naming it (never ignored). Any architecture
 * adapter calls m2d_rope_parse; the engine turns the result into the frequencies of its rope op. */
#ifndef M2D_ROPE_H
#define M2D_ROPE_H

#include <stdbool.h>

typedef enum {
    M2D_ROPE_SCALING_NONE,   /* rope_type "default": theta^(-2i/dim) */
    M2D_ROPE_SCALING_LINEAR, /* "linear": default / factor */
    M2D_ROPE_SCALING_YARN,   /* "yarn": NTK-by-parts interpolation + attention factor (YaRN paper) */
} m2d_rope_scaling_kind;

typedef struct {
    m2d_rope_scaling_kind kind;
    double factor;           /* linear, yarn: context extension factor (> 0) */
    int original_max_position_embeddings; /* yarn: pretraining context */
    double attention_factor; /* yarn: cos/sin multiplier as given, 0 when absent (derived) */
    double beta_fast, beta_slow; /* yarn: as given; 0 when absent (HF: `or 32`, `or 1`) */
    double mscale, mscale_all_dim; /* yarn: as given; 0 when absent */
    bool truncate;           /* yarn: round the correction range (HF default true) */
} m2d_rope_scaling;

/* Read theta and the scaling of JSON (a cJSON* of config.json) into *THETA and *S. The family's
 * default theta (transformers' default_theta) is DEFAULT_THETA; MAX_POS is the config's
 * max_position_embeddings (yarn's default original context). Errors name PATH and the field. */
int m2d_rope_parse(const void *json, const char *path, double default_theta, int max_pos, double *theta,
                   m2d_rope_scaling *s);

/* The DIM/2 inverse frequencies of a head of DIM rotated dimensions (dim even), in double. */
void m2d_rope_inv_freq(const m2d_rope_scaling *s, double theta, int dim, double *inv_freq);
/* transformers' attention_scaling: the factor its rotary embedding multiplies cos and sin by
 * (1 unless yarn). */
double m2d_rope_attention_factor(const m2d_rope_scaling *s);
/* DeepSeek-V2's extra softmax scale (yarn_apply_mscale): yarn_get_mscale(factor, mscale_all_dim)^2
 * when the rope is scaled and mscale_all_dim is set, else 1. */
double m2d_rope_softmax_mscale(const m2d_rope_scaling *s);
/* "default", "linear", "yarn" */
const char *m2d_rope_scaling_name(m2d_rope_scaling_kind k);
/* 1 when config.json's rope_scaling counts as given: present, not null and not {} (transformers
 * takes `rope_scaling or rope_parameters`, so an empty one falls back to rope_parameters) */
int m2d_rope_scaling_given(const void *json);

#endif
