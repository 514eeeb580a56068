// `dltrain dataset inspect DIR`: what an ImageFolder or CIFAR-10 directory holds, as the
// workers would read it. Plain C++, no LibTorch.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dltrain::data {

/// Inspects `dir`: an ImageFolder (data/imagefolder.h) or CIFAR-10's binary files
/// (data/cifar10.h), whichever it holds. Every image is decoded (on `threads` threads,
/// >= 1), so that the report lists what training would skip. The JSON:
///   {"dataset": "imagefolder" | "cifar10", "data_dir": DIR, "classes": [names],
///    "splits": {"train": {"images": N, "per_class": {name: N}}, "test"|"val": {…}},
///    "sizes": [{"width": W, "height": H, "channels": C, "images": N}, …] (most common
///    first), "unreadable": [{"path": P, "error": E}, …], "other_files": {split: N}}.
/// Throws ConfigError("data_dir", …) when the layout is invalid (the same checks as job
/// submission), IoError/ProtocolError when a CIFAR-10 file cannot be read.
nlohmann::json inspect_dataset(const std::string& dir, int threads);

}  // namespace dltrain::data
