// The leader's web dashboard as the control server serves it: the static files of
// dashboard/ (HTML, JavaScript, CSS and the vendored chart library, uPlot), built into
// the binary by cmake/embed_assets.cmake, and the HTTP headers they go out with. The
// files hold no data: the page asks for everything over the dashboard's WebSocket
// (/v1/dashboard), which first wants the client token (docs/protocol.md, "Dashboard").
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dltrain::control {

/// One embedded file.
struct StaticAsset {
  std::string_view path;          ///< URL path, "/index.html", "/vendor/uPlot.iife.min.js"
  std::string_view content_type;  ///< "text/javascript; charset=utf-8", ...
  std::string_view body;          ///< the file's bytes
};

/// Every embedded file (defined in the generated dashboard_assets.cpp). Static storage;
/// thread-safe.
std::span<const StaticAsset> dashboard_assets();

/// The asset a GET of `target` (the request target: a path, optionally with "?query")
/// names: "/" is "/index.html"; the query is ignored. Matched exactly against the
/// embedded paths, so "..", "//", percent escapes or any other path name nothing (no
/// file system is involved). nullptr when none. Pure, thread-safe.
const StaticAsset* find_dashboard_asset(std::string_view target);

/// The security and caching headers every dashboard response carries (name, value):
/// a Content-Security-Policy that lets the page load only its own scripts and styles and
/// connect only to its own origin (no inline script, no frames, no forms elsewhere),
/// nosniff, no referrer, and `Cache-Control: no-cache` (a browser revalidates, so an
/// upgraded leader's files are never mixed with an old page's).
const std::vector<std::pair<std::string, std::string>>& dashboard_headers();

}  // namespace dltrain::control
