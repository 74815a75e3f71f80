/* cpu.c — instruction-set detection (cpuid + xgetbv on x86-64, NEON on aarch64) and the kernel table: filled
 * once with the best ISA at start-up, or with the one uk_set_isa() forces. Each level overlays the scalar table,
 * so a kernel without a SIMD variant keeps its scalar reference. */
#include <pthread.h>

#include "uk_internal.h"

#if defined(UK_X86) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

uk_kernel_table uk_kt;
static int current_isa = UK_ISA_SCALAR;
static int best_isa = UK_ISA_SCALAR;
static int isa_ok[5];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int has_vbmi;

int uk_cpu_has_vbmi(void) { return has_vbmi; }

#if defined(UK_X86) && (defined(__GNUC__) || defined(__clang__))
static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect_x86(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return;                           /* the OS saves xmm/ymm state */
    int avx512_os = (xcr0 & 0xe0) == 0xe0;                     /* ... and opmask/zmm state */
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1, f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    int vnni512 = (c >> 11) & 1, vbmi = (c >> 1) & 1, bitalg = (c >> 12) & 1;
    __cpuid_count(7, 1, a, b, c, d);
    int avxvnni = (a >> 4) & 1;
    isa_ok[UK_ISA_AVX2] = avx2 && fma && f16c;
    isa_ok[UK_ISA_AVXVNNI] = isa_ok[UK_ISA_AVX2] && avxvnni;
    isa_ok[UK_ISA_AVX512] = isa_ok[UK_ISA_AVX2] && avx512_os && f && dq && bw && vl && vnni512;
    has_vbmi = isa_ok[UK_ISA_AVX512] && vbmi && bitalg;
}
#endif

static void fill(int isa) {
    uk_fill_scalar(&uk_kt);
#ifdef UK_X86
    if (isa == UK_ISA_AVX2) uk_fill_avx2(&uk_kt);
    if (isa == UK_ISA_AVXVNNI) uk_fill_avxvnni(&uk_kt);
    if (isa == UK_ISA_AVX512) uk_fill_avx512(&uk_kt);
#endif
#ifdef UK_NEON
    if (isa == UK_ISA_NEON) uk_fill_neon(&uk_kt);
#endif
    current_isa = isa;
}

static void init_once_fn(void) {
    isa_ok[UK_ISA_SCALAR] = 1;
#if defined(UK_X86) && (defined(__GNUC__) || defined(__clang__))
    detect_x86();
#endif
#ifdef UK_NEON
    isa_ok[UK_ISA_NEON] = 1;
#endif
    /* AVX-512 is preferred over AVX-VNNI: the same 256-bit kernels, with 32 registers */
    static const int order[] = {UK_ISA_AVX512, UK_ISA_AVXVNNI, UK_ISA_AVX2, UK_ISA_NEON, UK_ISA_SCALAR};
    for (int i = 0; i < 5; i++) {
        if (isa_ok[order[i]]) { best_isa = order[i]; break; }
    }
    fill(best_isa);
}

void uk_init(void) { pthread_once(&init_once, init_once_fn); }

int uk_isa_available(int isa) {
    uk_init();
    return isa >= 0 && isa < 5 ? isa_ok[isa] : 0;
}

int uk_best_isa(void) { uk_init(); return best_isa; }
int uk_get_isa(void) { uk_init(); return current_isa; }

int uk_set_isa(int isa) {
    uk_init();
    if (isa < 0 || isa >= 5 || !isa_ok[isa]) return UK_E_ISA;
    fill(isa);
    return UK_OK;
}
