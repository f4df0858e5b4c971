/* tensor — dtypes and read-only tensor views (memory-mapped weights stay in their stored dtype). */
#ifndef M2D_TENSOR_H
#define M2D_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum { M2D_F32, M2D_F16, M2D_BF16, M2D_F64, M2D_I32, M2D_I64, M2D_U8, M2D_DTYPE_COUNT } m2d_dtype;

#define M2D_MAX_DIMS 4

typedef struct {
    const char *name;
    m2d_dtype dtype;
    int ndim;
    int64_t shape[M2D_MAX_DIMS];
    const void *data;   /* points into an mmap or an owned buffer */
    size_t nbytes;
} m2d_tensor;

size_t m2d_dtype_size(m2d_dtype t);
const char *m2d_dtype_name(m2d_dtype t);        /* safetensors spelling: "F32", "BF16", ... */
int m2d_dtype_parse(const char *s, m2d_dtype *out); /* -1 if unknown */
int64_t m2d_tensor_numel(const m2d_tensor *t);
/* The first element of T that is not finite (-1: none, or T not a float dtype); *COUNT how many. */
int64_t m2d_tensor_first_non_finite(const m2d_tensor *t, int64_t *count);

float m2d_bf16_to_f32(uint16_t h);
uint16_t m2d_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */
float m2d_f16_to_f32(uint16_t h);
uint16_t m2d_f32_to_f16(float f);   /* round to nearest even */
/* X rounded to fp32 to odd (toward zero, the last bit set where inexact): rounding that to bf16 or
 * fp16 to nearest even (m2d_from_f32) then rounds X once, as a direct fp64 -> bf16/fp16 rounding
 * would (fp32 keeps more than 2 bits beyond either: Boldo and Melquiond, "When double rounding is
 * odd"); rounding X to nearest twice could round a tie the wrong way. */
float m2d_f64_to_f32_odd(double x);

/* Convert n elements of src (dtype t) starting at element offset `first` to fp32. */
void m2d_to_f32(m2d_dtype t, const void *src, int64_t first, int64_t n, float *dst);
/* Convert n fp32 values to dtype t (F32/F16/BF16). */
void m2d_from_f32(m2d_dtype t, const float *src, int64_t n, void *dst);
/* Whole tensor to a new fp32 buffer (caller frees). */
float *m2d_tensor_f32(const m2d_tensor *t);

#endif
