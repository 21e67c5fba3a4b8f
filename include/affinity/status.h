// Errors as values at library boundaries. A Status carries a message that names
// the file, tensor or field at fault; library code never exits the process.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace aff {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // caller passed something malformed (flag, request field)
  kNotFound,         // a file or tensor that must exist does not
  kCorrupt,          // a file exists but its bytes contradict its own header
  kUnsupported,      // recognised but not (yet) supported, e.g. V4.1 checkpoints
  kIoError,          // the OS refused (open, mmap, read)
  kOutOfRange,       // a size or index beyond what the model/context allows
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("loading model dir X: ") while keeping the code.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {StatusCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Result<T>: a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(implicit)

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace aff

// Propagate a non-ok Status from an expression returning Status.
#define AFF_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::aff::Status aff_status_ = (expr);        \
    if (!aff_status_.is_ok()) return aff_status_; \
  } while (0)

#define AFF_CONCAT_INNER_(a, b) a##b
#define AFF_CONCAT_(a, b) AFF_CONCAT_INNER_(a, b)
// Declare `lhs` from a Result<T> expression or return its Status.
#define AFF_ASSIGN_OR_RETURN(lhs, expr)                                  \
  auto AFF_CONCAT_(aff_result_, __LINE__) = (expr);                      \
  if (!AFF_CONCAT_(aff_result_, __LINE__).is_ok())                       \
    return AFF_CONCAT_(aff_result_, __LINE__).status();                  \
  lhs = std::move(AFF_CONCAT_(aff_result_, __LINE__)).value()
