// Store implementations behind one factory, so a suite can run over all of them.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "gz/store/etcd_store.h"
#include "gz/store/file_store.h"
#include "gz/store/mem_store.h"
#include "gz/store/prefix_store.h"
#include "gz/store/tcp_store.h"
#include "store/etcd_cluster.h"

namespace gz::test {

/// @brief A fresh temporary directory, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ = std::filesystem::temp_directory_path() /
            ("gz-store-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// @brief One store under test: `client()` opens another handle onto the same data (a new
/// connection for TCP, a new descriptor for files, the same object in memory).
struct StoreEnv {
  std::shared_ptr<TempDir> dir;
  std::shared_ptr<TcpStoreServer> server;
  std::function<std::shared_ptr<Store>()> client;
};

inline StoreEnv make_store_env(const std::string& kind) {
  StoreEnv e;
  if (kind == "mem") {
    auto s = std::make_shared<MemStore>();
    e.client = [s] { return s; };
  } else if (kind == "file") {
    e.dir = std::make_shared<TempDir>();
    std::string path = e.dir->file("store");
    e.client = [path] { return std::make_shared<FileStore>(path); };
  } else if (kind == "tcp") {
    TcpStoreServerOptions so;
    so.bind_addr = "127.0.0.1";
    e.server = std::make_shared<TcpStoreServer>(so);
    int port = e.server->port();
    e.client = [port] {
      TcpStoreOptions co;
      co.timeout = std::chrono::seconds(10);
      return std::make_shared<TcpStore>("127.0.0.1", port, co);
    };
  } else if (kind == "prefix_mem") {
    auto s = std::make_shared<MemStore>();
    e.client = [s] { return std::make_shared<PrefixStore>("job/7", s); };
  } else if (kind == "prefix_tcp") {
    TcpStoreServerOptions so;
    so.bind_addr = "127.0.0.1";
    e.server = std::make_shared<TcpStoreServer>(so);
    int port = e.server->port();
    e.client = [port] {
      TcpStoreOptions co;
      co.timeout = std::chrono::seconds(10);
      return std::make_shared<PrefixStore>("run/3", std::make_shared<TcpStore>("127.0.0.1", port, co));
    };
  } else if (kind == "etcd" || kind == "prefix_etcd") {
    // One etcd member for the whole process; each store under a fresh prefix of its own.
    if (test::etcd_binary().empty()) return e;  // the suite skips
    const EtcdStoreOptions o = shared_etcd().client_options();
    const bool prefixed = kind == "prefix_etcd";
    e.client = [o, prefixed]() -> std::shared_ptr<Store> {
      auto s = std::make_shared<EtcdStore>(o);
      if (prefixed) return std::make_shared<PrefixStore>("run/3", s);
      return s;
    };
  }
  return e;
}

}  // namespace gz::test
