# aarch64: NEON is the baseline; dotprod and i8mm+bf16 levels get their own
# files and flags; cpu_features.cpp (HWCAP) picks one at run time.
target_sources(_ops PRIVATE
  csrc/arch/arm/ops.cpp
  csrc/arch/arm/cpu_features.cpp
  csrc/arch/arm/gemm_neon.cpp
  csrc/arch/arm/gemm_dotprod.cpp
  csrc/arch/arm/gemm_i8mm.cpp)
moe_level_source(csrc/arch/arm/gemm_neon.cpp neon -march=armv8-a)
moe_level_source(csrc/arch/arm/gemm_dotprod.cpp dotprod -march=armv8.2-a+dotprod)
moe_level_source(csrc/arch/arm/gemm_i8mm.cpp i8mm -march=armv8.6-a+dotprod+i8mm+bf16)
