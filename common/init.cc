#include "common/init.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "common/string_util.h"
#include "glog/logging.h"

namespace kvserve {

std::vector<char*> InitProgram(int argc, char** argv, std::string_view usage) {
  absl::SetProgramUsageMessage(Sv(usage));
  // --help lists kvserve's own flags (those defined outside system headers and libraries).
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StartsWith(file, "/usr/") && !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
  // vLLM spells flags with dashes (--max-num-seqs); Abseil names them with underscores.
  // Accept both by rewriting the name part of every --flag[=value] argument.
  static std::vector<std::string> storage;
  static std::vector<char*> args;
  storage.assign(argv, argv + argc);
  for (size_t i = 1; i < storage.size(); ++i) {
    std::string& a = storage[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' ||
        !std::isalpha(static_cast<unsigned char>(a[a[1] == '-' ? 2 : 1]))) {
      continue;
    }
    size_t end = std::min(a.find('='), a.size());
    // Only a flag name: a value that merely starts with "--" (kvserve-cluster --worker-args
    // "--max-num-seqs 1 --num-blocks 64") is left as it is.
    bool name = true;
    for (size_t k = 2; k < end && name; ++k) {
      name = std::isalnum(static_cast<unsigned char>(a[k])) || a[k] == '-' || a[k] == '_';
    }
    if (!name) continue;
    for (size_t k = 2; k < end; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
    // vLLM's negative form of a boolean, --no-enable-prefix-caching, is Abseil's
    // --noenable_prefix_caching.
    const size_t dashes = a[1] == '-' ? 2 : 1;
    if (a.compare(dashes, 3, "no_") == 0 && a.find('=') == std::string::npos) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(a.substr(dashes + 3));
      if (flag != nullptr && flag->IsOfType<bool>()) a.erase(dashes + 2, 1);
    }
  }
  for (std::string& a : storage) args.push_back(a.data());
  std::vector<char*> positional = absl::ParseCommandLine(argc, args.data());
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  google::InstallFailureSignalHandler();
  return positional;
}

bool FlagChanged(std::string_view name) {
  const absl::CommandLineFlag* flag =
      absl::FindCommandLineFlag(absl::string_view(name.data(), name.size()));
  return flag != nullptr && flag->CurrentValue() != flag->DefaultValue();
}

}  // namespace kvserve
