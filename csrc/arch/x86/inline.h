// Shared by the x86 headers: their helpers are inlined into each level's
// loops, where a call would cost more than the work.
#pragma once

#define MOE_X86_INLINE inline __attribute__((always_inline))
