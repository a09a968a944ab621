// Stacking examples into batches.
#pragma once

#include <vector>

#include "gz/train/data/dataset.h"

namespace gz::train {

/// @brief Stack inputs along a new dim 0 and labels into int64 [N].
/// @throws gz::InvalidArgument when `examples` is empty or the inputs differ in shape or dtype.
Batch collate(const std::vector<Example>& examples);

}  // namespace gz::train
