#include "gz/train/data/factory.h"

#include <filesystem>
#include <sstream>

#include "gz/core/error.h"
#include "gz/train/data/fashion_mnist.h"
#include "gz/train/data/image_folder.h"
#include "gz/train/data/text_lines.h"

namespace gz::train {
namespace fs = std::filesystem;
namespace {

std::vector<std::string> text_files(const std::string& path, const std::string& split) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* ext : {".tsv", ".txt"}) {
      const auto p = fs::path(path) / (split + ext);
      if (fs::is_regular_file(p, ec)) return {p.string()};
    }
    GZ_THROW(InvalidArgument, "text_lines: no ", split, ".tsv or ", split, ".txt in '", path, "'");
  }
  std::vector<std::string> files;
  std::stringstream ss(path);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) files.push_back(item);
  if (files.empty()) GZ_THROW(InvalidArgument, "text_lines: empty path");
  return files;
}

}  // namespace

DatasetPtr create_dataset(const DataOptions& o) {
  if (o.split != "train" && o.split != "test")
    GZ_THROW(InvalidArgument, "create_dataset: split '", o.split, "' (known: train, test)");
  const bool train = o.split == "train";
  if (o.kind == "fashion_mnist") {
    FashionMnistOptions f;
    if (!o.path.empty()) f.root = o.path;
    f.train = train;
    f.augment = o.augment;
    f.seed = o.seed;
    if (!o.mean.empty()) f.mean = o.mean.front();
    if (!o.std.empty()) f.std = o.std.front();
    if (o.input_size > 0) f.input_size = o.input_size;
    if (o.channels > 0) f.channels = o.channels;
    return std::make_shared<FashionMnistDataset>(f);
  }
  if (o.kind == "image_folder") {
    ImageFolderOptions f;
    std::error_code ec;
    const auto sub = fs::path(o.path) / o.split;
    f.root = fs::is_directory(sub, ec) ? sub.string() : o.path;
    f.augment = o.augment;
    f.seed = o.seed;
    if (o.input_size > 0) f.input_size = o.input_size;
    if (o.channels > 0) f.channels = o.channels;
    if (!o.mean.empty()) f.mean = o.mean;
    if (!o.std.empty()) f.std = o.std;
    f.resize = o.resize;
    return std::make_shared<ImageFolderDataset>(f);
  }
  if (o.kind == "text_lines") {
    TextLinesOptions t;
    t.paths = text_files(o.path, o.split);
    t.vocab_size = o.vocab_size;
    if (o.input_size > 0) t.seq_len = o.input_size;
    t.num_classes = o.num_classes;
    return std::make_shared<TextLinesDataset>(t);
  }
  GZ_THROW(InvalidArgument, "create_dataset: unknown kind '", o.kind, "' (known: fashion_mnist, image_folder, text_lines)");
}

}  // namespace gz::train
