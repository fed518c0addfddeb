// kvserve-run: runs a model in-process. Generates for prompts given as text (--prompt, with a
// tokenizer) or token ids (--prompt-ids-file: a JSON object whose "prompts" key lists id lists,
// e.g. a fixture's reference.json), prints the outputs, tokens/s and cache statistics, and with
// --dump-logits writes the logits at every prompt position of prompt I as float32 tensor
// `logits_I` [len, vocab] to a safetensors file. Takes the engine flags the worker takes.
//
//   kvserve-run --model DIR --prompt-ids-file DIR/reference.json --max-tokens 8 --dump-logits
//   out.safetensors kvserve-run --model DIR --tokenizer TOKDIR --prompt "Hello" --max-tokens 32
#include <chrono>
#include <iostream>
#include <map>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/init.h"
#include "common/model/safetensors.h"
#include "common/status_macros.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "worker/engine_flags.h"

ABSL_FLAG(std::string, prompt, "", "A text prompt (needs a tokenizer)");
ABSL_FLAG(bool, chat, false,
          "Send --prompt as a user message through the tokenizer's chat template");
ABSL_FLAG(std::string, prompt_ids_file, "", "JSON file whose 'prompts' key lists token-id prompts");
ABSL_FLAG(std::string, tokenizer, "",
          "Tokenizer directory (default: --model when it has tokenizer.json)");
ABSL_FLAG(int32_t, max_tokens, 16, "Tokens to generate per prompt");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature (0: greedy)");
ABSL_FLAG(double, top_p, 1.0, "Nucleus sampling");
ABSL_FLAG(int32_t, top_k, 0, "Top-k sampling (0: off)");
ABSL_FLAG(double, min_p, 0.0, "Min-p sampling");
ABSL_FLAG(int32_t, n, 1, "Parallel samples per prompt");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past EOS");
ABSL_FLAG(std::string, dump_logits, "", "Write prompt logits to this safetensors file");
ABSL_FLAG(bool, json, false, "Print one JSON object per prompt and a JSON summary");

namespace kvserve {
namespace {

using worker::Engine;

absl::StatusOr<std::vector<std::vector<int32_t>>> LoadPrompts(const tokenizer::Tokenizer* tok) {
  std::vector<std::vector<int32_t>> prompts;
  const std::string ids_file = absl::GetFlag(FLAGS_prompt_ids_file);
  if (!ids_file.empty()) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(ids_file));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("prompts") || !j["prompts"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ids_file, ": needs a 'prompts' list of token-id lists"));
    }
    for (const auto& p : j["prompts"]) {
      if (!p.is_array())
        return absl::InvalidArgumentError(absl::StrCat(ids_file, ": a prompt is not a list"));
      std::vector<int32_t> ids;
      for (const auto& v : p) {
        if (!v.is_number_integer())
          return absl::InvalidArgumentError(
              absl::StrCat(ids_file, ": a token id is not an integer"));
        ids.push_back(v.get<int32_t>());
      }
      prompts.push_back(std::move(ids));
    }
  }
  const std::string text = absl::GetFlag(FLAGS_prompt);
  if (!text.empty()) {
    if (tok == nullptr)
      return absl::InvalidArgumentError("--prompt needs a tokenizer (--tokenizer DIR)");
    std::string rendered = text;
    bool special = true;
    if (absl::GetFlag(FLAGS_chat)) {
      ASSIGN_OR_RETURN(auto tmpl,
                       tokenizer::ChatTemplate::Detect(tok->chat_template(), tok->bos_token()));
      ASSIGN_OR_RETURN(rendered, tmpl.Render({{"user", text, {}}}, {}));
      special = false;  // the template already holds BOS
    }
    ASSIGN_OR_RETURN(std::vector<int> ids, tok->Encode(rendered, special));
    prompts.emplace_back(ids.begin(), ids.end());
  }
  if (prompts.empty()) return absl::InvalidArgumentError("give --prompt or --prompt-ids-file");
  return prompts;
}

// Every prompt as a request, keyed by its index, with the sampling flags.
absl::Status AddPrompts(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                        bool dump) {
  for (size_t i = 0; i < prompts.size(); ++i) {
    worker::RequestInput in;
    in.request_id = absl::StrCat(i);
    in.prompt = prompts[i];
    in.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    in.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
    in.sampling.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
    in.sampling.top_k = absl::GetFlag(FLAGS_top_k);
    in.sampling.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
    in.sampling.seed = engine.config().seed;  // the engine's --seed: every prompt's (unset: random)
    in.sampling.n = absl::GetFlag(FLAGS_n);
    in.sampling.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
    in.return_prompt_logits = dump;
    RETURN_IF_ERROR(Annotate(engine.AddRequest(std::move(in)), absl::StrCat("prompt ", i)));
  }
  return absl::OkStatus();
}

// What a run produced: tokens by (prompt, sample), prompt logits by prompt, and its time.
struct RunOutputs {
  std::map<std::pair<int, int>, std::vector<int32_t>> tokens;
  std::map<int, std::vector<float>> prompt_logits;
  double seconds = 0;
};

absl::StatusOr<RunOutputs> RunToEnd(Engine& engine) {
  RunOutputs r;
  const auto start = std::chrono::steady_clock::now();
  while (engine.HasWork()) {
    ASSIGN_OR_RETURN(std::vector<worker::SequenceOutput> outs, engine.Step());
    for (auto& o : outs) {
      const int index = std::stoi(o.request_id);
      auto& v = r.tokens[{index, o.sample_index}];
      v.insert(v.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.request_finished && !o.prompt_logits.empty()) {
        r.prompt_logits[index] = std::move(o.prompt_logits);
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// One line per sample (JSON with --json), then the run's summary.
void Print(const RunOutputs& r, const tokenizer::Tokenizer* tok, const worker::EngineStats& s) {
  const bool json = absl::GetFlag(FLAGS_json);
  for (const auto& [key, ids] : r.tokens) {
    std::string text;
    if (tok != nullptr) {
      absl::StatusOr<std::string> t = tok->Decode(std::vector<int>(ids.begin(), ids.end()), true);
      if (t.ok()) text = *t;
    }
    if (json) {
      nlohmann::json line = {{"prompt", key.first}, {"sample", key.second}, {"token_ids", ids}};
      if (tok != nullptr) line["text"] = text;
      std::cout << Dump(line) << "\n";
    } else {
      std::cout << "prompt " << key.first << " sample " << key.second << ": ["
                << absl::StrJoin(ids, ", ") << "]";
      if (tok != nullptr) std::cout << " " << Dump(text);
      std::cout << "\n";
    }
  }
  const double seconds = std::max(r.seconds, 1e-9);
  nlohmann::json summary = {{"seconds", r.seconds},
                            {"computed_tokens", s.computed_tokens},
                            {"generated_tokens", s.generated_tokens},
                            {"tokens_per_s", s.computed_tokens / seconds},
                            {"generated_tokens_per_s", s.generated_tokens / seconds},
                            {"steps", s.steps},
                            {"prefix_cache_queried_tokens", s.prefix_queried_tokens},
                            {"prefix_cache_hit_tokens", s.prefix_hit_tokens},
                            {"preemptions", s.preemptions},
                            {"blocks_total", s.blocks_total},
                            {"blocks_cached_evictable", s.blocks_cached_evictable}};
  std::cout << (json ? summary.dump() : summary.dump(2)) << "\n";
}

// --dump-logits: each prompt's logits as logits_I, [prompt length, vocab] float32.
absl::Status DumpLogits(const RunOutputs& r, const std::vector<std::vector<int32_t>>& prompts,
                        int64_t vocab) {
  std::vector<TensorToWrite> tensors;
  for (const auto& [index, logits] : r.prompt_logits) {
    const int64_t len = static_cast<int64_t>(prompts[index].size());
    tensors.push_back({absl::StrCat("logits_", index),
                       DType::kF32,
                       {len, vocab},
                       {reinterpret_cast<const char*>(logits.data()), logits.size() * 4}});
  }
  return WriteSafetensors(absl::GetFlag(FLAGS_dump_logits), tensors);
}

absl::Status Run() {
  ASSIGN_OR_RETURN(worker::EngineConfig config, worker::EngineConfigFromFlags());
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::string tok_dir = absl::GetFlag(FLAGS_tokenizer);
  if (tok_dir.empty() && ReadFileToString(config.model_dir + "/tokenizer.json").ok()) {
    tok_dir = config.model_dir;
  }
  if (!tok_dir.empty()) {
    ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::FromDirectory(tok_dir));
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> prompts, LoadPrompts(tok.get()));
  ASSIGN_OR_RETURN(worker::RunnerTestHooks hooks, worker::TestHooksFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(config, hooks));
  std::cerr << engine->preflight_report() << "\n";
  const bool dump = !absl::GetFlag(FLAGS_dump_logits).empty();
  RETURN_IF_ERROR(AddPrompts(*engine, prompts, dump));
  ASSIGN_OR_RETURN(const RunOutputs outputs, RunToEnd(*engine));
  Print(outputs, tok.get(), engine->stats());
  if (dump) RETURN_IF_ERROR(DumpLogits(outputs, prompts, engine->model_config().vocab_size));
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv,
                       "kvserve-run --model DIR (--prompt TEXT | --prompt-ids-file F.json) "
                       "[--max-tokens N] [--dump-logits OUT.safetensors] [engine flags]");
  absl::Status s = kvserve::Run();
  if (!s.ok()) {
    std::cerr << "kvserve-run: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
