#include "common/init.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/string_util.h"
#include "glog/logging.h"

namespace kvserve {

std::vector<char*> InitProgram(int argc, char** argv, std::string_view usage) {
  absl::SetProgramUsageMessage(Sv(usage));
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  google::InstallFailureSignalHandler();
  return positional;
}

}  // namespace kvserve
