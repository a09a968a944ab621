// Relays workers' stdout/stderr to gzrun's console, one write() per line, prefixed "[rank] ".
#pragma once

#include <poll.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gz::launcher {

/// @brief Splits a byte stream into lines. '\n', '\r' and "\r\n" end a line (so progress bars
/// that redraw with '\r' still show); lines longer than max_line are cut into pieces.
class LineSplitter {
 public:
  using Emit = std::function<void(const std::string& line)>;
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line ? max_line : 1) {}
  /// @brief Feed bytes; emit() is called once per complete line, without its terminator.
  void feed(const char* data, size_t n, const Emit& emit);
  /// @brief Emit the unterminated tail, if any (the stream ended).
  void flush(const Emit& emit);
  bool has_partial() const { return !partial_.empty(); }

 private:
  size_t max_line_;
  std::string partial_;
  bool after_cr_ = false;  // a "\n" right after "\r" ends nothing new
};

/// @brief Which of a worker's streams a pipe carries.
enum class Stream { out, err };

/// @brief Owns the read ends of all workers' pipes and the per-rank log files; gzrun's poll loop
/// asks it for pollfds and hands readiness back. Single-threaded: gzrun is the only writer of
/// its console, so one write() per line keeps lines whole.
class OutputRelay {
 public:
  /// @brief console_out/console_err: where prefixed lines go (normally 1 and 2).
  OutputRelay(int console_out = 1, int console_err = 2);
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  /// @brief Take ownership of a pipe read end carrying `rank`'s stream (made non-blocking).
  void add_pipe(int rank, Stream stream, int fd);
  /// @brief Take ownership of a log file for `rank`: every line also goes there, unprefixed.
  void set_log(int rank, int fd);
  /// @brief Append pollfds for every open pipe.
  void append_pollfds(std::vector<pollfd>& fds) const;
  /// @brief Handle one pollfd result for a pipe (read once, relay lines, close on EOF).
  void on_ready(const pollfd& p);
  /// @brief Read whatever is buffered in every pipe without blocking, flush partial lines, close.
  void drain_all();
  /// @brief Number of pipes still open.
  size_t open_pipes() const { return pipes_.size(); }
  /// @brief Whether rank's pipes are all closed (EOF seen).
  bool rank_closed(int rank) const;
  /// @brief Close all pipes and log files (call between restart attempts).
  void reset();
  /// @brief Write a gzrun message line into every open log file (e.g. restart markers).
  void note_in_logs(const std::string& line);
  /// @brief Write a gzrun message line into `rank`'s log file (when it has one).
  void note_in_log(int rank, const std::string& line);
  /// @brief Live workers took new ranks (gzrun moved the job in place): their lines carry the
  /// new rank; each keeps its log file. Ranks missing from `new_rank` keep theirs.
  void relabel(const std::map<int, int>& new_rank);

 private:
  struct Pipe {
    int rank;
    Stream stream;
    LineSplitter splitter;
  };
  void emit_line(int rank, Stream stream, const std::string& line);
  /// @brief Returns false at EOF or on a read error.
  bool read_once(int fd, Pipe& p);
  void close_pipe(int fd);

  int console_out_;
  int console_err_;
  bool console_ok_[2] = {true, true};
  std::map<int, Pipe> pipes_;  // by fd
  std::map<int, int> logs_;    // rank -> fd
};

/// @brief write() all of `data` to fd, retrying on EINTR/EAGAIN (bounded). Returns false on error.
bool write_all(int fd, const char* data, size_t n);

/// @brief Print "gzrun: <message>" to stderr in one write.
void say(const std::string& message);

}  // namespace gz::launcher
