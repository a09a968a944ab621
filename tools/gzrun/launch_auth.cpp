#include "launch_auth.h"

#include <cstring>

#include "etcd_backend.h"
#include "gz/core/error.h"
#include "gz/store/rdzv_auth.h"

namespace gz::launcher {

bool store_beyond_loopback(const LaunchOptions& o) { return !is_loopback_host(o.master_addr); }

std::string store_bind_addr(const LaunchOptions& o) {
  if (store_beyond_loopback(o)) return "0.0.0.0";
  return o.master_addr == "localhost" ? "127.0.0.1" : o.master_addr;
}

namespace {

/// etcd: the token is the --rdzv-conf user's password (never generated: etcd must know it), and
/// the store's own rule decides what may travel where (gz/store/etcd_store.h).
LaunchAuth resolve_etcd_auth(const LaunchOptions& o, LaunchAuth a) {
  if (!a.token.empty() && o.etcd_user.empty()) {
    a.warnings.push_back(
        "the rendezvous token is not used: with --rdzv-backend etcd it is the password of the etcd "
        "user named by --rdzv-conf user=NAME");
    a.token.clear();
  }
  a.insecure = o.rdzv_insecure;
  if (!o.etcd_user.empty() && a.token.empty())
    GZ_THROW(InvalidArgument, "--rdzv-conf user=", o.etcd_user,
             " needs the user's etcd password: the rendezvous ",
             "token (--rdzv-token-file, GZ_RDZV_TOKEN or --rdzv-token)");
  for (auto& w : check_etcd_options(etcd_store_options(o, a.token, a.insecure))) a.warnings.push_back(w);
  return a;
}

}  // namespace

LaunchAuth resolve_launch_auth(const LaunchOptions& o, const std::string& env_token) {
  LaunchAuth a;
  const std::string where =
      o.master_addr + ":" + std::to_string(o.store_port() ? o.store_port() : o.master_port);
  if (!o.rdzv_token_file.empty()) {
    std::string warning;
    a.token = read_rdzv_token_file(o.rdzv_token_file, &warning);
    if (!warning.empty()) a.warnings.push_back(warning);
  } else if (!o.rdzv_token.empty()) {
    a.token = o.rdzv_token;
  } else if (!env_token.empty()) {
    check_rdzv_token(env_token, "GZ_RDZV_TOKEN");
    a.token = env_token;
  }
  if (o.etcd()) return resolve_etcd_auth(o, std::move(a));
  if (!a.token.empty()) {
    if (a.token.size() < kMinStrongRdzvTokenBytes)
      a.warnings.push_back("the rendezvous token has only " + std::to_string(a.token.size()) +
                           " characters and is easy to guess; use e.g. `openssl rand -hex 32`");
    if (o.rdzv_insecure) a.warnings.push_back("--rdzv-insecure is ignored: a rendezvous token is set");
    return a;
  }
  if (o.rdzv_insecure) {
    a.insecure = true;
    if (store_beyond_loopback(o))
      a.warnings.push_back("--rdzv-insecure: the rendezvous store (" + where +
                           ") admits anyone who can reach it, without a token; use it only on a network "
                           "where everyone who can reach that port is trusted");
    else if (o.nnodes > 1)
      a.warnings.push_back("--rdzv-insecure: the rendezvous store (" + where +
                           ") admits every local user of this machine, without a token");
    return a;
  }
  if (o.nnodes == 1) {
    a.token = generate_rdzv_token();
    a.generated = true;
    return a;
  }
  // Several nodes share the store, so none of them can make the token up. On loopback it is as
  // open as beyond it to everyone with a login on this machine: the same rule applies.
  const std::string nodes = o.elastic ? std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes)
                                      : std::to_string(o.nnodes);
  if (!store_beyond_loopback(o))
    GZ_THROW(InvalidArgument, "--nnodes ", nodes, " with the store at ", where,
             " (loopback: every local user can reach it) needs a rendezvous token shared by every "
             "gzrun of the job: create one (`openssl rand -hex 32 > token; chmod 600 token`) and pass "
             "--rdzv-token-file token to each, or export GZ_RDZV_TOKEN; --rdzv-insecure runs without "
             "one, on a machine whose users you trust completely");
  GZ_THROW(InvalidArgument, "--nnodes ", nodes, " with the store at ", where,
           " (reachable beyond loopback) needs a rendezvous token shared by every node: create one "
           "(`openssl rand -hex 32 > token; chmod 600 token`, copy it to every node) and pass "
           "--rdzv-token-file token, or export GZ_RDZV_TOKEN; --rdzv-insecure runs without one, "
           "on a network you trust completely");
}

void hide_token_args(int argc, char** argv, int program_index) {
  const int end = program_index > 0 && program_index <= argc ? program_index : argc;
  for (int i = 1; i < end; ++i) {
    char* a = argv[i];
    if (!std::strcmp(a, "--")) break;
    char* value = nullptr;
    if (!std::strcmp(a, "--rdzv-token") || !std::strcmp(a, "--rdzv_token")) {
      if (i + 1 < end) value = argv[++i];
    } else if (!std::strncmp(a, "--rdzv-token=", 13) || !std::strncmp(a, "--rdzv_token=", 13)) {
      value = a + 13;
    }
    if (value) std::memset(value, '*', std::strlen(value));
  }
}

int program_arg_index(int argc, const LaunchOptions& o) {
  return o.program.empty() ? argc : argc - 1 - static_cast<int>(o.args.size());
}

}  // namespace gz::launcher
