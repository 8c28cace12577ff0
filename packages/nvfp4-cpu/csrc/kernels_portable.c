/* The portable ISA level: plain C11, no SIMD intrinsics (the compiler vectorises what it can
 * for the baseline target: SSE2 on x86-64, NEON on AArch64). Always built, on every
 * architecture. */
#include "kernels_generic.h"

const nv_isa_kernels nv_kernels_portable = {
    {"portable", NV_GENERIC_MC_MAX, generic_qmm_tiles},
    generic_dequant_tiles,
};
