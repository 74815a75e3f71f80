/* x86_avxvnni.c — the AVX2 kernels with 256-bit AVX-VNNI dot products (VPDPBUSD; Alder Lake, Zen 5). */
#include "uk_internal.h"

#ifdef UK_X86
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include <immintrin.h>
#define UK_TGT __attribute__((target("avx2,fma,f16c,avxvnni")))
#define UK_FN(name) name##_avxvnni
#define UK_LOAD_F16(p) _cvtsh_ss(*(p))
#define UK_VNNI 1
#include "ops_impl.inc"
#include "x86_ops.inc"
#include "x86_quant.inc"
#include "x86_gemv.inc"
#include "x86_act16.inc"
#include "x86_pack8.inc"
#include "x86_gemm.inc"

void uk_fill_avxvnni(uk_kernel_table *t) {
    fill_ops_avxvnni(t);
    fill_x86_ops_avxvnni(t);
    fill_x86_avxvnni(t);
}
#else
void uk_fill_avxvnni(uk_kernel_table *t) { uk_fill_avx2(t); }   /* compiler too old for AVX-VNNI */
#endif
#endif
