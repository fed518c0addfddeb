// The incremental detokenizer over arbitrary id streams of the real Llama 3 tokenizer: the
// concatenation of what it emits equals Tokenizer::Decode of the same ids (both with and
// without special tokens), whatever the ids split across, and out-of-range ids are refused
// without changing the stream.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_env.h"

namespace tk = kvserve::tokenizer;

namespace {
const tk::Tokenizer* tokenizer = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto t = tk::Tokenizer::FromDirectory(kvserve::fuzz::DirFromEnv("KVSERVE_FUZZ_TOKENIZER"));
  if (!t.ok()) abort();
  tokenizer = t->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool skip = data[0] & 1;
  std::vector<int> ids;
  tk::IncrementalDetokenizer detok(*tokenizer, skip);
  std::string emitted;
  for (size_t at = 1; at + 3 <= size; at += 3) {
    // 3 bytes an id: mostly within the vocabulary, sometimes past it.
    const int id =
        (data[at] | (data[at + 1] << 8) | (data[at + 2] << 16)) % (tokenizer->vocab_size() + 64);
    absl::StatusOr<std::string> delta = detok.Append(id);
    if (!delta.ok()) {
      if (tokenizer->IsValidId(id)) abort();  // a valid id refused
      continue;
    }
    ids.push_back(id);
    emitted += *delta;
  }
  emitted += detok.Finish();
  absl::StatusOr<std::string> whole = tokenizer->Decode(ids, skip);
  if (!whole.ok() || *whole != emitted || detok.text() != emitted) abort();
  return 0;
}
