// Flag parsers shared by the subcommands.
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>

#include "cli/commands.h"

namespace spill::cli {

namespace {
std::string fmt_number(double x) {
  std::string t = std::to_string(x);  // "0.000000"
  t.erase(t.find_last_not_of('0') + 1);
  if (!t.empty() && t.back() == '.') t.pop_back();
  return t;
}
}  // namespace

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

CLI::Validator number_validator(double min, bool min_allowed, const std::string& what, const std::string& type_name) {
  const std::string expected =
      "expected " + what + ", " + (min_allowed ? fmt_number(min) + " or more" : "more than " + fmt_number(min)) + ", got ";
  return CLI::Validator(
      [=](std::string& v) {
        try {
          size_t used = 0;
          const double x = std::stod(v, &used);
          if (used == v.size() && std::isfinite(x) && (x > min || (min_allowed && x == min))) return std::string();
        } catch (const std::exception&) {
        }
        return expected + v;
      },
      type_name);
}

}  // namespace spill::cli
