/* x86_avx512.c — the kernels compiled for AVX-512 F/BW/DQ/VL + VNNI (Ice Lake, Zen 4 and later): the 256-bit
 * kernels gain 32 vector registers and VPDPBUSD; the compiler may widen the operator loops to 512 bits. */
#include "uk_internal.h"

#ifdef UK_X86
#include <immintrin.h>
#define UK_TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define UK_FN(name) name##_avx512
#define UK_LOAD_F16(p) _cvtsh_ss(*(p))
#define UK_VNNI 2
#define UK_ATTN_HEADS 4   /* 32 vector registers: see x86_ops.inc */
#define UK_ATTN_ZMM       /* its attention dots and weighted sums in 16-float registers */
#include "ops_impl.inc"
#include "x86_ops.inc"
#include "x86_quant.inc"
#include "x86_gemv.inc"
#include "x86_act16.inc"
#include "x86_pack8.inc"
#include "x86_gemm.inc"
#include "x86_gemv512.inc"
#include "x86_wbatch.inc"

void uk_fill_avx512(uk_kernel_table *t) {
    fill_ops_avx512(t);
    fill_x86_ops_avx512(t);
    fill_x86_avx512(t);
    if (uk_cpu_has_vbmi()) {
        fill_gemv512(t);
        fill_wbatch(t);
    }
}
#endif
