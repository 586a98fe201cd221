#include "offload/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace spill::offload {

namespace {

std::string read_text(const char* path) {
  std::ifstream in(path);
  if (!in) fail("cannot read {}: the expert store needs Linux's /proc", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool parse_hex(std::string_view s, uint64_t& out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// Splits off the next field (separated by spaces or tabs).
std::string_view next_field(std::string_view& line) {
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  const size_t n = std::min(line.find_first_of(" \t"), line.size());
  std::string_view f = line.substr(0, n);
  line.remove_prefix(n);
  return f;
}

}  // namespace

std::vector<MappedRegion> parse_process_maps(std::string_view text) {
  std::vector<MappedRegion> regions;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t eol = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(std::min(eol + 1, text.size()));
    if (line.empty()) continue;
    // "begin-end perms offset dev inode   path"
    const std::string_view range = next_field(line), perms = next_field(line);
    next_field(line);  // offset
    next_field(line);  // device
    const std::string_view inode = next_field(line);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    MappedRegion r;
    const size_t dash = range.find('-');
    uint64_t b = 0, e = 0, ino = 0;
    const auto ino_r = std::from_chars(inode.data(), inode.data() + inode.size(), ino);
    if (dash == std::string_view::npos || !parse_hex(range.substr(0, dash), b) || !parse_hex(range.substr(dash + 1), e) ||
        b > e || perms.size() < 4 || ino_r.ec != std::errc())
      fail("/proc/self/maps line {} is not in the kernel's format", line_no);
    r.begin = uintptr_t(b);
    r.end = uintptr_t(e);
    r.readable = perms[0] == 'r';
    r.writable = perms[1] == 'w';
    r.shared = perms[3] == 's';
    r.inode = ino;
    r.path = std::string(line);
    regions.push_back(std::move(r));
  }
  return regions;
}

std::vector<MappedRegion> read_process_maps() { return parse_process_maps(read_text("/proc/self/maps")); }

int64_t find_region(const std::vector<MappedRegion>& regions, uintptr_t addr, uint64_t bytes) {
  auto it = std::upper_bound(regions.begin(), regions.end(), addr,
                             [](uintptr_t a, const MappedRegion& r) { return a < r.begin; });
  if (it == regions.begin()) return -1;
  --it;
  if (addr >= it->end || bytes > it->end - addr) return -1;
  return int64_t(it - regions.begin());
}

AddressRange page_cover(uintptr_t addr, uint64_t bytes, uint64_t page) {
  const uintptr_t mask = uintptr_t(page - 1);
  return {.begin = addr & ~mask, .end = (addr + bytes + mask) & ~mask};
}

std::vector<AddressRange> merge_ranges(std::vector<AddressRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const AddressRange& a, const AddressRange& b) {
    return a.region != b.region ? a.region < b.region : a.begin < b.begin;
  });
  std::vector<AddressRange> merged;
  for (const AddressRange& r : ranges) {
    if (r.end <= r.begin) continue;
    if (!merged.empty() && merged.back().region == r.region && r.begin <= merged.back().end)
      merged.back().end = std::max(merged.back().end, r.end);
    else
      merged.push_back(r);
  }
  return merged;
}

uint64_t page_size() { return uint64_t(::sysconf(_SC_PAGESIZE)); }

ProcessMemory parse_process_status(std::string_view text) {
  ProcessMemory m;
  const std::pair<std::string_view, int64_t ProcessMemory::*> fields[] = {
      {"VmRSS:", &ProcessMemory::vm_rss},       {"RssAnon:", &ProcessMemory::rss_anon},
      {"RssFile:", &ProcessMemory::rss_file},   {"RssShmem:", &ProcessMemory::rss_shmem},
      {"VmLck:", &ProcessMemory::vm_lck},       {"VmPin:", &ProcessMemory::vm_pin}};
  while (!text.empty()) {
    const size_t eol = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(std::min(eol + 1, text.size()));
    for (const auto& [key, member] : fields) {
      if (line.substr(0, key.size()) != key) continue;
      line.remove_prefix(key.size());
      const std::string_view number = next_field(line), unit = next_field(line);
      int64_t kb = 0;
      const auto r = std::from_chars(number.data(), number.data() + number.size(), kb);
      if (r.ec == std::errc() && unit == "kB") m.*member = kb * 1024;
    }
  }
  return m;
}

ProcessMemory read_process_memory() { return parse_process_status(read_text("/proc/self/status")); }

}  // namespace spill::offload
