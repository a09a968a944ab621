// Debian 12's libgloo-dev (0.0~git20220518) ships gloo/transport/tcp/pair.h without the
// gloo/common/memory.h it includes. This stand-in declares just enough of Gloo's non-owning
// pointer templates to compile that header; it is searched after the system include directories
// (-idirafter), so a Gloo that ships its own header wins. We only call tcp::Pair's exported,
// out-of-line members through it and never touch a member whose layout these types decide.
#pragma once

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr {
 public:
  WeakNonOwningPtr() = default;
  explicit operator bool() const { return !ptr_.expired(); }

 private:
  std::weak_ptr<T> ptr_;
};

template <typename T>
class NonOwningPtr {
 public:
  NonOwningPtr() = default;
  explicit operator bool() const { return static_cast<bool>(ptr_); }

 private:
  std::shared_ptr<T> ptr_;
};

template <typename T>
class ShareableNonOwningPtr {
 private:
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo
