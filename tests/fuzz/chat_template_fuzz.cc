// The chat template renderer: a template text (picked by family or arbitrary), then messages
// with arbitrary roles, contents, tool calls (arguments any text) and options, tools any text.
// Renders or refuses by name, never faults.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"

namespace tk = kvserve::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string text = in.ConsumeRandomLengthString(4096);
  const std::string bos = in.ConsumeRandomLengthString(16);
  absl::StatusOr<tk::ChatTemplate> t = tk::ChatTemplate::Detect(text, bos);
  if (!t.ok()) {
    static constexpr tk::ChatTemplate::Family kFamilies[] = {tk::ChatTemplate::Family::kLlama3,
                                                             tk::ChatTemplate::Family::kLlama31,
                                                             tk::ChatTemplate::Family::kChatMl};
    t = tk::ChatTemplate::ForFamily(kFamilies[in.ConsumeIntegralInRange<int>(0, 2)], bos);
  }
  static const char* kRoles[] = {"system", "user", "assistant", "tool", "developer", ""};
  std::vector<tk::ChatMessage> messages(in.ConsumeIntegralInRange<int>(0, 8));
  for (tk::ChatMessage& m : messages) {
    m.role = in.ConsumeBool() ? kRoles[in.ConsumeIntegralInRange<int>(0, 5)]
                              : in.ConsumeRandomLengthString(12);
    m.content = in.ConsumeRandomLengthString(256);
    if (in.ConsumeBool()) m.reasoning_content = in.ConsumeRandomLengthString(64);
    for (int k = in.ConsumeIntegralInRange<int>(0, 2); k > 0; --k) {
      m.tool_calls.push_back(
          {"id", in.ConsumeRandomLengthString(16), in.ConsumeRandomLengthString(128)});
    }
  }
  tk::ChatRenderOptions options;
  options.add_generation_prompt = in.ConsumeBool();
  if (in.ConsumeBool()) options.enable_thinking = in.ConsumeBool();
  for (int k = in.ConsumeIntegralInRange<int>(0, 2); k > 0; --k) {
    options.tools.push_back(in.ConsumeRandomLengthString(256));
  }
  t->Render(messages, options).IgnoreError();
  return 0;
}
