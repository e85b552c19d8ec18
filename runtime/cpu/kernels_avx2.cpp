// The CPU kernels (kernels.h) at the avx2 level: AVX2 + FMA + F16C. cpu/dispatch.cpp picks a level at start.
#define STEWARD_ISA_NS avx2
#define STEWARD_ISA_TARGET "avx2,fma,f16c"
#define STEWARD_ISA_AVX2 1
#define STEWARD_ISA_BODY "cpu/kernels_body.inc"
#include "cpu/isa_variant.inc"
