#include "common/native_libs.h"

#include <dlfcn.h>

namespace dltrain {

namespace {

template <typename F>
F lookup(const char* symbol) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, symbol));
}

using TcVersion = const char* (*)(int*, int*, const char**);
using OpenblasConfig = char* (*)();
using BliVersion = const char* (*)();

}  // namespace

std::string allocator_name() {
  if (const auto v = lookup<TcVersion>("tc_version")) {
    int major = 0, minor = 0;
    const char* patch = nullptr;
    const char* name = v(&major, &minor, &patch);
    return std::string("tcmalloc (") + (name ? name : "gperftools") + ")";
  }
  return "glibc malloc";
}

bool allocator_is_tcmalloc() { return lookup<TcVersion>("tc_version") != nullptr; }

std::string blas_name() {
  if (const auto c = lookup<OpenblasConfig>("openblas_get_config")) {
    const std::string text = c() ? c() : "";  // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ..."
    return text.rfind("OpenBLAS", 0) == 0 ? text : "OpenBLAS " + text;
  }
  if (const auto v = lookup<BliVersion>("bli_info_get_version_str")) {
    const char* text = v();
    return std::string("BLIS") + (text ? std::string(" ") + text : "");
  }
  if (lookup<void*>("mkl_get_version") != nullptr || lookup<void*>("MKL_Get_Version") != nullptr) return "MKL";
  return "reference BLAS";
}

bool blas_is_reference() { return blas_name() == "reference BLAS"; }

}  // namespace dltrain
