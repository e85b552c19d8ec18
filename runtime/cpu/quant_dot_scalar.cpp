// The quantized dot products (quant_dot.h) at the scalar level: plain loops (the baseline build, any x86-64). cpu/dispatch.cpp picks a level at start.
#define STEWARD_ISA_NS scalar
#define STEWARD_ISA_BODY "cpu/quant_dot_body.inc"
#include "cpu/isa_variant.inc"
