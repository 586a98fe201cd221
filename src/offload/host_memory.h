// The process's host memory as the expert store sees it: which address ranges are read-only
// mappings of files (/proc/self/maps), the page-aligned covers that registering such a range with
// the CUDA driver pins, and what the process holds resident (/proc/self/status). Pure host code.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spill::offload {

// One line of /proc/self/maps.
struct MappedRegion {
  uintptr_t begin = 0, end = 0;  // [begin, end), page-aligned
  bool readable = false, writable = false, shared = false;
  uint64_t inode = 0;  // 0: anonymous (heap, stacks, anonymous mmap)
  std::string path;    // the file, or "[heap]", "" for anonymous
  bool is_readonly_file() const { return readable && !writable && inode != 0 && !path.empty() && path[0] == '/'; }
};

// Parses the text of /proc/<pid>/maps; a line it cannot read is an error naming the line.
std::vector<MappedRegion> parse_process_maps(std::string_view text);
std::vector<MappedRegion> read_process_maps();  // this process, now

// The region that holds all of [addr, addr + bytes), or -1 (regions sorted by begin, as the
// kernel lists them; a range that spans two regions is in none).
int64_t find_region(const std::vector<MappedRegion>& regions, uintptr_t addr, uint64_t bytes);

// A range of bytes, [begin, end).
struct AddressRange {
  uintptr_t begin = 0, end = 0;
  int64_t region = -1;  // the mapping it lies in, when known
  uint64_t bytes() const { return end - begin; }
};

// The smallest page-aligned range that covers [addr, addr + bytes); page a power of two.
AddressRange page_cover(uintptr_t addr, uint64_t bytes, uint64_t page);
// Sorts ranges and merges those of the same region that overlap or touch, so that each page is
// registered exactly once (the driver refuses a range that overlaps one already registered).
std::vector<AddressRange> merge_ranges(std::vector<AddressRange> ranges);

uint64_t page_size();

// Resident and pinned memory of this process (kB figures of /proc/self/status, in bytes; -1 when
// the kernel does not report a field).
struct ProcessMemory {
  int64_t vm_rss = -1, rss_anon = -1, rss_file = -1, rss_shmem = -1, vm_lck = -1, vm_pin = -1;
};
ProcessMemory parse_process_status(std::string_view text);
ProcessMemory read_process_memory();

}  // namespace spill::offload
