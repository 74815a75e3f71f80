/* neon.c — aarch64 Advanced SIMD kernels. */
#include "uk_internal.h"

#ifdef UK_NEON
#include <arm_neon.h>
#define UK_TGT
#define UK_FN(name) name##_neon
#define UK_LOAD_F16(p) uk_h(p)
#include "ops_impl.inc"
#include "neon_kernels.inc"

void uk_fill_neon(uk_kernel_table *t) {
    fill_ops_neon(t);
    fill_neon_kernels(t);
}
#endif
