#include "epp/pick_request.h"

#include <algorithm>
#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "frontend/request/openai_request.h"
#include "frontend/request/prompt.h"
#include "nlohmann/json.hpp"

namespace kvserve::epp {

using frontend::ParseCompletionRequest;
using frontend::ParsedRequest;
using frontend::PromptIds;
namespace {

// The fields that decide a request's prompt tokens, length and samples. `chat_template` and
// `documents` are left out: kvserve's parser refuses them (it renders the model's own template
// family), and a pod that serves them is the one to judge; the pick then reads the prompt as the
// model's own template renders it, close enough to find its cached prefix.
constexpr std::array<const char*, 14> kRoutingFields = {"model",
                                                        "prompt",
                                                        "messages",
                                                        "max_tokens",
                                                        "max_completion_tokens",
                                                        "n",
                                                        "cache_salt",
                                                        "tools",
                                                        "chat_template_kwargs",
                                                        "add_generation_prompt",
                                                        "echo",
                                                        "continue_final_message",
                                                        "add_special_tokens",
                                                        "truncate_prompt_tokens"};

}  // namespace

absl::StatusOr<PickRequest> ReadPickRequest(const PickOptions& options,
                                            const tokenizer::Tokenizer& tokenizer,
                                            std::string_view path, std::string_view body) {
  path = path.substr(0, path.find('?'));
  const bool chat = path == "/v1/chat/completions";
  PickRequest out;
  if ((!chat && path != "/v1/completions") || body.empty()) return out;
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }
  nlohmann::json routing = nlohmann::json::object();
  for (const char* f : kRoutingFields) {
    if (auto it = parsed.find(f); it != parsed.end()) routing[f] = *it;
  }
  ASSIGN_OR_RETURN(ParsedRequest r, ParseCompletionRequest(routing.dump(), chat, options.limits));
  ASSIGN_OR_RETURN(std::vector<int> ids, PromptIds(tokenizer, r, options.normalize_prompts, 0));
  const int prompts = chat ? 1 : std::max<int>(1, static_cast<int>(r.prompts.size()));
  const int max_tokens = r.chat && !r.max_tokens_given
                             ? std::max(1, options.max_model_len - static_cast<int>(ids.size()))
                             : std::max(1, r.max_tokens);
  kvserve::v1::GenerateRequest& g = out.request;
  g.mutable_prompt_token_ids()->Add(ids.begin(), ids.end());
  g.set_max_tokens(max_tokens);
  g.mutable_sampling()->set_n(r.n() * prompts);  // a batch of prompts goes to one pod
  g.set_cache_salt(r.cache_salt);
  out.has_prompt = true;
  return out;
}

}  // namespace kvserve::epp
