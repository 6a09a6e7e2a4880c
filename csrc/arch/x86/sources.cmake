# x86_64: one file per instruction-set level, each compiled with its own flags;
# cpu_features.cpp picks one at run time and is compiled without ISA flags.
target_sources(_ops PRIVATE
  csrc/arch/x86/ops.cpp
  csrc/arch/x86/cpu_features.cpp
  csrc/arch/x86/gemm_avx2.cpp
  csrc/arch/x86/gemm_avx512.cpp
  csrc/arch/x86/gemm_int4_avx512.cpp
  csrc/arch/x86/gemm_mxfp4_avx2.cpp
  csrc/arch/x86/gemm_mxfp4_avx512.cpp
  csrc/arch/x86/gemm_mxfp4_avx512_bf16.cpp
  csrc/arch/x86/gemm_avx512_bf16.cpp
  csrc/arch/x86/gemm_amx.cpp)
moe_level_source(csrc/arch/x86/gemm_avx2.cpp avx2 -mavx2 -mfma -mf16c)
moe_level_source(csrc/arch/x86/gemm_avx512.cpp avx512
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni)
moe_level_source(csrc/arch/x86/gemm_int4_avx512.cpp avx512
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni)
moe_level_source(csrc/arch/x86/gemm_mxfp4_avx2.cpp avx2 -mavx2 -mfma -mf16c)
moe_level_source(csrc/arch/x86/gemm_mxfp4_avx512.cpp avx512
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni)
moe_level_source(csrc/arch/x86/gemm_mxfp4_avx512_bf16.cpp avx512_bf16
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx512vbmi)
moe_level_source(csrc/arch/x86/gemm_avx512_bf16.cpp avx512_bf16
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx512vbmi)
moe_level_source(csrc/arch/x86/gemm_amx.cpp amx
  -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx512vbmi
  -mamx-tile -mamx-bf16 -mamx-int8)
