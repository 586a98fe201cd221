// What a benchmark run leaves behind: requests.jsonl (one line per request, raw times),
// result.json (settings, summaries per scenario and group, the server's counters before and
// after), report.md (the tables) and report.html (the tables and SVG charts in one file that
// opens anywhere, no scripts or network). --compare reads result.json files and puts them side
// by side. Every report is made from result.json, so a comparison and a single run read alike.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/runner.h"

namespace spill::bench {

struct ReportOptions {
  std::string label;    // names this run in comparisons; default: server kind and model
  std::string command;  // the command line, recorded for docs/perf
  std::string machine;  // host description, recorded
  double slo_tok_s = 40;  // drawn on the per-stream chart
  double margin = 0.10;
};

nlohmann::json summary_json(const GroupSummary& s);
nlohmann::json record_json(const RequestRecord& r);
RequestRecord record_from_json(const nlohmann::json& j);
nlohmann::json result_json(const BenchResult& result, const ReportOptions& options);

// One or several results (from result_json or result.json files).
std::string markdown_report(const std::vector<nlohmann::json>& results);
std::string html_report(const std::vector<nlohmann::json>& results);

// Writes requests.jsonl, result.json, report.md and report.html into dir (created if needed).
void write_outputs(const BenchResult& result, const ReportOptions& options, const std::string& dir);
// Reads a result.json (or a directory holding one); throws spill::Error naming the file.
nlohmann::json load_result(const std::string& path);

}  // namespace spill::bench
