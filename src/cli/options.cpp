// Flag parsers shared by the subcommands.
#include <cstdint>
#include <string>

#include "cli/commands.h"

namespace spill::cli {

CLI::Option* add_size_option(CLI::App* cmd, const std::string& name, int64_t& bytes, const std::string& help) {
  // AsSizeValue rewrites "8G" to "8589934592" (checked for overflow) before the value is read;
  // false: K, M, G, T mean powers of 1024 with or without "i"/"B", as memory sizes go.
  return cmd->add_option(name, bytes, help + "; bytes, or a whole number with K, M, G or T (e.g. 512M, 8G)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Validator(
          [name](std::string& value) -> std::string {
            if (value.empty() || value[0] == '-' || value.find_first_not_of('0') == std::string::npos)
              return name + " must be a positive size such as 512M or 8G";
            return {};
          },
          "SIZE > 0"))
      ->type_name("SIZE");
}

}  // namespace spill::cli
