// A worker that breaks the protocol, behind a real router front (HttpFront + RouterCore): more
// tokens than max_tokens, more logprob alternatives than asked, a sample index past n, a cached
// count past the prompt, an error code outside absl's range, a hang while draining, replies out
// of sequence, a link that breaks. The client gets what it asked for and a clean error, never the
// worker's excess or an endless wait.
#include <atomic>
#include <future>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/router/scripted_worker.h"

namespace kvserve::router {
namespace {

namespace pb = ::kvserve::v1;
using json = nlohmann::json;

using WorkerRepliesTest = ScriptedFrontTest;

TEST_F(WorkerRepliesTest, ExcessFromAWorkerNeverReachesTheClient) {
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out;
    for (int sample : {0, 7}) {  // 7: past n
      pb::GenerateResponse r;
      r.set_request_id(req.request_id());
      r.set_sample_index(sample);
      for (int t = 0; t < 50; ++t) {  // far past max_tokens
        r.add_token_ids(1000 + t);
        pb::PositionLogprobs* lp = r.add_logprobs();
        lp->mutable_sampled()->set_token_id(1000 + t);
        for (int k = 0; k < 30; ++k) lp->add_top()->set_token_id(2000 + k);  // past top 2
      }
      out.push_back(r);
    }
    pb::GenerateResponse last;
    last.set_request_id(req.request_id());
    last.set_finish_reason(pb::FINISH_REASON_LENGTH);
    last.mutable_usage()->set_cached_prompt_tokens(1 << 30);
    out.push_back(last);
    return out;
  });
  auto [status, body] =
      Post(front_->port(), "/v1/completions",
           {{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 4}, {"logprobs", 2}});
  ASSERT_EQ(status, 200) << body.dump();
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["usage"]["completion_tokens"], 4);
  const int prompt_tokens = body["usage"]["prompt_tokens"];
  EXPECT_LE(body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), prompt_tokens);
  const json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 4u);
  // The chosen token and at most the 2 most likely (OpenAI's legacy shape, vLLM's).
  for (size_t i = 0; i < lp["top_logprobs"].size(); ++i) {
    const json& top = lp["top_logprobs"][i];
    EXPECT_LE(top.size(), 3u);
    EXPECT_TRUE(top.contains(lp["tokens"][i].get<std::string>())) << top;
  }
}

TEST_F(WorkerRepliesTest, AnErrorCodeOutsideAbslsRangeIsAnInternalError) {
  Start([](const pb::GenerateRequest& req) {
    pb::GenerateResponse r;
    r.set_request_id(req.request_id());
    r.set_finish_reason(pb::FINISH_REASON_ERROR);
    r.mutable_error()->set_code(12345);
    r.mutable_error()->set_message("boom");
    return std::vector<pb::GenerateResponse>{r};
  });
  auto [status, body] = Post(front_->port(), "/v1/completions",
                             {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}});
  EXPECT_EQ(status, 500) << body.dump();
  EXPECT_NE(body["error"]["message"].get<std::string>().find("boom"), std::string::npos);
}

// Issue 26: the router trusted a draining worker whatever its heartbeat's age, so a worker that
// hung while draining left its requests waiting forever.
TEST_F(WorkerRepliesTest, AWorkerThatHangsWhileDrainingFailsItsRequests) {
  Start([](const pb::GenerateRequest& req) {
    pb::GenerateResponse r;  // one token, then nothing: the request stays in flight
    r.set_request_id(req.request_id());
    r.add_token_ids(1000);
    return std::vector<pb::GenerateResponse>{r};
  });
  auto job = std::make_shared<Job>();
  job->request.set_request_id("r1");
  job->request.add_prompt_token_ids(1);
  job->request.set_max_tokens(100);
  auto tokens = std::make_shared<std::atomic<int>>(0);
  auto failed = std::make_shared<std::promise<std::string>>();
  job->on_response = [tokens, failed](const pb::GenerateResponse& r) {
    *tokens += r.token_ids_size();
    if (r.finish_reason() == pb::FINISH_REASON_ERROR) failed->set_value(r.error().message());
  };
  std::future<std::string> error = failed->get_future();
  core_->Submit(job);
  for (int i = 0; i < 250 && *tokens == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(*tokens, 1);
  worker_->SetState(pb::WORKER_STATE_DRAINING);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the router sees it draining
  worker_->Freeze();
  // Ends within the heartbeat timeout plus a turn of the core; the wait is only a hang guard.
  ASSERT_EQ(error.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "the request hangs on a worker that stopped while draining";
  EXPECT_THAT(error.get(), ::testing::HasSubstr("stopped responding"));
}

// Issue 26: replies carried no sequence number, so a reply lost on the link was missing text
// or a request that never ended. A gap (or a repeat) now ends the request with a clear error,
// counted per worker.
TEST_F(WorkerRepliesTest, ARepliesGapEndsTheRequestWithAClearError) {
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out(2);
    for (pb::GenerateResponse& r : out) r.set_request_id(req.request_id());
    out[0].add_token_ids(1000);
    out[1].set_seq(req.prompt_token_ids_size() > 3 ? 1 : 3);  // a repeat of 1, or 2 missing
    out[1].set_finish_reason(pb::FINISH_REASON_LENGTH);
    out[1].mutable_usage()->set_prompt_tokens(1);
    return out;
  });
  for (const char* prompt : {"hi", "one two three four five six"}) {
    auto [status, body] = Post(front_->port(), "/v1/completions",
                               {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 2}});
    EXPECT_EQ(status, 503) << body.dump();
    EXPECT_THAT(body["error"]["message"].get<std::string>(), ::testing::HasSubstr("were lost"));
  }
  EXPECT_EQ(core_->reply_gaps(), 2);
  EXPECT_THAT(metrics_.Serialize(),
              ::testing::HasSubstr("kvserve_router_reply_gaps_total{worker=\"scripted\"} 2"));
}

// A framed link (--worker-link=tcp) that breaks loses what was sent on it (the worker aborts
// those requests): a request not yet started moves, here to the same worker over its DEALER, and
// completes; a started one fails with a clear error.
TEST_F(WorkerRepliesTest, ARequestOnALinkThatBreaksMovesOrFailsClearly) {
  router_options_.worker_links = true;
  worker_link_ = true;
  Start([](const pb::GenerateRequest& req) {
    std::vector<pb::GenerateResponse> out(req.max_tokens() == 1 ? 1 : 2);
    for (pb::GenerateResponse& r : out) {
      r.set_request_id(req.request_id());
      r.add_token_ids(1000);
    }
    out.back().set_finish_reason(pb::FINISH_REASON_LENGTH);
    out.back().mutable_usage()->set_prompt_tokens(req.prompt_token_ids_size());
    return out;
  });
  const auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 500 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] {  // linked: the placements go on the link
    return worker_->links() == 1 && core_->Workers()[0].eligible;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the router saw it connect
  worker_->Hold(true);
  const auto post = [&](int max_tokens) {
    return std::async(std::launch::async, [port = front_->port(), max_tokens] {
      return Post(port, "/v1/completions",
                  {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", max_tokens}});
    });
  };
  // Not started: its only reply is held.
  auto unstarted = post(1);
  ASSERT_TRUE(wait_for([&] { return worker_->held() == 1; }));
  worker_->DropLink();
  ASSERT_TRUE(wait_for([&] { return worker_->held() == 2; }))  // moved, on the DEALER
      << "held " << worker_->held();
  worker_->Hold(false);
  auto [status, body] = unstarted.get();
  EXPECT_EQ(status, 200) << body.dump();
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(wait_for([&] {
    return metrics_.Serialize().find(
               "kvserve_router_worker_links_lost_total{worker=\"scripted\"} 1") !=
           std::string::npos;
  }));

  // Started: its first token came before the link broke.
  ASSERT_TRUE(wait_for([&] { return worker_->links() == 2; }));  // a second later, linked again
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  worker_->Hold(true);
  auto started = post(2);
  ASSERT_TRUE(wait_for([&] { return worker_->held() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its first token at the router
  worker_->DropLink();
  auto [failed_status, failed] = started.get();
  EXPECT_EQ(failed_status, 503) << failed.dump();
  EXPECT_THAT(failed.dump(), ::testing::HasSubstr("link to the worker"));
  worker_->Hold(false);
}

}  // namespace
}  // namespace kvserve::router
