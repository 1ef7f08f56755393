#include <iostream>

#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/isa.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/thread_pool.h"
#if HETRAIN_HAVE_CUDA
#include "backends/cuda/api.h"
#endif

namespace hetrain::cli {

int cmd_version(const Args& args) {
  ArgParser p("version", "Print the version, the compiled backends and this CPU's features.");
  if (!p.parse(args)) return 0;
  const auto& f = cpu_features();
  const cpu::Isa isa = cpu::vector_isa();  // first: a bad HETRAIN_CPU_ISA fails before output
  std::cout << "hetrain " << HETRAIN_VERSION << "\n"
            << "backends: cpu (oneDNN and OpenBLAS GEMM)"
#if HETRAIN_HAVE_CUDA
            << ", " << cuda::describe() << "\n"
#else
            << "; cuda not built (HETRAIN_CUDA=OFF or no toolkit)\n"
#endif
            << "cpu: " << (f.model.empty() ? f.vendor : f.model) << ", " << num_threads()
            << " threads\n"
            << "cpu features: " << cpu_features_string() << "\n"
            << "vector kernels: " << cpu::isa_name(isa)
            << " (widest here: " << cpu::isa_name(cpu::widest_isa())
            << "; HETRAIN_CPU_ISA=baseline|avx2|avx512 lowers it)\n";
  // Each path: set by its variable, measured by 'hetrain bench', or the built-in rule.
  const auto why = [](cpu::PathSource source, const char* env, const std::string& note) {
    if (source == cpu::PathSource::env) return "set by " + std::string(env);
    if (source == cpu::PathSource::measured)
      return "the faster in this machine's device profile: " + note;
    return "the built-in rule (" + note + "; 'hetrain bench' times both)";
  };
  const bool openblas = cpu::sgemm_path() == cpu::SgemmPath::openblas;
  std::cout << "f32 GEMM: " << (openblas ? "OpenBLAS " + cpu::openblas_core_name() : "oneDNN")
            << " sgemm, " << why(cpu::sgemm_path_source(), "HETRAIN_SGEMM", path_choices().gemm)
            << "\n";
  const bool own = cpu::conv_path() == cpu::ConvPath::own;
  std::cout << "f32 convolutions: " << (own ? "own Winograd/direct kernels" : "oneDNN")
            << " first, "
            << why(cpu::conv_choice().source(), "HETRAIN_CONV_PATH", path_choices().conv) << "\n";
  std::cout << "bf16 GEMMs and convolutions: ";
  if (!cpu::onednn_has_bf16_matmul())
    std::cout << "converted to f32 (oneDNN has no bf16 kernels for this CPU)\n";
  else
    std::cout << (cpu::bf16_gemm_path() == cpu::Bf16GemmPath::onednn ? "oneDNN bf16 kernels"
                                                                     : "converted to f32")
              << ", "
              << why(cpu::bf16_gemm_choice().source(), "HETRAIN_BF16_GEMM", path_choices().bf16)
              << "\n";
  return 0;
}

}  // namespace hetrain::cli
