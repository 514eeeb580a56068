#include "data/imagefolder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "common/errors.h"

namespace dltrain::data {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> class_folders(const fs::path& split_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(split_dir, fs::directory_options::follow_directory_symlink, ec), end;
       !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code dec;
    if (it->is_directory(dec)) out.push_back(name);
  }
  if (ec) throw ConfigError("data_dir", "cannot list \"" + split_dir.string() + "\": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

// The image files under one class folder (recursive), sorted; other files counted.
std::vector<std::string> image_files(const fs::path& class_dir, std::int64_t& other) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(class_dir, fs::directory_options::follow_directory_symlink, ec), end;
       !ec && it != end; it.increment(ec)) {
    const auto name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    std::error_code fec;
    if (!it->is_regular_file(fec)) continue;
    if (is_image_file_name(name)) {
      out.push_back(it->path().string());
    } else {
      ++other;
    }
  }
  if (ec) throw ConfigError("data_dir", "cannot list \"" + class_dir.string() + "\": " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void add_split(const fs::path& split_dir, const std::vector<std::string>& names, const std::vector<std::string>& classes,
               std::vector<ImageFile>& files, std::int64_t& other) {
  for (const auto& name : names) {
    const auto it = std::lower_bound(classes.begin(), classes.end(), name);
    if (it == classes.end() || *it != name) {
      throw ConfigError("data_dir", "class folder \"" + (split_dir / name).string() +
                                        "\" has no counterpart in the training set (" +
                                        (split_dir.parent_path() / "train").string() + " has " +
                                        std::to_string(classes.size()) + " classes)");
    }
    const int label = static_cast<int>(it - classes.begin());
    const auto found = image_files(split_dir / name, other);
    if (found.empty()) {
      throw ConfigError("data_dir", "class folder \"" + (split_dir / name).string() +
                                        "\" has no image files (.jpg, .jpeg or .png)");
    }
    for (const auto& f : found) files.push_back({f, label});
  }
}

}  // namespace

bool is_image_file_name(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

ImageFolderIndex scan_image_folder(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw ConfigError("data_dir", "directory \"" + dir + "\" does not exist");
  const fs::path train = root / "train";
  if (!fs::is_directory(train, ec)) {
    throw ConfigError("data_dir", "\"" + dir + "\" has no train/ folder (an ImageFolder data set holds "
                                               "train/<class>/*.jpg|png and test/<class>/… or val/<class>/…)");
  }
  ImageFolderIndex idx;
  idx.root = dir;
  if (fs::is_directory(root / "test", ec)) {
    idx.test_split = "test";
  } else if (fs::is_directory(root / "val", ec)) {
    idx.test_split = "val";
  } else {
    throw ConfigError("data_dir", "\"" + dir + "\" has neither a test/ nor a val/ folder for evaluation");
  }
  idx.classes = class_folders(train);
  if (idx.classes.empty()) {
    throw ConfigError("data_dir", "\"" + train.string() + "\" has no class folders (expected train/<class>/<image>)");
  }
  add_split(train, idx.classes, idx.classes, idx.train, idx.other_files["train"]);
  const fs::path test = root / idx.test_split;
  const auto test_classes = class_folders(test);
  if (test_classes.empty()) {
    throw ConfigError("data_dir", "\"" + test.string() + "\" has no class folders (expected " + idx.test_split +
                                      "/<class>/<image>)");
  }
  add_split(test, test_classes, idx.classes, idx.test, idx.other_files[idx.test_split]);
  return idx;
}

}  // namespace dltrain::data
