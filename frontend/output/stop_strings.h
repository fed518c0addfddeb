// Stop strings matched on the detokenized text as it streams, across token boundaries (as
// OpenAI's `stop` and vLLM do): text that might still be the start of a stop string is held
// back, and on a match the output ends just before the stop string, which is not emitted.
//
//   StopStringMatcher stop({"\n\n", "###"});
//   StopStringMatcher::Result r = stop.Append(delta_text);   // r.emit to the client
//   if (r.stopped) abort the request on the worker;
//   ... at the end of the stream: client << stop.Flush();
//
// Input deltas must be whole UTF-8 characters (what IncrementalDetokenizer produces); held-back
// text then always starts on a character boundary. One instance per output stream.
#ifndef KVSERVE_FRONTEND_OUTPUT_STOP_STRINGS_H_
#define KVSERVE_FRONTEND_OUTPUT_STOP_STRINGS_H_

#include <string>
#include <string_view>
#include <vector>

namespace kvserve::frontend {

class StopStringMatcher {
 public:
  struct Result {
    std::string emit;  // text that is final
    bool stopped = false;
    std::string matched;  // the stop string that ended the stream
  };

  // Empty strings in `stops` are ignored.
  explicit StopStringMatcher(std::vector<std::string> stops);

  // `check` false: the text is final as it is, held-back text included, and no stop string
  // is looked for in it (before min_tokens).
  Result Append(std::string_view delta, bool check = true);
  // End of stream without a stop: the held-back text.
  std::string Flush();
  [[nodiscard]] bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_STOP_STRINGS_H_
