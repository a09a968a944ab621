#include <torch/torch.h>

#include "gz/train/callback.h"
#include "gz/train/trainer.h"

namespace gz::train {

// Every rank runs these (save_checkpoint is collective); only the main process writes.
void ModelCheckpoint::on_step_end(Trainer& t) {
  int64_t every = t.config().save_steps;
  if (every > 0 && t.state().step % every == 0 && last_saved_ != t.state().step) {
    t.save_checkpoint();
    last_saved_ = t.state().step;
  }
}

void ModelCheckpoint::on_epoch_end(Trainer& t) {
  if (t.config().save_steps == 0 && last_saved_ != t.state().step) {
    t.save_checkpoint();
    last_saved_ = t.state().step;
  }
}

void ModelCheckpoint::on_evaluate(Trainer&) {}

void ModelCheckpoint::on_train_end(Trainer& t) {
  if (last_saved_ != t.state().step) {
    t.save_checkpoint();
    last_saved_ = t.state().step;
  }
}

}  // namespace gz::train
