// The ImageFolder layout (torchvision.datasets.ImageFolder, Keras'
// image_dataset_from_directory, fastai): one folder per class under train/ and under
// test/ (or val/), image files inside. This file lists and validates it; it decodes
// nothing (data/image.h does). Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dltrain::data {

/// One image file of the collection and its class index.
struct ImageFile {
  std::string path;  ///< the file (data_dir/split/class/…), as found
  int label = 0;     ///< index into ImageFolderIndex::classes
};

/// A validated ImageFolder collection.
struct ImageFolderIndex {
  std::string root;                  ///< data_dir
  std::vector<std::string> classes;  ///< sorted names of train/'s class folders
  std::vector<ImageFile> train;      ///< sorted by class, then path
  std::vector<ImageFile> test;       ///< the test/ (or val/) split, same order
  std::string test_split;            ///< "test" or "val"
  /// Files skipped by their extension (not .jpg, .jpeg or .png), per split: counted
  /// so that `dltrain dataset inspect` can show them; never decoded.
  std::map<std::string, std::int64_t> other_files;
};

/// True for the extensions the ImageFolder reader takes: .jpg, .jpeg, .png in any case.
bool is_image_file_name(const std::string& name);

/// Lists `dir` as an ImageFolder: `dir/train/<class>/**/*.{jpg,jpeg,png}` and the same
/// under `dir/test/` or, when there is no test/, `dir/val/`. Classes are the sorted
/// (byte order) names of train/'s subfolders; folders whose name starts with '.' are
/// ignored (.ipynb_checkpoints, .DS_Store); files are found recursively, symbolic links
/// followed. Throws ConfigError("data_dir", …) naming the path when `dir` or train/ is
/// missing, when neither test/ nor val/ exists, when a class folder (train or test) holds
/// no image file, and when the test split has a class folder that train/ lacks.
/// Thread-safe (no shared state).
ImageFolderIndex scan_image_folder(const std::string& dir);

}  // namespace dltrain::data
