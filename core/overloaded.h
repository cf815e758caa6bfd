#pragma once
// Overloaded{lambdas...}: one visitor from several lambdas, for std::visit over a variant.
namespace starling {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace starling
