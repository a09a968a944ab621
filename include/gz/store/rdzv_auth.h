// The rendezvous token: who may talk to the store. A store that listens beyond loopback requires
// one; these helpers make, read and check tokens and tell loopback from the rest.
#pragma once

#include <cstddef>
#include <string>

namespace gz {

/// @brief Longest token the store accepts (the hello frame before authentication is bounded by it).
constexpr size_t kMaxRdzvTokenBytes = 256;
/// @brief Tokens shorter than this are accepted but guessable; launchers warn about them.
constexpr size_t kMinStrongRdzvTokenBytes = 16;

/// @brief A fresh token: 32 bytes from the kernel's CSPRNG (getrandom), as 64 hex digits.
/// Throws gz::SystemError when no random bytes can be had.
std::string generate_rdzv_token();

/// @brief Read a token file: its first line, surrounding whitespace stripped. Throws
/// gz::InvalidArgument naming the file when it cannot be read, is empty or longer than
/// kMaxRdzvTokenBytes. `warning` (optional) is set when other users may read the file.
std::string read_rdzv_token_file(const std::string& path, std::string* warning = nullptr);

/// @brief Throws gz::InvalidArgument when `token` cannot be a token (too long, or a NUL/newline
/// in it). `what` names where it came from in the message.
void check_rdzv_token(const std::string& token, const std::string& what);

/// @brief Whether `host` is a loopback literal: "localhost", 127.0.0.0/8, "::1".
/// A host name that merely resolves to loopback counts as beyond loopback (the safe side).
bool is_loopback_host(const std::string& host);

/// @brief Byte-by-byte comparison whose time does not depend on where the tokens differ
/// (their lengths do leak).
bool tokens_equal(const std::string& a, const std::string& b);

}  // namespace gz
