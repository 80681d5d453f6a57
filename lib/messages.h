// What the doors (the CLI's error line, Python's exceptions) do to a message before the user
// reads it.
#pragma once
#include <string>

namespace hl {

// nlohmann::json prefixes its messages with a tag ("[json.exception.type_error.302] type must be
// number, but is null"); a message that passes one on keeps the cause and drops the tag.
inline std::string without_json_tags(std::string m) {
  for (size_t at; (at = m.find("[json.exception.")) != std::string::npos;) {
    const size_t end = m.find("] ", at);
    if (end == std::string::npos) break;
    m.erase(at, end + 2 - at);
  }
  return m;
}

// A message quoting bytes of a file (a token of a vocabulary that is not UTF-8) is still text:
// each byte outside valid UTF-8 is written \xNN. Python cannot make a str of the raw bytes (its
// exception would say nothing) and a terminal shows them as garbage.
inline std::string as_valid_utf8(const std::string& m) {
  std::string out;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(m[i]); };
  for (size_t i = 0; i < m.size();) {
    const unsigned char c = byte(i);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 && c >= 0xc2 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e && c <= 0xf4 ? 4 : 0;
    for (size_t k = 1; k < n; ++k)
      if (i + k >= m.size() || (byte(i + k) >> 6) != 0x2) n = 0;
    if (n == 3 && ((c == 0xe0 && byte(i + 1) < 0xa0) || (c == 0xed && byte(i + 1) >= 0xa0))) n = 0;  // overlong, surrogate
    if (n == 4 && ((c == 0xf0 && byte(i + 1) < 0x90) || (c == 0xf4 && byte(i + 1) >= 0x90))) n = 0;  // overlong, > U+10FFFF
    if (n == 0) {
      static const char* hex = "0123456789abcdef";
      out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
      ++i;
    } else {
      out.append(m, i, n);
      i += n;
    }
  }
  return out;
}

// What the doors show of an error's message.
inline std::string user_message(const std::string& m) { return as_valid_utf8(without_json_tags(m)); }

}  // namespace hl
