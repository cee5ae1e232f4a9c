/* The switch for the hand-written SIMD paths (zt_simd.h). */
#include "zt_simd.h"

static int enabled = 1;

int zt_simd_enable(int on) {
    int old = enabled;
    enabled = on != 0;
    return old;
}

int zt_use_avx2(void) {
#ifdef ZT_X86_AVX2
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return enabled && have;
#else
    return 0;
#endif
}
