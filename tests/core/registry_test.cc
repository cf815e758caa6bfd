#include "core/registry.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>

using namespace starling;

namespace {

struct Shape {
  virtual ~Shape() = default;
  virtual double area() const = 0;
};
struct Square final : Shape {
  double side;
  explicit Square(double s) : side(s) {}
  double area() const override { return side * side; }
};
struct Circle final : Shape {
  double r;
  explicit Circle(double radius) : r(radius) {}
  double area() const override { return 3.0 * r * r; }
};

// Products take a run-time argument besides the options (as compressors do not, but optimizers
// taking a layout would).
using ShapeRegistry = Registry<Shape, double>;

ShapeRegistry shapes() {
  return ShapeRegistry("shape",
                       {
                           {"square", "a square", "side=1 (length)",
                            [](OptionReader& r, double scale) {
                              return std::make_unique<Square>(r.number("side", 1.0) * scale);
                            }},
                           {"circle", "a circle", "radius=1, exact=false",
                            [](OptionReader& r, double scale) {
                              const double radius = r.number("radius", 1.0);
                              (void)r.flag("exact", false);
                              return std::make_unique<Circle>(radius * scale);
                            }},
                           {"nothing", "a broken factory", "",
                            [](OptionReader&, double) { return std::unique_ptr<Shape>(); }},
                       });
}

}  // namespace

TEST_CASE("a registry makes products by spec, passing its arguments", "[core]") {
  const ShapeRegistry reg = shapes();
  CHECK(reg.what() == "shape");
  CHECK(reg.entries().size() == 3u);
  CHECK(reg.names() == "square, circle, nothing");
  CHECK(reg.make("square", 1.0)->area() == 1.0);
  CHECK(reg.make("square:side=3", 2.0)->area() == 36.0);
  CHECK(reg.make(Spec::parse("circle:radius=2,exact=true", "shape"), 1.0)->area() == 12.0);
  REQUIRE(reg.find("circle") != nullptr);
  CHECK(reg.find("circle")->summary == "a circle");
  CHECK(reg.find("hexagon") == nullptr);
  CHECK(&reg.entry("square") == reg.find("square"));
  const std::string help = reg.help();
  CHECK(help.find("\n  square: a square [side=1 (length)]") != std::string::npos);
  CHECK(help.find("\n  nothing: a broken factory") != std::string::npos);
  CHECK(help.find("nothing: a broken factory [") == std::string::npos);  // no options, no brackets
}

TEST_CASE("a registry's errors list what it accepts", "[core]") {
  const ShapeRegistry reg = shapes();
  CHECK_THROWS_AS(reg.make("hexagon", 1.0), ConfigError);
  CHECK_THROWS_WITH(reg.make("hexagon", 1.0),
                    Catch::Contains("unknown shape 'hexagon'") &&
                        Catch::Contains("(registered: square, circle, nothing)"));
  CHECK_THROWS_AS(reg.entry("hexagon"), ConfigError);
  CHECK_THROWS_AS(reg.make("square:colour=red", 1.0), ConfigError);
  CHECK_THROWS_WITH(
      reg.make("square:colour=red", 1.0),
      Catch::Contains("unknown option 'colour'") && Catch::Contains("(accepted: side=1 (length))"));
  CHECK_THROWS_WITH(reg.make("circle:radius=1,side=2", 1.0),
                    Catch::Contains("unknown option 'side'") &&
                        Catch::Contains("accepted: radius=1, exact=false"));
  CHECK_THROWS_WITH(reg.make("square:side=big", 1.0),
                    Catch::Contains("side") && Catch::Contains("not a finite number"));
  CHECK_THROWS_AS(reg.make("", 1.0), ConfigError);
  // A factory that returns nothing is a bug in the registering module.
  CHECK_THROWS_AS(reg.make("nothing", 1.0), InternalError);
}

TEST_CASE("a registry refuses a name registered twice", "[core]") {
  auto make = [](OptionReader&, double) -> std::unique_ptr<Shape> {
    return std::make_unique<Square>(1.0);
  };
  CHECK_THROWS_WITH(
      ShapeRegistry("shape", {{"a", "", "", make}, {"b", "", "", make}, {"a", "", "", make}}),
      Catch::Contains("shape 'a' registered twice"));
  CHECK_THROWS_AS(ShapeRegistry("shape", {{"a", "", "", make}, {"a", "", "", make}}),
                  InternalError);
  CHECK_NOTHROW(ShapeRegistry("shape", {{"a", "", "", make}, {"b", "", "", make}}));
}

TEST_CASE("text options keep a free-form value such as a path", "[core]") {
  const Spec s = Spec::parse("torchscript:path=/tmp/a:b=c.pt, input=flat", "model");
  OptionReader r(s, "model");
  CHECK(r.text("path", "") == "/tmp/a:b=c.pt");  // ':' and '=' after the key are part of the value
  CHECK(r.text("missing", "dflt") == "dflt");
  CHECK(r.choice("input", "image", {"image", "flat"}) == "flat");
  CHECK_NOTHROW(r.finish(""));
}
