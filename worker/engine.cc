#include "worker/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
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
  if (s.logprobs && (*s.logprobs < 0 || *s.logprobs > 20)) {
    return absl::InvalidArgumentError("logprobs must be in [0, 20]");
  }
  if (s.prompt_logprobs && (*s.prompt_logprobs < 0 || *s.prompt_logprobs > 20)) {
    return absl::InvalidArgumentError("prompt_logprobs must be in [0, 20]");
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
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", t, " is outside the vocabulary"));
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
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no request '", request_id, "' in flight"));
  }
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

void Engine::AppendToken(Sequence& seq, int32_t token, const TokenLogprobs* logprobs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  seq.tokens.push_back(token);
  ++counters_.generated_tokens;
  if (logprobs != nullptr) seq.logprobs.push_back(*logprobs);
  UpdateHashes(seq);
}

void Engine::CheckStop(Sequence& seq) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  const RequestInput& in = seq.request->input;
  const int32_t token = seq.tokens.back();
  // Before min_tokens, EOS and the stop ids are banned from the draw and end nothing.
  const bool may_stop = seq.num_output_tokens() > in.sampling.min_tokens;
  if (may_stop && (std::find(in.stop_token_ids.begin(), in.stop_token_ids.end(), token) !=
                       in.stop_token_ids.end() ||
                   (!in.sampling.ignore_eos &&
                    std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()))) {
    seq.finish_reason = FinishReason::kStop;
    seq.stop_token = token;
  } else if (seq.request->constraint != nullptr && AdvanceConstraint(seq, token)) {
    seq.finish_reason = FinishReason::kStop;  // the constraint is complete: nothing may follow
  } else if (seq.num_output_tokens() >= in.max_tokens || seq.num_tokens() >= max_model_len_) {
    seq.finish_reason = FinishReason::kLength;
  }
}

bool Engine::AdvanceConstraint(Sequence& seq, int32_t token) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  CompiledConstraint& c = *seq.request->constraint;
  seq.constraint_state = constraints_->Advance(c, seq.constraint_state, token);
  // Only a token the mask allowed is drawn, so the state stays alive; a dead one (a stop id
  // outside the language, once min_tokens is reached) ends the sequence too.
  if (seq.constraint_state == structured::GrammarMatcher::kDead) return true;
  seq.allowed_mask = constraints_->Cached(c, seq.constraint_state);
  seq.mask_pending = seq.allowed_mask == nullptr;  // computed during the next step
  return !c.matcher.has_next(seq.constraint_state);
}

void Engine::Fork(Request& req, absl::Span<const int32_t> tokens, const TokenLogprobs* logprobs,
                  std::vector<Sequence*>& appended) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Sequence& first = *req.sequences[0];
  for (int i = 1; i < req.input.sampling.n; ++i) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->request = &req;
    child->sample_index = i;
    child->tokens = first.tokens;
    child->num_prompt_tokens = first.num_prompt_tokens;
    child->block_hashes = first.block_hashes;
    child->rng_seed = first.rng_seed + i;
    child->constraint_state = first.constraint_state;
    child->allowed_mask = first.allowed_mask;
    child->mask_pending = first.mask_pending;
    kv_->Fork(first, *child);
    scheduler_->AddRunning(child.get());
    req.sequences.push_back(std::move(child));
  }
  req.forked = true;
  for (size_t i = 0; i < req.sequences.size(); ++i) {
    AppendToken(*req.sequences[i], tokens[i], logprobs == nullptr ? nullptr : logprobs + i);
    appended.push_back(req.sequences[i].get());
  }
}

absl::StatusOr<std::vector<SequenceOutput>> Engine::Step() {
  KVSERVE_CHECK_THREAD(engine_thread_);
  std::vector<SequenceOutput> outs;
  RETURN_IF_ERROR(StepInto(outs));
  return outs;
}

absl::Status Engine::StepInto(std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  if (!profiling_) return RunStep(outs);
  const double cpu_start = ThreadCpuSeconds();
  PhaseClock wall;
  step_times_ = {};
  step_clock_.Lap();
  const int64_t steps_before = counters_.steps;
  const absl::Status status = RunStep(outs);
  const double wall_s = wall.Lap();
  if (counters_.steps > steps_before) {  // it ran a batch (UpdateFromOutput counts it)
    ++profile_.steps;
    for (size_t p = 0; p < profile_.seconds.s.size(); ++p) {
      profile_.seconds.s[p] += step_times_.s[p];
    }
    profile_.wall_seconds += wall_s;
    profile_.cpu_seconds += ThreadCpuSeconds() - cpu_start;
  }
  return status;
}

absl::Status Engine::RunStep(std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  outs.clear();
  if (!layer_streams_.empty()) {
    // A failed link ends its stream (the receiver fails its receive): never this step.
    if (absl::StatusOr<bool> s = PollLayerStreams(); !s.ok())
      LOG(WARNING) << "layer streaming: " << s.status();
  }
  Scheduler::Output chosen = scheduler_->Schedule();
  Mark(StepPhase::kSchedule);
  StepPlan plan = BuildStepPlan(std::move(chosen.scheduled), kv_->TakeCopies(),
                                config_.cache.block_size, eos_ids_);
  AttachMaskFill(plan);
  std::vector<StreamSend> sends = PlanStreamSends(plan);
  counters_.cow_copies += static_cast<int64_t>(plan.copies.device_to_device.size());
  if (plan.scheduled.empty() && plan.copies.empty()) return absl::OkStatus();
  plan.batch.time_phases = profiling_;
  Mark(StepPhase::kPlan);
  // With nothing scheduled, preemptions may still have planned swap-outs: the runner moves the
  // data and runs no batch.
  absl::StatusOr<ForwardOutput> out = runner_->Execute(plan.copies, plan.batch);
  kv_->FinishCopies();
  RETURN_IF_ERROR(out.status());
  if (!sends.empty()) FinishStreamSends(sends);
  Mark(StepPhase::kRunner);
  if (profiling_) {  // rank 0's model phases, out of the runner's time
    const ForwardTimes& t = out->times;
    step_times_[StepPhase::kInputs] += t.inputs;
    step_times_[StepPhase::kLaunch] += t.launch;
    step_times_[StepPhase::kDownload] += t.download;
    step_times_[StepPhase::kRunner] -= t.inputs + t.launch + t.download;
  }
  counters_.sim_busy_seconds += out->sim_seconds;
  if (plan.scheduled.empty()) return absl::OkStatus();
  UpdateFromOutput(plan, *out, outs);
  return absl::OkStatus();
}

void Engine::AttachMaskFill(StepPlan& plan) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  struct Late {
    int32_t offset;  // in mask_words
    Sequence* seq;
  };
  std::vector<Late> late;
  for (const kernels::LogitsAdjustment& a : plan.batch.adjustments) {
    Sequence* seq = plan.rows[a.row].seq;
    if (a.mask_begin >= 0 && seq->mask_pending) late.push_back({a.mask_begin, seq});
  }
  if (late.empty()) return;
  plan.batch.fill_masks = [this, late = std::move(late)](std::vector<uint32_t>& words) {
    KVSERVE_CHECK_THREAD(engine_thread_);  // rank 0 runs it, on the engine thread
    for (const Late& l : late) {
      Sequence& seq = *l.seq;
      seq.allowed_mask = constraints_->Mask(*seq.request->constraint, seq.constraint_state);
      seq.mask_pending = false;
      std::copy(seq.allowed_mask->words.begin(), seq.allowed_mask->words.end(),
                words.begin() + l.offset);
    }
  };
}

void Engine::UpdateFromOutput(const StepPlan& plan, const ForwardOutput& out,
                              std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  ++counters_.steps;
  counters_.graph_steps += out.graph ? 1 : 0;
  for (const auto& [seq, n] : plan.scheduled) {
    const int start = seq->num_computed_tokens;
    counters_.computed_tokens += n;
    counters_.computed_prompt_tokens +=
        std::max(0, std::min(start + n, seq->num_prompt_tokens) - start);
    seq->num_computed_tokens += n;
    kv_->CacheComputedBlocks(*seq);
  }
  Mark(StepPhase::kCacheCommit);
  appended_.clear();
  for (const RowUse& use : plan.rows) ApplyRow(use, out, appended_);
  Mark(StepPhase::kBookkeeping);
  for (Sequence* seq : appended_) CheckStop(*seq);
  Mark(StepPhase::kStopChecks);
  CollectOutputs(outs);
  Mark(StepPhase::kOutputs);
}

void Engine::ApplyRow(const RowUse& use, const ForwardOutput& out,
                      std::vector<Sequence*>& appended) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  Sequence& seq = *use.seq;
  Request& req = *seq.request;
  if (use.host_row >= 0) {  // a prompt position's logits, kept for the request's last output
    const int vocab = model_config_.vocab_size;
    const float* row = out.logits.data() + int64_t{use.host_row} * vocab;
    req.prompt_logits.resize(static_cast<size_t>(seq.num_prompt_tokens) * vocab);
    std::copy(row, row + vocab, req.prompt_logits.begin() + int64_t{use.position} * vocab);
  }
  if (use.prompt_logprobs >= 0 && !req.prompt_logprobs_sent) {  // kept for the first output
    req.prompt_logprobs.resize(seq.num_prompt_tokens - 1);
    req.prompt_logprobs[use.position] = out.logprobs[use.prompt_logprobs];
  }
  if (use.num_samples == 0) return;
  absl::Span<const int32_t> tokens(out.tokens.data() + use.first_sample, use.num_samples);
  const TokenLogprobs* logprobs =
      use.first_logprobs >= 0 ? out.logprobs.data() + use.first_logprobs : nullptr;
  std::vector<TokenLogprobs> with_given;  // the draws' logprobs with the given ids' in `top`
  if (logprobs != nullptr && use.given_logprobs >= 0) {
    with_given.assign(logprobs, logprobs + use.num_samples);
    const std::vector<int32_t>& ids = req.input.sampling.logprob_token_ids;
    for (TokenLogprobs& lp : with_given) {
      for (size_t i = 0; i < ids.size(); ++i) {
        lp.top.emplace_back(ids[i], out.logprobs[use.given_logprobs + i].logprob);
      }
    }
    logprobs = with_given.data();
  }
  if (use.num_samples > 1) {
    Fork(req, tokens, logprobs, appended);
  } else {
    req.forked = true;
    AppendToken(seq, tokens[0], logprobs);
    appended.push_back(&seq);
  }
}

void Engine::CollectOutputs(std::vector<SequenceOutput>& outs) {
  KVSERVE_CHECK_THREAD(engine_thread_);
  // Only a sequence that got a token this step has something to say (CheckStop alone ends
  // one), so the walk is over those, in the batch's order, while they are still in the cache.
  // Each output overwrites an element of `outs` whole (every field), reusing its memory.
  size_t n = 0;
  std::vector<const std::string*> done;
  for (Sequence* seq : appended_) {
    Request& req = *seq->request;
    const bool finishing = seq->finish_reason != FinishReason::kNone;
    if (n == outs.size()) outs.emplace_back();
    SequenceOutput& o = outs[n++];
    o.request_id.assign(req.input.request_id);
    o.sample_index = seq->sample_index;
    o.new_tokens.assign(seq->tokens.begin() + seq->num_prompt_tokens + seq->num_emitted,
                        seq->tokens.end());
    o.new_logprobs.clear();
    if (!seq->logprobs.empty()) {
      o.new_logprobs.assign(seq->logprobs.begin() + seq->num_emitted, seq->logprobs.end());
    }
    seq->num_emitted = seq->tokens.size() - seq->num_prompt_tokens;
    o.finish_reason = seq->finish_reason;
    o.stop_token = seq->stop_token;
    o.request_finished = false;
    o.num_prompt_tokens = seq->num_prompt_tokens;
    o.num_cached_prompt_tokens = std::max(0, req.num_cached_prompt_tokens);
    o.prompt_logits.clear();
    o.prompt_logprobs.clear();
    if (req.input.sampling.prompt_logprobs && !req.prompt_logprobs_sent) {
      o.prompt_logprobs = std::move(req.prompt_logprobs);
      req.prompt_logprobs_sent = true;
    }
    if (!finishing) continue;
    scheduler_->Remove(seq);
    seq->status = SeqStatus::kFinished;
    // The request ends with the output of its last sequence to finish.
    const bool all_finished =
        std::all_of(req.sequences.begin(), req.sequences.end(),
                    [](const auto& s) { return s->status == SeqStatus::kFinished; });
    if (req.forked && all_finished) {
      o.request_finished = true;
      o.prompt_logits = std::move(req.prompt_logits);
      done.push_back(&req.input.request_id);
    }
  }
  outs.resize(n);
  for (const std::string* id : done) requests_.erase(requests_.find(*id));  // *id dies here
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

}  // namespace kvserve::worker
