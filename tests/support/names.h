// The names the integration tests use unqualified, in one list that each includes
// instead of repeating it: std::filesystem as fs, nlohmann::json as json, the chrono
// literals (30s, 50ms) and everything of tests/support/ (dltrain::testing).
#pragma once

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace dltrain::testing {}

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;
using namespace dltrain::testing;
