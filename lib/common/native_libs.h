// The native libraries that decide how fast LibTorch runs on a CPU, as this process found
// them: its malloc and its BLAS. Both are chosen at install time, not by the code:
// - malloc: the processes that run LibTorch (the worker, the benchmarks' reference loops)
//   link gperftools' tcmalloc (CMake option DLTRAIN_ALLOCATOR). glibc's malloc returns
//   freed blocks of a few MB to the kernel and every forward pass faults them in again,
//   which made evaluation 3-6x slower;
// - BLAS: Debian's LibTorch calls the generic libblas.so.3, which is netlib's reference
//   implementation unless an optimised one is installed; OpenBLAS (libopenblas0-openmp,
//   which follows LibTorch's thread count) makes the MLPs' steps ~20x faster.
// docs/training.md, "CPU speed: malloc and BLAS", has the measurements.
#pragma once

#include <string>

namespace dltrain {

/// The allocator whose malloc this process calls: "tcmalloc (gperftools 2.10)" when
/// gperftools' tcmalloc is linked or preloaded, otherwise "glibc malloc". Looked up in the
/// process's global symbol scope (tcmalloc exports tc_version); thread-safe; never throws.
std::string allocator_name();

/// True when allocator_name() is tcmalloc.
bool allocator_is_tcmalloc();

/// The BLAS this process's libblas.so.3 resolves to, looked up the same way:
/// "OpenBLAS <its configuration>", "BLIS <version>", "MKL", or "reference BLAS" when none of
/// those is loaded (netlib's, or a library that does not say what it is). Meaningful in a
/// process that has loaded LibTorch; thread-safe; never throws.
std::string blas_name();

/// True when blas_name() is "reference BLAS".
bool blas_is_reference();

}  // namespace dltrain
