# Any other architecture: the portable kernels only.
target_sources(_ops PRIVATE csrc/arch/generic/ops.cpp csrc/arch/generic/cpu_features.cpp)
