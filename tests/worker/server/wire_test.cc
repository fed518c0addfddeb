// The worker's one reading of a GenerateRequest (worker/server/wire.h). The main test
// walks the wire schema itself: every field of GenerateRequest and of the messages in it, set
// alone to a value unlike the base request's, must change what reaches the engine (or the
// server's reply state), or be refused naming it. A field added to kvserve.proto and not read
// by RequestFromWire fails here, naming the field, with no edit to this test.
#include "worker/server/wire.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/testing/status_matchers.h"
#include "worker/server/kv_event_batch.h"

namespace kvserve::worker {
namespace {

namespace pb = kvserve::v1;
namespace gp = google::protobuf;

pb::GenerateRequest Base() {
  pb::GenerateRequest r;
  r.set_request_id("r1");
  r.add_prompt_token_ids(1);
  r.add_prompt_token_ids(2);
  r.set_max_tokens(4);
  r.mutable_sampling()->set_temperature(1.0f);
  return r;
}

// Everything RequestFromWire produces, as text.
std::string Describe(const WireRequest& w) {
  const RequestInput& in = w.input;
  const SamplingParams& s = in.sampling;
  std::vector<std::string> bias, bad;
  for (const auto& [id, b] : s.logit_bias) bias.push_back(absl::StrCat(id, ":", b));
  for (const auto& word : s.bad_words) bad.push_back(absl::StrJoin(word, " "));
  return absl::StrCat(
      "id=", in.request_id, " prompt=", absl::StrJoin(in.prompt, ","), " max=", in.max_tokens,
      " stops=", absl::StrJoin(in.stop_token_ids, ","), " prio=", in.priority,
      " salt=", in.cache_salt, " prompt_logits=", in.return_prompt_logits,
      " constraint=", in.constraint ? in.constraint->Key() : "-", " temp=", s.temperature,
      " top_p=", s.top_p, " top_k=", s.top_k, " min_p=", s.min_p,
      " seed=", s.seed ? absl::StrCat(*s.seed) : "-",
      " logprobs=", s.logprobs ? absl::StrCat(*s.logprobs) : "-", " ignore_eos=", s.ignore_eos,
      " n=", s.n, " presence=", s.presence_penalty, " frequency=", s.frequency_penalty,
      " repetition=", s.repetition_penalty, " min_tokens=", s.min_tokens,
      " bias=", absl::StrJoin(bias, ","), " bad=", absl::StrJoin(bad, "|"),
      " allowed=", absl::StrJoin(s.allowed_token_ids, ","),
      " prompt_logprobs=", s.prompt_logprobs ? absl::StrCat(*s.prompt_logprobs) : "-",
      " given=", absl::StrJoin(s.logprob_token_ids, ","), " stream=", w.stream,
      " predicted=", w.predicted_cached_tokens, " router=", w.router_id,
      " placement=", w.placement);
}

// Sets `f` of `m` to a value unlike its present one: numbers + 2, booleans flipped, strings
// and repeated fields one more element, messages (and map entries) each of their fields changed.
void Change(gp::Message* m, const gp::FieldDescriptor* f);

void ChangeEveryField(gp::Message* m) {
  const gp::Descriptor* d = m->GetDescriptor();
  ASSERT_GT(d->field_count(), 0) << d->full_name();
  for (int i = 0; i < d->field_count(); ++i) Change(m, d->field(i));
}

void Change(gp::Message* m, const gp::FieldDescriptor* f) {
  const gp::Reflection* r = m->GetReflection();
  using F = gp::FieldDescriptor;
  if (f->is_repeated()) {
    switch (f->cpp_type()) {
      case F::CPPTYPE_INT32:
        r->AddInt32(m, f, 7);
        return;
      case F::CPPTYPE_STRING:
        r->AddString(m, f, "w");
        return;
      case F::CPPTYPE_MESSAGE:
        ChangeEveryField(r->AddMessage(m, f));
        return;
      default:
        FAIL() << f->full_name() << ": a repeated type this test does not set";
    }
  }
  switch (f->cpp_type()) {
    case F::CPPTYPE_INT32:
      r->SetInt32(m, f, r->GetInt32(*m, f) + 2);
      return;
    case F::CPPTYPE_INT64:
      r->SetInt64(m, f, r->GetInt64(*m, f) + 2);
      return;
    case F::CPPTYPE_UINT32:
      r->SetUInt32(m, f, r->GetUInt32(*m, f) + 2);
      return;
    case F::CPPTYPE_UINT64:
      r->SetUInt64(m, f, r->GetUInt64(*m, f) + 2);
      return;
    case F::CPPTYPE_FLOAT:
      r->SetFloat(m, f, r->GetFloat(*m, f) + 0.25f);
      return;
    case F::CPPTYPE_DOUBLE:
      r->SetDouble(m, f, r->GetDouble(*m, f) + 0.25);
      return;
    case F::CPPTYPE_BOOL:
      r->SetBool(m, f, !r->GetBool(*m, f));
      return;
    case F::CPPTYPE_ENUM:
      r->SetEnumValue(m, f, r->GetEnumValue(*m, f) + 1);
      return;
    case F::CPPTYPE_STRING:
      r->SetString(m, f, r->GetString(*m, f) + "x");
      return;
    case F::CPPTYPE_MESSAGE:
      ChangeEveryField(r->MutableMessage(m, f));
      return;
  }
}

// Every leaf field under `d`, as the path of fields to it from GenerateRequest.
void Leaves(const gp::Descriptor* d, std::vector<const gp::FieldDescriptor*> path,
            std::vector<std::vector<const gp::FieldDescriptor*>>& out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const gp::FieldDescriptor* f = d->field(i);
    path.push_back(f);
    const bool nested = f->cpp_type() == gp::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_map() &&
                        !f->is_repeated() && f->message_type()->field_count() > 0;
    if (nested) {
      Leaves(f->message_type(), path, out);
    } else {
      out.push_back(path);
    }
    path.pop_back();
  }
}

std::string PathName(const std::vector<const gp::FieldDescriptor*>& path) {
  std::vector<std::string> names;
  for (const gp::FieldDescriptor* f : path) names.push_back(f->name());
  return absl::StrJoin(names, ".");
}

TEST(WireTest, EveryFieldOfTheMessageReachesTheEngineOrIsRefused) {
  std::vector<std::vector<const gp::FieldDescriptor*>> leaves;
  Leaves(pb::GenerateRequest::descriptor(), {}, leaves);
  ASSERT_GT(leaves.size(), 25u);  // the walk found the nested messages' fields
  for (const auto& path : leaves) {
    // A reasoning block means something only before a constraint: give both sides one.
    pb::GenerateRequest before = Base();
    for (const gp::FieldDescriptor* f : path) {
      if (f->name() == "reasoning") before.mutable_sampling()->mutable_constraint()->set_regex("a");
    }
    ASSERT_OK_AND_ASSIGN(const WireRequest unchanged, RequestFromWire(before));
    pb::GenerateRequest variant = before;
    gp::Message* m = &variant;
    for (size_t i = 0; i + 1 < path.size(); ++i) {
      m = m->GetReflection()->MutableMessage(m, path[i]);
    }
    Change(m, path.back());
    const std::string name = PathName(path);
    absl::StatusOr<WireRequest> got = RequestFromWire(variant);
    if (!got.ok()) {
      EXPECT_NE(got.status().message().find(path.back()->name()), std::string::npos)
          << name << ": refused without naming the field: " << got.status();
      continue;
    }
    EXPECT_NE(Describe(*got), Describe(unchanged))
        << name << ": set on the wire, lost before the engine";
  }
}

// The wire's zero values read as the engine's defaults, in this one place.
TEST(WireTest, ZeroValuesReadAsTheDefaults) {
  pb::GenerateRequest r = Base();
  ASSERT_OK_AND_ASSIGN(WireRequest w, RequestFromWire(r));
  EXPECT_EQ(w.input.sampling.top_p, 1.0f);
  EXPECT_EQ(w.input.sampling.n, 1);
  EXPECT_EQ(w.input.sampling.repetition_penalty, 1.0f);
  EXPECT_FALSE(w.input.sampling.seed.has_value());
  EXPECT_FALSE(w.input.sampling.logprobs.has_value());
  EXPECT_FALSE(w.input.constraint.has_value());
  r.mutable_sampling()->set_logprobs(0);  // present: only the sampled token's
  r.mutable_sampling()->mutable_constraint()->mutable_choice()->add_choices("yes");
  ASSERT_OK_AND_ASSIGN(w, RequestFromWire(r));
  EXPECT_EQ(w.input.sampling.logprobs, 0);
  ASSERT_TRUE(w.input.constraint.has_value());
  EXPECT_EQ(w.input.constraint->choices, std::vector<std::string>{"yes"});
}

// A newer router's field (unknown to this build) is refused, naming where it was, rather than
// served without it.
TEST(WireTest, FieldsThisBuildDoesNotKnowAreRefused) {
  pb::GenerateRequest r = Base();
  // Field 900 (varint 1) in sampling and 901 (bytes "x") at the top, as a newer router's
  // encoder writes them.
  const std::string sampling = r.sampling().SerializeAsString() + std::string("\xa0\x38\x01", 3);
  r.clear_sampling();
  std::string bytes = r.SerializeAsString();
  bytes += std::string("\x1a", 1) + static_cast<char>(sampling.size()) + sampling;  // field 3
  bytes += std::string("\xaa\x38\x01x", 4);
  // Through the bytes, as the worker receives it.
  pb::GenerateRequest received;
  ASSERT_TRUE(received.ParseFromString(bytes));
  ASSERT_EQ(received.sampling().temperature(), 1.0f);  // the known fields read as usual
  const absl::Status s = RequestFromWire(received).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("#901"), std::string::npos) << s;
  EXPECT_NE(s.message().find("sampling.#900"), std::string::npos) << s;
}

// A step's block changes travel as few events: consecutive changes of one kind on one medium
// share an event, in order; a change of kind or medium starts the next.
TEST(KvEventBatchTest, ConsecutiveSameChangesShareAnEventInOrder) {
  const BlockHash a{1, 0}, b{2, 0}, c{3, 0}, d{4, 0};
  gp::RepeatedPtrField<pb::KvEvent> events;
  AddBlockChange(events, a, true, pb::MEDIUM_DEVICE);
  AddBlockChange(events, b, true, pb::MEDIUM_DEVICE);
  AddBlockChange(events, c, true, pb::MEDIUM_HOST);
  AddBlockChange(events, a, false, pb::MEDIUM_DEVICE);
  AddBlockChange(events, d, false, pb::MEDIUM_DEVICE);
  AddBlockChange(events, d, true, pb::MEDIUM_DEVICE);
  ASSERT_EQ(events.size(), 4);
  EXPECT_EQ(events[0].stored().medium(), pb::MEDIUM_DEVICE);
  EXPECT_EQ(absl::StrJoin(events[0].stored().block_hashes(), ","),
            absl::StrCat(a.ToBytes(), ",", b.ToBytes()));
  EXPECT_EQ(events[1].stored().medium(), pb::MEDIUM_HOST);
  EXPECT_EQ(events[1].stored().block_hashes_size(), 1);
  ASSERT_TRUE(events[2].has_removed());
  EXPECT_EQ(absl::StrJoin(events[2].removed().block_hashes(), ","),
            absl::StrCat(a.ToBytes(), ",", d.ToBytes()));
  ASSERT_TRUE(events[3].has_stored());  // d stored again after its removal: a new event
  EXPECT_EQ(events[3].stored().block_hashes(0), d.ToBytes());
}

}  // namespace
}  // namespace kvserve::worker
