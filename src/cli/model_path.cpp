#include "cli/model_path.h"

#include <unistd.h>

#include <filesystem>
#include <vector>

#include "core/error.h"

namespace spill::cli {

namespace fs = std::filesystem;

// Looks next to the executable (installed: <prefix>/bin/spill -> <prefix>/share/spill/models;
// built in the source tree: build/spill -> models/), then in the source tree it was built from,
// never in the current directory, so `spill` behaves the same wherever it is started.
std::string default_model_dir() {
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path bin = exe.parent_path();
    candidates.push_back(bin / "../share/spill/models/spill-tiny");
    candidates.push_back(bin / "models/spill-tiny");
    candidates.push_back(bin / "../models/spill-tiny");
  }
  candidates.push_back(fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny");
  for (const fs::path& c : candidates)
    if (fs::exists(c / "config.json")) return fs::weakly_canonical(c).string();
  std::string looked;
  for (const fs::path& c : candidates) looked += "\n  " + c.lexically_normal().string();
  fail("no --model given and the bundled model spill-tiny was not found; looked in:{}\nPass --model DIR (a Hugging Face model folder).", looked);
}

}  // namespace spill::cli
