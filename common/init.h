// Program start-up shared by every kvserve binary: Abseil flags (with a usage line), glog
// (to stderr) and its crash handler.
//
//   int main(int argc, char** argv) {
//     std::vector<char*> args = kvserve::InitProgram(argc, argv, "kvserve-plan: plans KV memory");
//     ...
//   }
#ifndef KVSERVE_COMMON_INIT_H_
#define KVSERVE_COMMON_INIT_H_

#include <string_view>
#include <vector>

namespace kvserve {

// Parses flags (exits with a one-line reason on a bad flag; --help prints every flag) and
// starts logging. Flag names may use dashes or underscores (--max-num-seqs or
// --max_num_seqs), and a boolean's negation vLLM's way too (--no-enable-prefix-caching).
// Returns the positional arguments, argv[0] first. Call once, first thing.
std::vector<char*> InitProgram(int argc, char** argv, std::string_view usage);

// Whether the flag `name` (its underscore spelling) holds other than its default: for flags
// that only some modes serve, to refuse them by name in the others.
bool FlagChanged(std::string_view name);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_INIT_H_
