// What the fuzzers that need a tokenizer or a model read from the environment (scripts/fuzz.sh
// sets them): KVSERVE_FUZZ_TOKENIZER, a directory with tokenizer.json; KVSERVE_FUZZ_MODEL, a
// model directory. A fuzzer started without them says so and exits.
#ifndef KVSERVE_TESTS_FUZZ_FUZZ_ENV_H_
#define KVSERVE_TESTS_FUZZ_FUZZ_ENV_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kvserve::fuzz {

inline std::string DirFromEnv(const char* name) {
  const char* dir = std::getenv(name);
  if (dir == nullptr || *dir == '\0') {
    std::fprintf(stderr, "set %s (scripts/fuzz.sh does)\n", name);
    std::exit(2);
  }
  return dir;
}

}  // namespace kvserve::fuzz

#endif  // KVSERVE_TESTS_FUZZ_FUZZ_ENV_H_
