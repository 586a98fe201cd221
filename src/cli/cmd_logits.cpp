// spill logits: float32 logits for every position of an id sequence, as .npy, for comparison
// against other implementations.
#include <fmt/format.h>

#include <numeric>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "formats/npy.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill::cli {

void add_logits_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Write float32 logits [n_tokens, vocab] for an id sequence to a .npy file");
  struct Args {
    ModelFlags model;
    std::string ids, out;
    int threads = 0;
    DeviceChoice device{};
    std::optional<KvFormat> kv_format{};
  };
  auto a = std::make_shared<Args>();
  add_model_flags(cmd, a->model);
  cmd->add_option("--ids", a->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_option("--out", a->out, "output .npy file")->required();
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  add_device_option(cmd, a->device);
  add_kv_format_option(cmd, a->kv_format);
  cmd->callback([a] {
    const std::vector<int32_t> ids = parse_token_ids(a->ids, "--ids");
    (void)resolve_device(a->device);  // an impossible --device fails before the model is loaded
    auto model = open_model(a->model, a->threads);
    // One step of the whole sequence, in a pool of exactly its blocks.
    const int32_t block_size = 16;
    const int64_t n = int64_t(ids.size()), n_blocks = (n + block_size - 1) / block_size;
    auto runner = open_runner(*model, {.device = a->device,
                                       .threads = a->threads,
                                       .kv = {.block_size = block_size,
                                              .blocks = hand_built_pool_blocks(model->spec(), n_blocks)},
                                       .kv_format = a->kv_format,
                                       .limits = {.max_seqs = 1, .max_batch_tokens = n, .max_model_len = n}});
    const HandBuiltTables tables = hand_built_tables(model->spec(), n_blocks);  // one table per KV group
    const std::vector<int32_t>& table = tables.tables[0];
    ForwardBatch batch;
    batch.tokens = ids;
    batch.seqs.push_back({.first_token = 0,
                          .n_tokens = int32_t(ids.size()),
                          .start_pos = 0,
                          .block_table = table,
                          .want_logits = true,
                          .slot = 0,
                          .new_blocks = table,
                          .first_in_slot = true});
    tables.attach(batch.seqs.back(), /*first_in_slot=*/true);
    batch.all_logits = true;
    std::vector<float> logits;
    runner->forward(batch, logits);
    write_npy_f32(a->out, logits.data(), {int64_t(ids.size()), model->spec().vocab_size});
    fmt::print(stderr, "wrote {} x {} logits to {}\n", ids.size(), model->spec().vocab_size, a->out);
  });
}

}  // namespace spill::cli
