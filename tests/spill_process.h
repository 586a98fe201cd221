// Running the spill executable from a test, as a user would from a shell. ctest passes its path in
// SPILL_BIN (CMakeLists.txt); tests that need it skip when it is unset.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace spill::test {

// The spill executable, or "" outside ctest.
inline std::string spill_bin() {
  const char* bin = std::getenv("SPILL_BIN");
  return bin ? bin : "";
}

// Runs `cmd` in a shell; returns its exit status and what it wrote to stdout and stderr.
inline std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed for: " + cmd};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WEXITSTATUS(status), out};
}

// run_command of `spill ARGS`.
inline std::pair<int, std::string> run_spill(const std::string& args) { return run_command(spill_bin() + " " + args); }

}  // namespace spill::test
