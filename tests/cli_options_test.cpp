// The shared flag parsers of the spill subcommands.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

// Parses `--kv-mem VALUE` with the shared size option; returns the bytes, or the parse error.
struct SizeResult {
  int64_t bytes = -1;
  std::string error;
};
SizeResult parse_size(const std::string& value) {
  CLI::App app("test");
  int64_t bytes = -1;
  spill::cli::add_size_option(&app, "--kv-mem", bytes, "KV cache size");
  std::vector<std::string> args = {value, "--kv-mem"};  // CLI11 takes the arguments reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return {.bytes = -1, .error = e.what()};
  }
  return {.bytes = bytes, .error = ""};
}

}  // namespace

TEST(CliOptions, SizesInBinaryUnits) {
  EXPECT_EQ(parse_size("8589934592").bytes, int64_t(8) << 30);
  EXPECT_EQ(parse_size("8G").bytes, int64_t(8) << 30);
  EXPECT_EQ(parse_size("8g").bytes, int64_t(8) << 30);
  EXPECT_EQ(parse_size("8GiB").bytes, int64_t(8) << 30);
  EXPECT_EQ(parse_size("8GB").bytes, int64_t(8) << 30);
  EXPECT_EQ(parse_size("512M").bytes, int64_t(512) << 20);
  EXPECT_EQ(parse_size("64K").bytes, int64_t(64) << 10);
  EXPECT_EQ(parse_size("2T").bytes, int64_t(2) << 40);
}

TEST(CliOptions, BadSizesAreRefusedNamingTheFlag) {
  for (const char* bad : {"0", "0G", "-5", "12Q", "lots", "99999999999E"}) {
    const SizeResult r = parse_size(bad);
    EXPECT_EQ(r.bytes, -1) << bad;
    EXPECT_FALSE(r.error.empty()) << bad;
    EXPECT_NE(r.error.find("kv-mem"), std::string::npos) << bad << ": " << r.error;
  }
}
