#include "worker/server/process_clock.h"

#include <unistd.h>

#include <fstream>

namespace kvserve::worker {

double RssMb() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / 1048576.0;
}

}  // namespace kvserve::worker
