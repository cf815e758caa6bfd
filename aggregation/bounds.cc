#include "aggregation/bounds.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace starling::aggregation {

void ValidationBounds::validate() const {
  auto positive = [](const char* what, double v) {
    if (!(std::isfinite(v) && v > 0))
      STARLING_THROW(ConfigError, "validation bounds: ", what, " must be finite and > 0, got ", v);
  };
  positive("max_abs_value", max_abs_value);
  positive("max_update_norm", max_update_norm);
  positive("max_metric_abs", max_metric_abs);
  if (max_examples == 0)
    STARLING_THROW(ConfigError, "validation bounds: max_examples must be >= 1");
  if (max_partial_count == 0)
    STARLING_THROW(ConfigError, "validation bounds: max_partial_count must be >= 1");
  if (!(std::isfinite(max_partial_slack) && max_partial_slack >= 1 && max_partial_slack <= 1e6))
    STARLING_THROW(ConfigError, "validation bounds: max_partial_slack must be in [1, 1e6], got ",
                   max_partial_slack);
  // Each weighted term is at most max_examples * max_abs_value; float sums of ~1e8 of them must
  // stay below FLT_MAX (3.4e38).
  const double term = static_cast<double>(max_examples) * max_abs_value;
  if (term > 1e30)
    STARLING_THROW(ConfigError, "validation bounds: max_examples * max_abs_value = ", term,
                   " exceeds 1e30; sums of such terms could overflow float");
  if (static_cast<double>(max_examples) * max_metric_abs > 1e30)
    STARLING_THROW(ConfigError, "validation bounds: max_examples * max_metric_abs exceeds 1e30");
  // A QSGD payload's norm (and an update's norm in general) is bounded by max_update_norm, not by
  // max_abs_value, and the server multiplies it by the weight: with every level 0 no decoded value
  // is large, yet weight * norm once overflowed float and 0 * inf made the partial NaN.
  if (static_cast<double>(max_examples) * max_update_norm > 1e30)
    STARLING_THROW(ConfigError, "validation bounds: max_examples * max_update_norm = ",
                   static_cast<double>(max_examples) * max_update_norm,
                   " exceeds 1e30; a weighted norm could overflow float (lower bounds.max_norm or "
                   "bounds.max_examples)");
  if (static_cast<double>(max_partial_count) * term > 1e36)
    STARLING_THROW(
        ConfigError,
        "validation bounds: max_partial_count * max_examples * max_abs_value exceeds 1e36");
}

std::string ValidationBounds::describe() const {
  std::ostringstream os;
  os << "|value| <= " << max_abs_value << ", ||update|| <= " << max_update_norm
     << ", examples <= " << max_examples << ", |metric| <= " << max_metric_abs;
  return os.str();
}

}  // namespace starling::aggregation
