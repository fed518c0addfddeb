#include "common/tokenizer/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"

namespace kvserve::tokenizer {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<char*>(buf);
}

// One JIT stack per thread, grown on demand up to 8 MiB; long runs of one character class
// (whitespace, letters) need more than PCRE2's 32 KiB default.
pcre2_jit_stack* ThreadJitStack() {
  thread_local struct Holder {
    pcre2_jit_stack* stack = pcre2_jit_stack_create(64 << 10, 8 << 20, nullptr);
    ~Holder() { pcre2_jit_stack_free(stack); }
  } holder;
  return holder.stack;
}

}  // namespace

struct RegexSplitter::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

RegexSplitter::~RegexSplitter() = default;

absl::StatusOr<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(const std::string& pattern) {
  std::unique_ptr<RegexSplitter> splitter(new RegexSplitter());
  splitter->impl_ = std::make_unique<Impl>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  splitter->impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (splitter->impl_->code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pre-tokenizer regex does not compile at offset ", offset, ": ", Pcre2Message(error)));
  }
  splitter->impl_->jit = pcre2_jit_compile(splitter->impl_->code, PCRE2_JIT_COMPLETE) == 0;
  return splitter;
}

absl::Status RegexSplitter::Split(std::string_view text,
                                  absl::FunctionRef<void(std::string_view)> piece) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
  pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
  if (impl_->jit) pcre2_jit_stack_assign(ctx, nullptr, ThreadJitStack());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t emitted = 0;  // end of the last piece handed out
  absl::Status status;
  while (pos < text.size()) {
    int rc = impl_->jit
                 ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, md, ctx)
                 : pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = absl::InternalError(absl::StrCat("pre-tokenizer regex failed: ", Pcre2Message(rc)));
      break;
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t begin = ov[0], end = ov[1];
    if (begin > emitted) piece(text.substr(emitted, begin - emitted));
    if (end > begin) {
      piece(text.substr(begin, end - begin));
      emitted = end;
      pos = end;
    } else {
      // An empty match cannot make progress: step over one UTF-8 character.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xc0) == 0x80) ++pos;
    }
  }
  if (status.ok() && emitted < text.size()) piece(text.substr(emitted));
  pcre2_match_context_free(ctx);
  pcre2_match_data_free(md);
  return status;
}

}  // namespace kvserve::tokenizer
