// The one place that turns "this model, on this device, with these limits" into a model runner
// (open_runner) or a running engine (open_engine). Every command that runs a model goes through
// here: serve, run-batch and profile through open_engine; generate, logits and eval through
// open_runner. --device picks the backend:
//   cpu   the CPU runner (model/decoder.cpp);
//   cuda  the CUDA runner on GPU N (`cuda:N`, default 0): refused with a clear message when this
//         build has no CUDA runner or the machine has no usable GPU;
//   auto  (the default) cuda when this build has a CUDA runner and a usable GPU is present, else cpu.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "model/runner.h"
#include "offload/model_experts.h"

namespace spill {

enum class Device : uint8_t { Auto, Cpu, Cuda };

struct DeviceChoice {
  Device device = Device::Auto;
  int cuda_index = 0;  // which GPU for Device::Cuda (list_gpus() order): the first of cuda_list
  // "cuda:0,1": the GPUs of an expert-parallel plan, in the plan's order; empty: cuda_index and the
  // ones after it, as many as the plan has.
  std::vector<int> cuda_list{};
};
// "auto", "cpu", "cuda", "cuda:N", "cuda:N,M,..." (case-insensitive; distinct GPUs); throws
// spill::Error naming --device.
DeviceChoice parse_device(std::string_view text);
std::string device_name(const DeviceChoice& choice);  // "auto", "cpu", "cuda:0", "cuda:0,1"

// What `choice` means on this machine and build: never Auto. Throws spill::Error saying why
// when cuda was asked for and cannot be had (no CUDA runner in this build, no usable GPU, no GPU
// of that index).
DeviceChoice resolve_device(const DeviceChoice& choice);

// How to build a runner.
struct RunnerOptions {
  DeviceChoice device{};
  int threads = 0;        // CPU threads (the CPU runner's pool; a GPU runner's host side); <= 0: all
  KvCapacity kv{};        // block size, and the pool by blocks, by bytes (--kv-mem) or by the runner's default
  // --kv-format: what the KV cache stores K and V in (model/kv_format.h); unset: the backend's own,
  // f32 on the CPU runner (its only one) and bf16 on CUDA (fp8 halves it: e4m3 with per-head scales).
  std::optional<KvFormat> kv_format{};
  RunnerLimits limits{};  // max sequences, tokens per step, model length
  // --plan: a placement plan (`spill plan --out`) saying which routed experts live in host RAM
  // (read by the GPU in place over PCIe) and which in VRAM; "": every weight on the GPU. CUDA only.
  std::string expert_plan{};
  // --gpu-mem / --host-experts / --host-mem: plan the routed experts at start-up instead (the fit
  // report is logged first; a model that does not fit is refused before its weights are uploaded).
  offload::StartupPlacement placement{};
};
// A runner for model on the device options ask for (resolve_device). The model must outlive it.
std::unique_ptr<ModelRunner> open_runner(const Model& model, const RunnerOptions& options);

struct EngineOptions {
  // Device, threads and KV pool. The runner's limits are taken from the EngineConfig
  // (scheduler.max_running, scheduler.max_batch_tokens, max_model_len), so engine and runner agree.
  RunnerOptions runner{};
  std::string quant{};    // --quant mix to quantize the weights with at load; "": as stored
  std::string imatrix{};  // importance matrix for that quantization; "": none
  bool require_tokenizer = false;  // a model folder without tokenizer.json is an error (open by path)
};
// Opens --model (a folder or a GGUF: engine/model_bundle), quantizes it as asked, builds its
// runner and starts an engine over it.
std::unique_ptr<Engine> open_engine(const std::string& model_path, const EngineOptions& options,
                                    const EngineConfig& config);
// The same for a model already opened (its quantization, if any, still as options ask).
std::unique_ptr<Engine> open_engine(ModelBundle bundle, const EngineOptions& options, const EngineConfig& config);

}  // namespace spill
