#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include <torch/torch.h>

#include "gz/core/error.h"
#include "gz/train/callback.h"
#include "gz/train/tensorboard.h"
#include "gz/train/trainer.h"

namespace gz::train {

namespace fs = std::filesystem;

HistoryLogger::HistoryLogger(bool tensorboard) : tensorboard_(tensorboard) {}
HistoryLogger::~HistoryLogger() = default;

void HistoryLogger::on_train_begin(Trainer& t) {
  if (!t.is_main()) return;
  const auto path = fs::path(t.config().work_dir) / "history.jsonl";
  if (jsonl_.is_open()) jsonl_.close();  // train() began again (in-place recovery)
  jsonl_.clear();
  jsonl_.open(path, std::ios::app);
  if (!jsonl_) throw SystemError("open " + path.string(), errno);
  if (tensorboard_) tb_ = std::make_unique<TensorBoardWriter>((fs::path(t.config().work_dir) / "tb").string());
}

void HistoryLogger::write(const std::string& kind, Trainer& t, const std::map<std::string, double>& values) {
  // One JSON object per line; metric names are user text, so the library escapes them.
  nlohmann::json row = {{"kind", kind}, {"step", t.state().step}, {"epoch", t.state().epoch},
                        {"time", t.elapsed_seconds()}};
  for (auto& [k, v] : values) row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  jsonl_ << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n' << std::flush;
  if (tb_) {
    for (auto& [k, v] : values) tb_->add_scalar(kind + "/" + k, v, t.state().step);
    tb_->flush();
  }
}

void HistoryLogger::on_step_end(Trainer& t) {
  if (!t.is_main()) return;
  const auto& s = t.state();
  if (s.step % t.config().log_every == 0 || s.step == s.total_steps)
    write("train", t, {{"loss", s.loss}, {"lr", s.lr}});
}

void HistoryLogger::on_evaluate(Trainer& t) {
  if (!t.is_main()) return;
  write("eval", t, t.state().metrics);
}

void HistoryLogger::log(Trainer& t, const std::string& kind, const std::map<std::string, double>& values) {
  if (t.is_main() && jsonl_.is_open()) write(kind, t, values);
}

void HistoryLogger::on_train_end(Trainer& t) {
  if (!t.is_main()) return;
  jsonl_.flush();
  if (tb_) tb_->flush();
}

}  // namespace gz::train
