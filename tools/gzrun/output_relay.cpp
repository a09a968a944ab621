#include "output_relay.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace gz::launcher {

void LineSplitter::feed(const char* data, size_t n, const Emit& emit) {
  for (size_t i = 0; i < n; ++i) {
    char c = data[i];
    if (c == '\n' || c == '\r') {
      bool crlf_tail = (c == '\n' && after_cr_);
      after_cr_ = (c == '\r');
      if (crlf_tail) continue;
      emit(partial_);
      partial_.clear();
      continue;
    }
    after_cr_ = false;
    // Copy the run of ordinary bytes in one go.
    size_t j = i;
    while (j < n && data[j] != '\n' && data[j] != '\r') ++j;
    size_t pos = i;
    while (pos < j) {
      size_t room = max_line_ - partial_.size();
      size_t take = std::min(room, j - pos);
      partial_.append(data + pos, take);
      pos += take;
      if (partial_.size() >= max_line_) {
        emit(partial_);
        partial_.clear();
      }
    }
    i = j - 1;
  }
}

void LineSplitter::flush(const Emit& emit) {
  if (!partial_.empty()) emit(partial_);
  partial_.clear();
  after_cr_ = false;
}

bool write_all(int fd, const char* data, size_t n) {
  int stalls = 0;
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      // A non-blocking console that is full: wait for it, but not forever (10 s in all).
      if (++stalls > 100) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
      continue;
    }
    return false;
  }
  return true;
}

void say(const std::string& message) {
  std::string line = "gzrun: " + message + "\n";
  write_all(2, line.data(), line.size());
}

OutputRelay::OutputRelay(int console_out, int console_err)
    : console_out_(console_out), console_err_(console_err) {}

OutputRelay::~OutputRelay() { reset(); }

void OutputRelay::add_pipe(int rank, Stream stream, int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  pipes_.emplace(fd, Pipe{rank, stream, LineSplitter()});
}

void OutputRelay::set_log(int rank, int fd) {
  auto it = logs_.find(rank);
  if (it != logs_.end()) ::close(it->second);
  logs_[rank] = fd;
}

void OutputRelay::append_pollfds(std::vector<pollfd>& fds) const {
  for (const auto& [fd, p] : pipes_) fds.push_back(pollfd{fd, POLLIN, 0});
}

void OutputRelay::emit_line(int rank, Stream stream, const std::string& line) {
  int idx = stream == Stream::out ? 0 : 1;
  if (console_ok_[idx]) {
    std::string out = "[" + std::to_string(rank) + "] ";
    out.reserve(out.size() + line.size() + 1);
    out += line;
    out += '\n';
    // gzrun is the console's only writer, so one write_all per line never interleaves.
    if (!write_all(idx == 0 ? console_out_ : console_err_, out.data(), out.size()))
      console_ok_[idx] = false;  // console gone (EPIPE): keep running, keep the logs
  }
  auto it = logs_.find(rank);
  if (it != logs_.end()) {
    std::string out = line + "\n";
    write_all(it->second, out.data(), out.size());
  }
}

bool OutputRelay::read_once(int fd, Pipe& p) {
  char buf[65536];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r > 0) {
      p.splitter.feed(buf, static_cast<size_t>(r),
                      [&](const std::string& line) { emit_line(p.rank, p.stream, line); });
      return true;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return true;
    return false;  // EOF or error
  }
}

void OutputRelay::close_pipe(int fd) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  Pipe& p = it->second;
  p.splitter.flush([&](const std::string& line) { emit_line(p.rank, p.stream, line); });
  ::close(fd);
  pipes_.erase(it);
}

void OutputRelay::on_ready(const pollfd& pfd) {
  auto it = pipes_.find(pfd.fd);
  if (it == pipes_.end() || pfd.revents == 0) return;
  if (pfd.revents & POLLIN) {
    if (!read_once(pfd.fd, it->second)) close_pipe(pfd.fd);
    return;
  }
  // POLLHUP/POLLERR without data: the writer is gone.
  if (!read_once(pfd.fd, it->second)) close_pipe(pfd.fd);
}

void OutputRelay::drain_all() {
  std::vector<int> fds;
  for (const auto& [fd, p] : pipes_) fds.push_back(fd);
  for (int fd : fds) {
    Pipe& p = pipes_.at(fd);
    // Bounded: a pipe buffer holds at most ~1 MiB; stop at EAGAIN or EOF.
    for (int k = 0; k < 64; ++k) {
      char buf[65536];
      ssize_t r = ::read(fd, buf, sizeof buf);
      if (r > 0) {
        p.splitter.feed(buf, static_cast<size_t>(r),
                        [&](const std::string& line) { emit_line(p.rank, p.stream, line); });
        continue;
      }
      if (r < 0 && errno == EINTR) continue;
      break;
    }
    close_pipe(fd);
  }
}

bool OutputRelay::rank_closed(int rank) const {
  for (const auto& [fd, p] : pipes_)
    if (p.rank == rank) return false;
  return true;
}

void OutputRelay::reset() {
  drain_all();
  for (auto& [rank, fd] : logs_) ::close(fd);
  logs_.clear();
}

void OutputRelay::note_in_logs(const std::string& line) {
  std::string out = line + "\n";
  for (auto& [rank, fd] : logs_) write_all(fd, out.data(), out.size());
}

void OutputRelay::relabel(const std::map<int, int>& new_rank) {
  auto mapped = [&](int r) {
    auto it = new_rank.find(r);
    return it == new_rank.end() ? r : it->second;
  };
  for (auto& [fd, p] : pipes_) p.rank = mapped(p.rank);
  // The moved ranks' files first: a rank left unmoved (its worker gone) yields its number.
  std::map<int, int> logs;
  for (auto& [rank, fd] : logs_)
    if (new_rank.count(rank)) logs[new_rank.at(rank)] = fd;
  for (auto& [rank, fd] : logs_)
    if (!new_rank.count(rank) && !logs.emplace(rank, fd).second) ::close(fd);
  logs_ = std::move(logs);
}

void OutputRelay::note_in_log(int rank, const std::string& line) {
  auto it = logs_.find(rank);
  if (it == logs_.end()) return;
  std::string out = line + "\n";
  write_all(it->second, out.data(), out.size());
}

}  // namespace gz::launcher
