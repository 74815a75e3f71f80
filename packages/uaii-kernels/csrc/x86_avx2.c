/* x86_avx2.c — the AVX2 + FMA + F16C kernels (Haswell and later, Zen). */
#include "uk_internal.h"

#ifdef UK_X86
#include <immintrin.h>
#define UK_TGT __attribute__((target("avx2,fma,f16c")))
#define UK_FN(name) name##_avx2
#define UK_LOAD_F16(p) _cvtsh_ss(*(p))
#define UK_VNNI 0
#include "ops_impl.inc"
#include "x86_ops.inc"
#include "x86_quant.inc"
#include "x86_gemv.inc"
#include "x86_act16.inc"
#include "x86_pack8.inc"
#include "x86_gemm.inc"

void uk_fill_avx2(uk_kernel_table *t) {
    fill_ops_avx2(t);
    fill_x86_ops_avx2(t);
    fill_x86_avx2(t);
}
#endif
