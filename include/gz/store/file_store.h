// Store in one shared file: works across processes on one machine and on shared filesystems.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "gz/store/store.h"

namespace gz {

/// @brief Store kept as an append-only log of set/delete records in one file, guarded with
/// flock(). Every instance replays the records it has not seen yet; wait() polls with backoff.
/// Use a fresh file per job (the file is never truncated by the store).
class FileStore : public Store {
 public:
  /// @brief Open (creating if needed) the log at `path`.
  explicit FileStore(std::string path);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Deadline deadline) override;
  int64_t add(const std::string& key, int64_t delta) override;
  int64_t append(const std::string& key, const Bytes& value) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Deadline deadline) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  using Store::get;
  using Store::wait;
  const std::string& path() const { return path_; }

 private:
  class Lock;
  void refresh();  // replay new records; caller holds mu_ and a file lock
  void append_set(const std::string& key, const std::string& value);
  void append_delete(const std::string& key);
  void append(const std::string& record);

  std::string path_;
  int fd_ = -1;
  std::mutex mu_;  // flock() does not exclude threads sharing this descriptor
  std::map<std::string, std::string> data_;
  uint64_t offset_ = 0;  // bytes of the log already replayed into data_
  uint64_t inode_ = 0;
};

}  // namespace gz
