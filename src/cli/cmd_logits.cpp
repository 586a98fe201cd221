// spill logits: float32 logits for every position of an id sequence, as .npy, for comparison
// against other implementations.
#include <fmt/format.h>

#include <numeric>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/npy.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill::cli {

namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    std::string part = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || part.find_first_not_of(" 0123456789-") != std::string::npos || v < 0 || v > INT32_MAX)
      fail("--ids: '{}' is not a token id (expected comma-separated non-negative integers, e.g. 1,2,3)", part);
    ids.push_back(int32_t(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return ids;
}

}  // namespace

void add_logits_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Write float32 logits [n_tokens, vocab] for an id sequence to a .npy file");
  struct Args {
    std::string model, ids, out;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model, "Hugging Face model folder or GGUF file (default: the bundled spill-tiny)");
  cmd->add_option("--ids", a->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_option("--out", a->out, "output .npy file")->required();
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  cmd->callback([a] {
    const std::vector<int32_t> ids = parse_ids(a->ids);
    auto model = Model::load(a->model.empty() ? default_model_dir() : a->model);
    const int32_t block_size = 16;
    KvCacheConfig kv{.block_size = block_size, .n_blocks = (int64_t(ids.size()) + block_size - 1) / block_size};
    auto runner = make_cpu_runner(*model, kv, a->threads);
    std::vector<int32_t> table(static_cast<size_t>(kv.n_blocks));
    std::iota(table.begin(), table.end(), 0);
    ForwardBatch batch;
    batch.tokens = ids;
    batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(ids.size()), .start_pos = 0, .block_table = table,
                          .want_logits = true});
    batch.all_logits = true;
    std::vector<float> logits;
    runner->forward(batch, logits);
    write_npy_f32(a->out, logits.data(), {int64_t(ids.size()), model->spec().vocab_size});
    fmt::print(stderr, "wrote {} x {} logits to {}\n", ids.size(), model->spec().vocab_size, a->out);
  });
}

}  // namespace spill::cli
