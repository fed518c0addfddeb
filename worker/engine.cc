#include "worker/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/sampling.h"
#include "nlohmann/json.hpp"

namespace kvserve::worker {
namespace {

// EOS ids from generation_config.json (an int or a list), which may list more than config.json.
std::vector<int> GenerationEos(const std::string& dir) {
  std::vector<int> out;
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/generation_config.json");
  if (!text.ok()) return out;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("eos_token_id")) return out;
  const nlohmann::json& e = j["eos_token_id"];
  if (e.is_number_integer()) out.push_back(e.get<int>());
  if (e.is_array()) {
    for (const auto& v : e) {
      if (v.is_number_integer()) out.push_back(v.get<int>());
    }
  }
  return out;
}

// The cache's "auto" type (and that of full-precision layers) is the weights' type.
KvDType AutoKvType(DType weights) {
  return weights == DType::kBF16  ? KvDType::kBf16
         : weights == DType::kF16 ? KvDType::kFp16
                                  : KvDType::kFp32;
}

// The adjustments' id lists as the kernels read them (kernels/logits_processing.h): ascending,
// one entry per id; of two biases for an id, the later one.
void OrderAdjustmentLists(SamplingParams& s) {
  std::vector<std::pair<int32_t, float>>& bias = s.logit_bias;
  std::stable_sort(bias.begin(), bias.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  auto last = std::unique(bias.rbegin(), bias.rend(),
                          [](const auto& a, const auto& b) { return a.first == b.first; });
  bias.erase(bias.begin(), last.base());
  std::vector<int32_t>& allowed = s.allowed_token_ids;
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                       const RunnerTestHooks& hooks) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Engine> e(new Engine());
  KVSERVE_CHECK_THREAD(e->engine_thread_);
  e->config_ = config;
  if (config.seed) e->seeds_.seed(*config.seed);
  if (e->config_.model_id.empty()) {
    e->config_.model_id = std::filesystem::path(config.model_dir).filename().string();
  }
  RETURN_IF_ERROR(e->Plan());
  RETURN_IF_ERROR(e->StartRunner(hooks));
  e->StartScheduler();
  const bool one_rank = config.parallel.tensor_parallel_size == 1;
  e->async_ = config.async_scheduling == AsyncScheduling::kOn ||
              (config.async_scheduling == AsyncScheduling::kAuto &&
               config.backend.device == Device::kCuda && one_rank);
  e->preflight_ = PreflightReport({.config = e->config_,
                                   .model = e->model_config_,
                                   .kv_spec = e->kv_spec_,
                                   .runner = *e->runner_,
                                   .pools = e->pools_,
                                   .graphs = e->graph_recording_,
                                   .weight_type = e->runner_config_.weight_type,
                                   .num_blocks = e->num_blocks_,
                                   .max_model_len = e->max_model_len_});
  e->engine_thread_.Detach();  // the engine thread is whichever calls it next
  return e;
}

absl::Status Engine::Plan() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  ASSIGN_OR_RETURN(model_config_, LoadHfConfig(config_.ConfigPath()));
  RETURN_IF_ERROR(ModelRunner::CheckDevices(config_.backend, config_.parallel));
  RETURN_IF_ERROR(config_.ValidateForModel(model_config_));
  max_model_len_ = config_.max_model_len > 0
                       ? config_.max_model_len
                       : static_cast<int>(model_config_.max_position_embeddings);
  const DType weight_type = config_.WeightType(model_config_);
  ASSIGN_OR_RETURN(kv_spec_, MakeKvCacheSpec(config_.cache.kv_quant, model_config_.num_layers,
                                             model_config_.head_dim, AutoKvType(weight_type)));
  ASSIGN_OR_RETURN(pools_, PlanPools(config_, kv_spec_, model_config_));
  const SchedulerConfig& s = config_.scheduler;
  RunnerConfig& rc = runner_config_;
  rc.model_dir = config_.model_dir;
  rc.model = model_config_;
  rc.weight_type = weight_type;
  rc.kv_spec = kv_spec_;
  rc.backend = config_.backend;
  rc.backend.cuda_graph_max_batch =
      std::min({config_.backend.cuda_graph_max_batch, s.max_num_seqs, s.max_num_batched_tokens});
  rc.parallel = config_.parallel;
  rc.block_size = config_.cache.block_size;
  rc.num_blocks = pools_.device_blocks;
  rc.num_host_blocks = pools_.host_blocks;
  rc.max_blocks_per_seq = (max_model_len_ + rc.block_size - 1) / rc.block_size;
  rc.max_step_tokens = s.max_num_batched_tokens;
  rc.max_logit_rows = s.max_num_seqs;
  eos_ids_ = model_config_.eos_token_ids;
  for (int id : GenerationEos(config_.model_dir)) {
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }
  constraints_ =
      std::make_unique<Constraints>(config_.model_dir, model_config_.vocab_size,
                                    std::vector<int32_t>(eos_ids_.begin(), eos_ids_.end()));
  return absl::OkStatus();
}

absl::Status Engine::StartRunner(const RunnerTestHooks& hooks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  ASSIGN_OR_RETURN(runner_, ModelRunner::Create(runner_config_, hooks));
  num_blocks_ = runner_->num_blocks();
  RETURN_IF_ERROR(CheckPoolHoldsLongestSequence(config_, pools_, num_blocks_, max_model_len_));
  ASSIGN_OR_RETURN(graph_recording_, RecordDecodeGraphs(*runner_, runner_config_));
  return absl::OkStatus();
}

void Engine::StartScheduler() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const CacheConfig& c = config_.cache;
  kv_ = std::make_unique<KvCacheManager>(KvPoolOptions{
      num_blocks_, c.block_size, c.enable_prefix_caching, pools_.host_blocks, c.host_prefix_cache});
  SchedulerConfig scheduler = config_.scheduler;
  scheduler.max_logit_rows = static_cast<int>(runner_config_.max_logit_rows);  // reserved rows
  scheduler_ = std::make_unique<Scheduler>(scheduler, kv_.get());
  transfer_ = std::make_unique<PrefixTransfer>(
      runner_.get(), kv_.get(), c.block_size,
      [this](absl::Span<const int32_t> prompt, const std::string& cache_salt) {
        KVSERVE_CHECK_THREAD(engine_thread_);  // the part runs on this thread
        return PromptHashes(prompt, cache_salt);
      });
  streamer_ = std::make_unique<LayerStreamer>(
      runner_.get(), kv_.get(), transfer_.get(), c.block_size,
      [this](const std::string& request_id) -> const Request* {
        KVSERVE_CHECK_THREAD(engine_thread_);  // the part runs on this thread
        auto it = requests_.find(request_id);
        return it == requests_.end() ? nullptr : it->second.get();
      });
}

absl::Status Engine::Validate(const RequestInput& in) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (in.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (requests_.contains(in.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request '", in.request_id, "' is already running"));
  }
  if (in.prompt.empty()) return absl::InvalidArgumentError("the prompt must not be empty");
  const int vocab = model_config_.vocab_size;
  for (size_t i = 0; i < in.prompt.size(); ++i) {
    if (in.prompt[i] < 0 || in.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", in.prompt[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (in.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", in.max_tokens));
  }
  if (static_cast<int64_t>(in.prompt.size()) + in.max_tokens > max_model_len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", in.prompt.size(), " tokens) + max_tokens (", in.max_tokens,
                     ") exceeds the maximum model length (", max_model_len_, ")"));
  }
  if (in.priority != 0 && !config_.priority_scheduling) {
    return absl::InvalidArgumentError(
        absl::StrCat("priority ", in.priority,
                     " needs --scheduling-policy priority (this worker serves in arrival order)"));
  }
  const SamplingParams& s = in.sampling;
  if (!(s.temperature >= 0.0f)) return absl::InvalidArgumentError("temperature must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    return absl::InvalidArgumentError("top_p must be in (0, 1]");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f))
    return absl::InvalidArgumentError("min_p must be in [0, 1]");
  if (s.top_k < -1) return absl::InvalidArgumentError("top_k must be -1, 0 or positive");
  if (s.n < 1 || s.n > config_.scheduler.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n must be in [1, --max-num-seqs=", config_.scheduler.max_num_seqs, "], got ", s.n));
  }
  for (const auto& [name, top] :
       {std::pair{"logprobs", s.logprobs}, std::pair{"prompt_logprobs", s.prompt_logprobs}}) {
    if (top && (*top < -1 || *top > vocab)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be -1 (the whole vocabulary) or in [0, ", vocab, "], got ", *top));
    }
  }
  if (!s.logprob_token_ids.empty() && !s.logprobs) {
    return absl::InvalidArgumentError("logprob_token_ids needs logprobs");
  }
  if (s.logprob_token_ids.size() > kernels::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("logprob_token_ids: at most ",
                                                   kernels::kMaxTopLogprobs, " ids, got ",
                                                   s.logprob_token_ids.size()));
  }
  for (int32_t t : in.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids: token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return ValidateAdjustments(s, in.max_tokens);
}

absl::Status Engine::ValidateAdjustments(const SamplingParams& s, int max_tokens) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const int vocab = model_config_.vocab_size;
  auto in_vocab = [&](int32_t id, absl::string_view what) {
    return id >= 0 && id < vocab
               ? absl::OkStatus()
               : absl::InvalidArgumentError(absl::StrCat(
                     what, ": token id ", id, " is outside the vocabulary [0, ", vocab, ")"));
  };
  for (const auto& [name, value] : {std::pair{"presence_penalty", s.presence_penalty},
                                    std::pair{"frequency_penalty", s.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be in [-2, 2], got ", value));
    }
  }
  if (!(s.repetition_penalty > 0.0f && std::isfinite(s.repetition_penalty))) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", s.repetition_penalty));
  }
  if (s.min_tokens < 0 || s.min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens=", max_tokens, "], got ", s.min_tokens));
  }
  for (const auto& [id, bias] : s.logit_bias) {
    RETURN_IF_ERROR(in_vocab(id, "logit_bias"));
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias of token ", id, " must be in [-100, 100], got ", bias));
    }
  }
  for (const std::vector<int32_t>& word : s.bad_words) {
    if (word.empty()) return absl::InvalidArgumentError("bad_words: a word has no tokens");
    for (int32_t id : word) RETURN_IF_ERROR(in_vocab(id, "bad_words"));
  }
  for (int32_t id : s.allowed_token_ids) RETURN_IF_ERROR(in_vocab(id, "allowed_token_ids"));
  for (int32_t id : s.logprob_token_ids) RETURN_IF_ERROR(in_vocab(id, "logprob_token_ids"));
  return absl::OkStatus();
}

absl::Status Engine::AddRequest(RequestInput input) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  RETURN_IF_ERROR(Validate(input));
  auto req = std::make_unique<Request>();
  if (input.constraint) {
    ASSIGN_OR_RETURN(req->constraint, constraints_->Compile(*input.constraint));
  }
  ASSIGN_OR_RETURN(req->extra_key, ExtraKey(input.cache_salt));
  req->input = std::move(input);
  req->arrival = next_arrival_++;
  if (req->input.sampling.top_k == -1) req->input.sampling.top_k = 0;
  for (std::optional<int>* top :
       {&req->input.sampling.logprobs, &req->input.sampling.prompt_logprobs}) {
    if (*top == -1) *top = model_config_.vocab_size;  // vLLM's -1: every id
  }
  OrderAdjustmentLists(req->input.sampling);
  uint64_t seed = 0;
  if (req->input.sampling.seed) {
    seed = *req->input.sampling.seed;
  } else {
    seed = config_.seed ? seeds_() : std::random_device{}();
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = next_seq_id_++;
  seq->request = req.get();
  seq->tokens = req->input.prompt;
  seq->num_prompt_tokens = static_cast<int>(seq->tokens.size());
  seq->rng_seed = static_cast<int64_t>(seed);
  if (req->constraint != nullptr) {
    seq->constraint_state = req->constraint->matcher.start();
    seq->allowed_mask = constraints_->Cached(*req->constraint, seq->constraint_state);
    seq->mask_pending = seq->allowed_mask == nullptr;  // computed during its first step
  }
  UpdateHashes(*seq);
  scheduler_->Add(seq.get());
  req->sequences.push_back(std::move(seq));
  const std::string id = req->input.request_id;
  requests_.emplace(id, std::move(req));
  return absl::OkStatus();
}

absl::Status Engine::Abort(const std::string& request_id) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // the step in flight may name it
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no request '", request_id, "' in flight"));
  }
  // An aborted request says nothing more, including what the settled step drew for it.
  std::erase_if(settled_, [&](const SequenceOutput& o) { return o.request_id == request_id; });
  for (auto& seq : it->second->sequences) {
    if (seq->status != SeqStatus::kFinished) scheduler_->Remove(seq.get());
  }
  requests_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::string> Engine::ExtraKey(const std::string& cache_salt) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const CacheKey key{config_.model_id,
                     kv_spec_.CacheKeyDType(),
                     kv_spec_.CacheKeyQuant(),
                     static_cast<uint32_t>(config_.cache.block_size),
                     static_cast<uint32_t>(config_.parallel.tensor_parallel_size),
                     cache_salt};
  return key.Serialize();
}

void Engine::UpdateHashes(Sequence& seq) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const int bs = config_.cache.block_size;
  while (static_cast<int>(seq.block_hashes.size() + 1) * bs <= seq.num_tokens()) {
    const size_t i = seq.block_hashes.size();
    std::vector<uint32_t> block(seq.tokens.begin() + i * bs, seq.tokens.begin() + (i + 1) * bs);
    seq.block_hashes.push_back(
        HashBlock(i == 0 ? nullptr : &seq.block_hashes.back(), block, seq.request->extra_key));
  }
}

EngineStats Engine::stats() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  EngineStats s = counters_;
  const Constraints::Counters& cc = constraints_->counters();
  s.constraints_compiled = cc.compiled;
  s.constraints_reused = cc.reused;
  s.constraint_masks_walked = cc.masks_walked;
  s.constraint_masks_reused = cc.masks_reused;
  s.constraint_mask_seconds = cc.mask_seconds;
  const Scheduler::Counters& c = scheduler_->counters();
  s.prefix_queried_tokens = c.prefix_queried_tokens;
  s.prefix_hit_tokens = c.prefix_hit_tokens;
  s.preemptions = c.preemptions;
  s.swap_preemptions = c.swap_preemptions;
  s.recompute_preemptions = c.recompute_preemptions;
  const KvCacheCounters& k = kv_->counters();
  const int64_t block_bytes = pools_.block_bytes;
  const int block_size = config_.cache.block_size;
  s.kv_bytes_per_block = block_bytes;
  s.prefix_hit_tokens_device = k.device_hit_blocks * block_size;
  s.prefix_hit_tokens_host = k.host_hit_blocks * block_size;
  s.swap_out_blocks = k.swap_out_blocks;
  s.swap_in_blocks = k.swap_in_blocks;
  s.swap_out_bytes = k.swap_out_blocks * block_bytes;
  s.swap_in_bytes = k.swap_in_blocks * block_bytes;
  s.host_spilled_blocks = k.host_spilled_blocks;
  if (const BlockPool* host = kv_->host_pool()) {
    s.host_blocks_total = host->num_blocks();
    s.host_blocks_free = host->num_free();
    s.host_blocks_cached_evictable = host->num_cached_evictable();
  }
  s.evictions = kv_->pool().num_evictions();
  s.num_running = scheduler_->num_running();
  s.num_waiting = scheduler_->num_waiting();
  s.num_swapped = scheduler_->num_swapped();
  s.num_requests = static_cast<int>(requests_.size());
  s.blocks_total = kv_->pool().num_blocks();
  s.blocks_free = kv_->pool().num_free();
  s.blocks_cached_evictable = kv_->pool().num_cached_evictable();
  return s;
}

Engine::Load Engine::load() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Load l;
  const int bs = config_.cache.block_size;
  for (const auto& [id, r] : requests_) {
    const RequestInput& in = r->input;
    ++l.requests;
    l.reserved_blocks += (static_cast<int64_t>(in.prompt.size()) + in.max_tokens + bs - 1) / bs;
    for (const std::unique_ptr<Sequence>& seq : r->sequences) {
      if (seq->status == SeqStatus::kFinished) continue;
      if (seq->status != SeqStatus::kRunning) ++l.waiting;
      if (seq->prefill_done()) {
        ++l.decode_seqs;
        continue;
      }
      const bool untouched = r->num_cached_prompt_tokens < 0 && seq->num_computed_tokens == 0;
      const int done = untouched ? std::clamp(in.predicted_cached_tokens, 0, seq->num_prompt_tokens)
                                 : seq->num_computed_tokens;
      l.prefill_tokens += seq->num_prompt_tokens - done;
    }
  }
  return l;
}

int64_t Engine::computed_tokens() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  return counters_.computed_tokens;
}

int64_t Engine::computed_prompt_tokens() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  return counters_.computed_prompt_tokens;
}

Engine::KvUsage Engine::kv_usage() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  KvUsage u;
  absl::flat_hash_map<int, int> filled;  // device block -> tokens in it
  for (const auto& [id, req] : requests_) {
    for (const auto& seq : req->sequences) {
      if (seq->status != SeqStatus::kRunning) continue;
      for (size_t i = 0; i < seq->block_table.size(); ++i) {
        const int tokens = std::clamp<int>(
            seq->num_computed_tokens - static_cast<int>(i) * config_.cache.block_size, 0,
            config_.cache.block_size);
        int& f = filled[seq->block_table[i]];
        f = std::max(f, tokens);
      }
    }
  }
  u.allocated_slots = static_cast<int64_t>(filled.size()) * config_.cache.block_size;
  for (const auto& [block, tokens] : filled) u.used_tokens += tokens;
  return u;
}

void Engine::ForEachCachedBlock(const std::function<void(const BlockHash&, Medium)>& fn) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  kv_->pool().ForEachCached([&](const BlockHash& h) { fn(h, Medium::kDevice); });
  if (const BlockPool* host = kv_->host_pool()) {
    host->ForEachCached([&](const BlockHash& h) { fn(h, Medium::kHost); });
  }
}

std::vector<std::string> Engine::AbortAll() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  settled_.clear();
  std::vector<std::string> ids;
  for (const auto& [id, req] : requests_) ids.push_back(id);
  for (const std::string& id : ids) Abort(id).IgnoreError();
  return ids;
}

bool Engine::Started(const std::string& request_id) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return true;
  return it->second->sequences[0]->status != SeqStatus::kWaiting ||
         it->second->sequences[0]->num_computed_tokens > 0;
}

absl::Status Engine::TEST_CheckInvariants() const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  std::vector<const Sequence*> live;
  for (const auto& [id, req] : requests_) {
    for (const auto& seq : req->sequences) {
      if (seq->status != SeqStatus::kFinished) live.push_back(seq.get());
      if (seq->status == SeqStatus::kWaiting && !seq->block_table.empty()) {
        return absl::InternalError(absl::StrCat("waiting seq ", seq->id, " holds blocks"));
      }
    }
  }
  if (static_cast<int>(live.size()) !=
      scheduler_->num_running() + scheduler_->num_waiting() + scheduler_->num_swapped()) {
    return absl::InternalError("scheduler queues and live sequences disagree");
  }
  return kv_->CheckInvariants(live);
}

absl::StatusOr<std::vector<BlockHash>> Engine::PromptHashes(absl::Span<const int32_t> prompt,
                                                            const std::string& cache_salt) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  ASSIGN_OR_RETURN(std::string key, ExtraKey(cache_salt));
  const size_t bs = config_.cache.block_size;
  std::vector<BlockHash> out;
  for (size_t i = 0; (i + 1) * bs <= prompt.size(); ++i) {
    std::vector<uint32_t> block(prompt.begin() + i * bs, prompt.begin() + (i + 1) * bs);
    out.push_back(HashBlock(i == 0 ? nullptr : &out.back(), block, key));
  }
  return out;
}

absl::StatusOr<Engine::PrefixChunk> Engine::ExportPrefix(absl::Span<const int32_t> prompt,
                                                         const std::string& cache_salt,
                                                         int first_block, int max_blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  std::optional<PrefixChunk> out;
  RETURN_IF_ERROR(
      ExportPrefixChunks(prompt, cache_salt, first_block, max_blocks, [&](PrefixChunk c) {
        out = std::move(c);
        return false;
      }));
  return *std::move(out);
}

absl::Status Engine::SendStagedPrefix(absl::Span<const std::unique_ptr<kernels::PeerLink>> links) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();  // no step in flight (async scheduling): it sees what the steps left
  RETURN_IF_ERROR(StartSendStagedPrefix(links));
  while (true) {
    ASSIGN_OR_RETURN(const bool done, kernels::PollSends(links));
    if (done) return absl::OkStatus();
    absl::SleepFor(absl::Microseconds(50));
  }
}

int Engine::CachedRun(absl::Span<const int32_t> prompt, const std::string& cache_salt,
                      int first_block) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  absl::StatusOr<std::vector<BlockHash>> all = PromptHashes(prompt, cache_salt);
  return all.ok() ? CachedRun(*all, first_block) : 0;
}

// The KV transfer: the PrefixTransfer part's, once no step is in flight (async scheduling),
// so that it sees what the steps left.
int64_t Engine::KvWireBlockBytes() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  return transfer_->WireBytesPerBlock();
}

absl::Status Engine::ExportPrefixChunks(absl::Span<const int32_t> prompt,
                                        const std::string& cache_salt, int first_block,
                                        int blocks_per_chunk,
                                        const std::function<bool(PrefixChunk)>& each) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->ExportChunks(prompt, cache_salt, first_block, blocks_per_chunk, each);
}

absl::StatusOr<int> Engine::ImportPrefix(absl::Span<const int32_t> prompt,
                                         const std::string& cache_salt,
                                         absl::Span<const std::string> wires, int first_block) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->Import(prompt, cache_salt, wires, first_block);
}

absl::StatusOr<Engine::PrefixChunk> Engine::StagePrefixForLink(absl::Span<const int32_t> prompt,
                                                               const std::string& cache_salt,
                                                               int first_block, int max_blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->StageForLink(prompt, cache_salt, first_block, max_blocks);
}

absl::Status Engine::StartSendStagedPrefix(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->StartSendStaged(links);
}

absl::StatusOr<int> Engine::ReceivePrefixFromLink(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links, absl::Span<const int32_t> prompt,
    const std::string& cache_salt, absl::Span<const std::string> headers, int first_block) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->ReceiveFromLink(links, prompt, cache_salt, headers, first_block);
}

int Engine::CachedRun(absl::Span<const BlockHash> hashes, int first_block) const {
  KVSERVE_CHECK_THREAD(engine_thread_);
  return transfer_->CachedRun(hashes, first_block);
}

absl::StatusOr<int> Engine::AdoptPrefix(absl::Span<const int32_t> prompt,
                                        const std::string& cache_salt, int first_block,
                                        int blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return transfer_->Adopt(prompt, cache_salt, first_block, blocks);
}

// Layer streaming: the LayerStreamer part's, once no step is in flight (async scheduling).
absl::Status Engine::StreamPrefill(const std::string& request_id, int first_block,
                                   absl::Span<const std::unique_ptr<kernels::PeerLink>> links,
                                   std::function<void(const StreamStep&)> on_step) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return streamer_->StartStream(request_id, first_block, links, std::move(on_step));
}

absl::StatusOr<bool> Engine::PollLayerStreams() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return streamer_->Poll();
}

absl::Status Engine::StartStreamedReceive(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links, absl::Span<const int32_t> prompt,
    const std::string& cache_salt, int first_block, int num_blocks) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return streamer_->StartReceive(links, prompt, cache_salt, first_block, num_blocks);
}

absl::StatusOr<std::optional<int>> Engine::FinishStreamedReceive(
    absl::Span<const std::unique_ptr<kernels::PeerLink>> links,
    absl::Span<const uint64_t> fingerprints) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  return streamer_->FinishReceive(links, fingerprints);
}

void Engine::DropLinkStreams(const kernels::PeerLink* link0) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Settle();
  streamer_->DropLink(link0);
}

}  // namespace kvserve::worker
