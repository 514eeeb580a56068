// The visitor of a std::variant written as one lambda per alternative:
//   std::visit(Overloaded{[](const A& a) { ... }, [](const B& b) { ... }, [](const auto&) {}}, v);
#pragma once

namespace dltrain {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace dltrain
