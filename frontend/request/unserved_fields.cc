#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "frontend/request/request_fields.h"
#include "nlohmann/json.hpp"

namespace kvserve::frontend::request_fields {

namespace {

// vLLM's request fields (vllm/entrypoints/openai/protocol.py) that kvserve does not serve, and
// why, each refused unless null or its neutral value: an empty list, object or string, or the
// value below. spaces_between_special_tokens is accepted either way: with the byte-level BPE
// tokenizers kvserve loads, transformers' fast tokenizers (and so vLLM) write the same text.
absl::Status RefuseVllmExtensions(object o, bool chat) {
  struct Extension {
    const char* key;
    const char* why;
  };
  static constexpr Extension kEmptyOnly[] = {
      {"documents", "kvserve's chat templates take no documents"},
      {"chat_template", "kvserve renders the model's own template family"},
      {"mm_processor_kwargs", "kvserve serves text models only"},
      {"guided_decoding_backend", "kvserve has one constraint engine of its own"},
      {"logits_processors", "kvserve loads no logits processors by name"},
      {"kv_transfer_params", "disaggregated prefill is not served yet (issue 44)"},
      {"vllm_xargs", "kvserve has no custom extensions to pass them to"},
      {"structural_tag", "structural tags are not served yet"},
      {"reasoning_effort", "use chat_template_kwargs.enable_thinking"},
      {"prompt_embeds", "kvserve takes text or token-id prompts"},
  };
  for (const Extension& e : kEmptyOnly) {
    auto f = Field(o, e.key);
    if (!f) continue;
    simdjson::dom::array arr;
    object obj;
    std::string_view str;
    const bool empty = (f->get_array().get(arr) == simdjson::SUCCESS && arr.size() == 0) ||
                       (f->get_object().get(obj) == simdjson::SUCCESS && obj.size() == 0) ||
                       (f->get_string().get(str) == simdjson::SUCCESS && str.empty());
    if (!empty) return Bad(e.key, absl::StrCat("is not supported by kvserve (", e.why, ")"));
  }
  ASSIGN_OR_RETURN(double length_penalty, Number(o, "length_penalty", 1, -1e9, 1e9));
  if (length_penalty != 1) return Unserved("length_penalty", " or 1 (it is for beam search)");
  RETURN_IF_ERROR(Bool(o, "spaces_between_special_tokens", true).status());
  if (chat) {
    ASSIGN_OR_RETURN(bool include_reasoning, Bool(o, "include_reasoning", true));
    if (!include_reasoning) return Unserved("include_reasoning", " or true");
  }
  return absl::OkStatus();
}

}  // namespace

// Parameters of OpenAI's API, or of vLLM's extensions to it, that kvserve does not serve. Each is
// refused when it asks for something, so that no answer silently ignores it; its neutral value
// (0, 1, false, empty) passes, as clients send those by default.
absl::Status RefuseUnserved(object o, bool chat, int n) {
  RETURN_IF_ERROR(RefuseVllmExtensions(o, chat));
  ASSIGN_OR_RETURN(bool beam, Bool(o, "use_beam_search", false));
  if (beam) return Unserved("use_beam_search", " or false");
  // best_of == n asks for nothing more: every sample is returned.
  ASSIGN_OR_RETURN(int64_t best_of, Integer(o, "best_of", n, n, 128));
  if (best_of != n) {
    return Bad("best_of",
               "must equal n: kvserve returns every sample it draws (vLLM's V1 engine dropped "
               "best_of too); ask for n samples with logprobs and keep the best by their sum");
  }
  if (chat) {
    if (NonEmptyArray(o, "functions")) {
      return Bad("functions", "the legacy function calling is not served; send tools instead");
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string suffix, String(o, "suffix"));
  if (!suffix.empty()) return Unserved("suffix", " or \"\"");
  return absl::OkStatus();
}

}  // namespace kvserve::frontend::request_fields
