#include <torch/torch.h>

#include <filesystem>

#include "gz/core/error.h"
#include "gz/train/callback.h"
#include "gz/train/trainer.h"

namespace gz::train {

namespace fs = std::filesystem;

void SampleLog::on_train_begin(Trainer& t) {
  const fs::path dir = fs::path(t.config().work_dir) / "samples";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SystemError("create directory " + dir.string(), ec.value());
  const fs::path file =
      dir / ("session-" + std::to_string(t.session_id()) + "-rank" + std::to_string(t.rank()) + ".txt");
  if (out_.is_open()) out_.close();  // a new session (in-place recovery) gets its own file
  out_.clear();
  out_.open(file, std::ios::trunc);
  if (!out_) throw SystemError("open " + file.string(), errno);
  const auto& s = t.state();
  out_ << "# session " << t.session_id() << " world " << t.world_size() << " rank " << t.rank()
       << " start_step " << s.step << " epoch " << s.epoch << " epoch_samples " << s.epoch_samples
       << " global_batch " << s.global_batch << "\n"
       << std::flush;
}

void SampleLog::on_step_begin(Trainer& t) {
  // Written before the step's gradients leave this rank, not after the step: a rank killed after
  // its peers' all-reduce completed (in its optimizer step, say) has trained on these samples as
  // far as the job is concerned, and its peers keep that step (their snapshot holds it). Logged
  // only at the end, its share would be missing from a step nobody redoes. A step that never
  // completes is redone by a later session, whose record is the one that counts.
  const auto& idx = t.step_samples();
  out_ << t.state().epoch << ' ' << t.state().step + 1 << ' ' << idx.size();
  for (size_t i : idx) out_ << ' ' << i;
  out_ << '\n' << std::flush;
}

void SampleLog::on_step_end(Trainer& t) {
  // The auditor counts as redone only steps some session completed (begun ones are lost work of
  // the fault, not a redo); a peer's "done" stands in for a rank killed before writing its own.
  out_ << "done " << t.state().step << '\n' << std::flush;
}

void SampleLog::on_train_end(Trainer&) { out_.flush(); }

}  // namespace gz::train
