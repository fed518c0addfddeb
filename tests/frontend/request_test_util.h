// Helpers of the router's request-parsing tests (tests/frontend/*_test.cc).
#ifndef KVSERVE_TESTS_FRONTEND_REQUEST_TEST_UTIL_H_
#define KVSERVE_TESTS_FRONTEND_REQUEST_TEST_UTIL_H_

#include "nlohmann/json.hpp"

namespace kvserve::frontend::testing {

// The smallest valid body: a chat request with one user message, or a completion of "x".
nlohmann::json MinimalBody(bool chat);

// MinimalBody with `extra` merged in parses (param null), or is a 400 whose param is `param`.
void ExpectParam(const nlohmann::json& extra, bool chat, const char* param);

}  // namespace kvserve::frontend::testing

#endif  // KVSERVE_TESTS_FRONTEND_REQUEST_TEST_UTIL_H_
