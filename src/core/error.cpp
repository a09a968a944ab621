#include "gz/core/error.h"

#include <cstring>

namespace gz {

SystemError::SystemError(const std::string& what, int err)
    : Error(what + ": " + std::strerror(err)), code_(err) {}

}  // namespace gz
