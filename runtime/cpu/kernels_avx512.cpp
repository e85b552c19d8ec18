// The CPU kernels (kernels.h) at the avx512 level: AVX-512 F/BW/DQ/VL/CD. cpu/dispatch.cpp picks a level at start.
#define STEWARD_ISA_NS avx512
#define STEWARD_ISA_TARGET "avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,f16c"
#define STEWARD_ISA_AVX2 1
#define STEWARD_ISA_AVX512 1
#define STEWARD_ISA_BODY "cpu/kernels_body.inc"
#include "cpu/isa_variant.inc"
