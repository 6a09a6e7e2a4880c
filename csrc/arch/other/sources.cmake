# Any other architecture: the portable kernels only.
target_sources(_ops PRIVATE csrc/arch/other/ops.cpp csrc/arch/other/cpu_features.cpp)
