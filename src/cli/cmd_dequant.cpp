// spill dequant: one tensor of a model file, by the file's own name, dequantized to float32 in
// its own shape, as .npy: for comparing spill's dequantizers and quantizers with other tools.
#include <fmt/format.h>

#include <vector>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "formats/npy.h"
#include "model/model.h"
#include "quant/quant.h"

namespace spill::cli {

void add_dequant_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("dequant", "Write one tensor of a model, dequantized to float32, to a .npy file");
  struct Args {
    std::string model, tensor, out;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model, "model folder or file (default: the bundled spill-tiny)");
  cmd->add_option("--tensor", a->tensor, "the tensor's name in the model's files")->required();
  cmd->add_option("--out", a->out, "output .npy file")->required();
  cmd->callback([a] {
    auto model = Model::load(a->model.empty() ? default_model_dir() : a->model);
    const auto& tensors = model->source().tensors();
    auto it = tensors.find(a->tensor);
    if (it == tensors.end()) {
      std::string near;
      int shown = 0;
      for (const auto& [name, view] : tensors)
        if (shown < 8 && (name.find(a->tensor) != std::string::npos || a->tensor.find(name) != std::string::npos))
          near += (shown++ ? ", " : "") + name;
      fail("{}: no tensor named '{}' ({} tensors; {}). `spill info --model {}` lists the classes; tensor names are "
           "the file's own",
           model->where(), a->tensor, tensors.size(), near.empty() ? "no similar names" : "similar: " + near,
           model->where());
    }
    const TensorView& t = it->second;
    std::vector<float> out(size_t(t.numel()));
    const int64_t rows = t.rows(), cols = t.cols();
    for (int64_t r = 0; r < rows; ++r) quant::dequantize_row(t.dtype, t.row_data(r), out.data() + r * cols, cols);
    std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
    write_npy_f32(a->out, out.data(), shape);
    fmt::print(stderr, "wrote {} {} {} as float32 to {}\n", a->tensor, dtype_name(t.dtype), shape_str(t), a->out);
  });
}

}  // namespace spill::cli
