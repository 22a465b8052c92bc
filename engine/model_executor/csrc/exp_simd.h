/* e^x for the CPU kernels' simd loops (libm's expf is a call per element): x = n ln2 + r with
 * |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error under 2e-7), 2^n put into the
 * exponent bits. x is clamped to [-87, 88], inside float's normal range. Declared simd, so that a loop
 * under `#pragma omp simd` calls its vector clone. Included by attention/csrc and layers/csrc; the
 * kernel cache key hashes this file with each source (native_build.py). */
#ifndef STEPSCOPE_EXP_SIMD_H
#define STEPSCOPE_EXP_SIMD_H
#include <stdint.h>

#pragma omp declare simd notinbranch
static inline float exp_clamped(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}
#endif
