#include "control/dashboard_assets.h"

namespace dltrain::control {

const StaticAsset* find_dashboard_asset(std::string_view target) {
  const auto q = target.find_first_of("?#");
  std::string_view path = target.substr(0, q);
  if (path == "/") path = "/index.html";
  for (const auto& a : dashboard_assets()) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

const std::vector<std::pair<std::string, std::string>>& dashboard_headers() {
  // 'self' in connect-src covers ws:// and wss:// to the page's own host and port
  // (CSP Level 3). uPlot sets element styles from script (CSSOM), which style-src does
  // not restrict; the page has no inline script or style.
  static const std::vector<std::pair<std::string, std::string>> h{
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      {"X-Frame-Options", "DENY"},
      {"Cache-Control", "no-cache"},
  };
  return h;
}

}  // namespace dltrain::control
