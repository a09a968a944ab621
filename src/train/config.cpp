#include "gz/train/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include "gz/core/env.h"
#include "gz/core/error.h"
#include "gz/train/atomic_file.h"

namespace gz::train {

namespace {

enum class Kind { Int, Double, Bool, String, IntList };

// One accepted key: where it lives in TrainConfig and how to validate it. Validation is a
// function returning an error text ("" = fine) so one table serves YAML, flags and saving.
struct Field {
  std::string key;
  Kind kind;
  void* ptr;
  std::function<std::string()> check;
};

template <typename T>
std::function<std::string()> at_least(const T* v, T lo) {
  return [v, lo] {
    if (*v < lo) return detail::concat("must be >= ", lo, ", got ", *v);
    return std::string();
  };
}

std::function<std::string()> in_range(const double* v, double lo, double hi) {
  return [v, lo, hi] {
    if (!(*v >= lo && *v <= hi)) return detail::concat("must be in [", lo, ", ", hi, "], got ", *v);
    return std::string();
  };
}

std::function<std::string()> positive(const double* v) {
  return [v] {
    if (!(*v > 0) || !std::isfinite(*v)) return detail::concat("must be > 0, got ", *v);
    return std::string();
  };
}

std::function<std::string()> one_of(const std::string* v, std::vector<std::string> choices) {
  return [v, choices] {
    if (std::find(choices.begin(), choices.end(), *v) != choices.end()) return std::string();
    std::string msg = "must be one of";
    for (auto& c : choices) msg += " " + c;
    return msg + ", got '" + *v + "'";
  };
}

// Why `c`'s checkpoint_format cannot be used (empty: it can).
std::string checkpoint_format_error(const TrainConfig& c) {
  auto err = one_of(&c.checkpoint_format, {"auto", "consolidated", "sharded"})();
  if (err.empty() && c.checkpoint_format == "sharded" && c.zero_stage == 0)
    err = "sharded needs zero_stage 1, 2 or 3 (at zero_stage 0 every rank holds the whole state); "
          "use auto or consolidated";
  return err;
}

std::vector<Field> fields(TrainConfig& c) {
  auto none = [] { return std::string(); };
  SchedulerConfig& s = c.scheduler;
  return {
      {"dataset", Kind::String, &c.dataset, none},
      {"train_data", Kind::String, &c.train_data, none},
      {"test_data", Kind::String, &c.test_data, none},
      {"train_limit", Kind::Int, &c.train_limit, at_least<int64_t>(&c.train_limit, 0)},
      {"test_limit", Kind::Int, &c.test_limit, at_least<int64_t>(&c.test_limit, 0)},
      {"augment", Kind::Bool, &c.augment, none},
      {"num_workers", Kind::Int, &c.num_workers, at_least<int64_t>(&c.num_workers, 0)},
      {"net_type", Kind::String, &c.net_type, none},
      {"input_size", Kind::Int, &c.input_size, at_least<int64_t>(&c.input_size, 1)},
      {"in_channels", Kind::Int, &c.in_channels, at_least<int64_t>(&c.in_channels, 1)},
      {"num_classes", Kind::Int, &c.num_classes, at_least<int64_t>(&c.num_classes, 2)},
      {"dropout", Kind::Double, &c.dropout, in_range(&c.dropout, 0, 1)},
      {"hidden", Kind::Int, &c.hidden, at_least<int64_t>(&c.hidden, 1)},
      {"layers", Kind::Int, &c.layers, at_least<int64_t>(&c.layers, 0)},
      {"batch_size", Kind::Int, &c.batch_size, at_least<int64_t>(&c.batch_size, 1)},
      {"eval_batch_size", Kind::Int, &c.eval_batch_size, at_least<int64_t>(&c.eval_batch_size, 1)},
      {"lr", Kind::Double, &c.lr, positive(&c.lr)},
      {"optimizer", Kind::String, &c.optimizer, one_of(&c.optimizer, {"sgd", "adam", "adamw"})},
      {"momentum", Kind::Double, &c.momentum, in_range(&c.momentum, 0, 1)},
      {"weight_decay", Kind::Double, &c.weight_decay, in_range(&c.weight_decay, 0, 1)},
      {"loss", Kind::String, &c.loss, one_of(&c.loss, {"cross_entropy", "label_smoothing"})},
      {"label_smoothing", Kind::Double, &c.label_smoothing, in_range(&c.label_smoothing, 0, 1)},
      {"scheduler.name", Kind::String, &s.name, one_of(&s.name, {"multi_step", "cosine", "linear", "constant"})},
      {"scheduler.warmup_steps", Kind::Int, &s.warmup_steps, at_least<int64_t>(&s.warmup_steps, 0)},
      {"scheduler.warmup_epochs", Kind::Double, &s.warmup_epochs, in_range(&s.warmup_epochs, 0, 1e9)},
      {"scheduler.milestones", Kind::IntList, &s.milestones,
       [&s] {
         for (size_t i = 0; i < s.milestones.size(); ++i) {
           if (s.milestones[i] < 0) return std::string("must not be negative");
           if (i && s.milestones[i] <= s.milestones[i - 1]) return std::string("must be increasing");
         }
         return std::string();
       }},
      {"scheduler.unit", Kind::String, &s.unit, one_of(&s.unit, {"epoch", "step"})},
      {"scheduler.gamma", Kind::Double, &s.gamma, in_range(&s.gamma, 0, 1e9)},
      {"scheduler.min_lr", Kind::Double, &s.min_lr, in_range(&s.min_lr, 0, 1e9)},
      {"num_epochs", Kind::Int, &c.num_epochs, at_least<int64_t>(&c.num_epochs, 1)},
      {"max_steps", Kind::Int, &c.max_steps, at_least<int64_t>(&c.max_steps, 0)},
      {"gradient_accumulation_steps", Kind::Int, &c.gradient_accumulation_steps,
       at_least<int64_t>(&c.gradient_accumulation_steps, 1)},
      {"max_grad_norm", Kind::Double, &c.max_grad_norm, in_range(&c.max_grad_norm, 0, 1e12)},
      {"eval_steps", Kind::Int, &c.eval_steps, at_least<int64_t>(&c.eval_steps, 0)},
      {"save_steps", Kind::Int, &c.save_steps, at_least<int64_t>(&c.save_steps, 0)},
      {"save_total_limit", Kind::Int, &c.save_total_limit, at_least<int64_t>(&c.save_total_limit, 1)},
      {"save_checkpoints", Kind::Bool, &c.save_checkpoints, none},
      {"async_checkpoint", Kind::Bool, &c.async_checkpoint, none},
      {"snapshot_every", Kind::Int, &c.snapshot_every, at_least<int64_t>(&c.snapshot_every, 0)},
      {"snapshot_dir", Kind::String, &c.snapshot_dir, none},
      {"metric_for_best_model", Kind::String, &c.metric_for_best_model,
       one_of(&c.metric_for_best_model, {"test_accuracy", "test_loss", "train_loss"})},
      {"greater_is_better", Kind::Bool, &c.greater_is_better, none},
      {"early_stopping_patience", Kind::Int, &c.early_stopping_patience,
       at_least<int64_t>(&c.early_stopping_patience, 0)},
      {"early_stopping_threshold", Kind::Double, &c.early_stopping_threshold,
       in_range(&c.early_stopping_threshold, 0, 1e9)},
      {"prune_sparsity", Kind::Double, &c.prune_sparsity, [&c] {
         if (!(c.prune_sparsity >= 0 && c.prune_sparsity < 1))
           return detail::concat("must be in [0, 1), got ", c.prune_sparsity);
         return std::string();
       }},
      {"log_every", Kind::Int, &c.log_every, at_least<int64_t>(&c.log_every, 1)},
      {"progress", Kind::Bool, &c.progress, none},
      {"tensorboard", Kind::Bool, &c.tensorboard, none},
      {"work_dir", Kind::String, &c.work_dir, [&c] {
         return c.work_dir.empty() ? std::string("must not be empty") : std::string();
       }},
      {"seed", Kind::Int, &c.seed, at_least<int64_t>(&c.seed, 0)},
      {"num_threads", Kind::Int, &c.num_threads, at_least<int64_t>(&c.num_threads, 0)},
      {"mode", Kind::String, &c.mode, one_of(&c.mode, {"single", "ddp", "horovod", "dp"})},
      {"backend", Kind::String, &c.backend, none},
      {"dp_replicas", Kind::Int, &c.dp_replicas, at_least<int64_t>(&c.dp_replicas, 1)},
      {"device", Kind::String, &c.device, one_of(&c.device, {"cpu", "cuda"})},
      {"mixed_precision", Kind::String, &c.mixed_precision, one_of(&c.mixed_precision, {"no", "bf16", "fp16"})},
      // --- communication algorithms: the compression: and averaging: blocks ---
      {"compression.method", Kind::String, &c.compression.method,
       one_of(&c.compression.method, {"none", "fp16", "bf16", "powersgd", "int8", "topk"})},
      {"compression.start_step", Kind::Int, &c.compression.start_step, at_least<int64_t>(&c.compression.start_step, 0)},
      {"compression.error_feedback", Kind::Bool, &c.compression.error_feedback, none},
      {"compression.rank", Kind::Int, &c.compression.rank, at_least<int64_t>(&c.compression.rank, 1)},
      {"compression.int8_chunk", Kind::Int, &c.compression.int8_chunk, at_least<int64_t>(&c.compression.int8_chunk, 1)},
      {"compression.topk_ratio", Kind::Double, &c.compression.topk_ratio, [&c] {
         if (!(c.compression.topk_ratio > 0 && c.compression.topk_ratio <= 1))
           return detail::concat("must be in (0, 1], got ", c.compression.topk_ratio);
         return std::string();
       }},
      {"averaging.method", Kind::String, &c.averaging.method, one_of(&c.averaging.method, {"none", "local_sgd", "async"})},
      {"averaging.period", Kind::Int, &c.averaging.period, at_least<int64_t>(&c.averaging.period, 1)},
      {"averaging.warmup_steps", Kind::Int, &c.averaging.warmup_steps, at_least<int64_t>(&c.averaging.warmup_steps, 0)},
      {"averaging.buffers", Kind::Bool, &c.averaging.buffers, none},
      {"averaging.max_staleness", Kind::Int, &c.averaging.max_staleness,
       at_least<int64_t>(&c.averaging.max_staleness, 0)},
      // --- the straggler report: the straggler: block ---
      {"straggler.every", Kind::Int, &c.straggler.every, at_least<int64_t>(&c.straggler.every, 0)},
      {"straggler.windows", Kind::Int, &c.straggler.windows, at_least<int64_t>(&c.straggler.windows, 1)},
      {"straggler.threshold_ms", Kind::Double, &c.straggler.threshold_ms,
       in_range(&c.straggler.threshold_ms, 0, 1e9)},
      {"straggler.threshold_fraction", Kind::Double, &c.straggler.threshold_fraction,
       in_range(&c.straggler.threshold_fraction, 0, 1)},
      {"straggler.min_window_ms", Kind::Double, &c.straggler.min_window_ms,
       in_range(&c.straggler.min_window_ms, 0, 1e9)},
      {"straggler.link_probe", Kind::Bool, &c.straggler.link_probe, none},
      {"finetune", Kind::String, &c.finetune, none},
      {"resume_from_checkpoint", Kind::String, &c.resume_from_checkpoint, none},
      {"elastic_batch", Kind::String, &c.elastic_batch,
       one_of(&c.elastic_batch, {"keep_global", "scale_lr"})},
      {"global_batch_size", Kind::Int, &c.global_batch_size, at_least<int64_t>(&c.global_batch_size, 0)},
      {"log_samples", Kind::Bool, &c.log_samples, none},
      {"zero_stage", Kind::Int, &c.zero_stage, [&c] {
         if (c.zero_stage < 0 || c.zero_stage > 3) return detail::concat("must be 0, 1, 2 or 3, got ", c.zero_stage);
         if (c.zero_stage > 0 && c.mode != "ddp") return detail::concat("needs mode: ddp, got mode '", c.mode, "'");
         if (c.zero_stage > 0 && c.mixed_precision == "fp16")
           return std::string("does not work with mixed_precision fp16 (GradScaler); use bf16");
         return std::string();
       }},
      {"fsdp_prefetch", Kind::Bool, &c.fsdp_prefetch, none},
      {"checkpoint_format", Kind::String, &c.checkpoint_format, [&c] { return checkpoint_format_error(c); }},
  };
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool parse_bool(const std::string& raw, bool* out) {
  std::string v = raw;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (v == "true" || v == "yes" || v == "on" || v == "1") return *out = true, true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return *out = false, true;
  return false;
}

// Set one field from text (a YAML scalar or a flag value). Lists: "[1, 2]", "1,2" or "".
void assign(const Field& f, const std::string& raw, const std::string& where) {
  auto bad = [&](const char* expected) {
    GZ_THROW(InvalidArgument, "config key '", f.key, "' (", where, "): expected ", expected, ", got '", raw, "'");
  };
  try {
    switch (f.kind) {
      case Kind::Int: {
        double d = 0;
        long long v = 0;
        try {
          v = parse_int(raw, f.key);
        } catch (const InvalidArgument&) {
          // Accept "1e3" or "100.0" when the value is integral.
          d = parse_double(raw, f.key);
          if (d != std::floor(d) || std::fabs(d) > 9e15) bad("an integer");
          v = static_cast<long long>(d);
        }
        *static_cast<int64_t*>(f.ptr) = v;
        break;
      }
      case Kind::Double: {
        double v = parse_double(raw, f.key);
        if (!std::isfinite(v)) bad("a finite number");
        *static_cast<double*>(f.ptr) = v;
        break;
      }
      case Kind::Bool:
        if (!parse_bool(raw, static_cast<bool*>(f.ptr))) bad("a boolean (true/false)");
        break;
      case Kind::String:
        *static_cast<std::string*>(f.ptr) = raw;
        break;
      case Kind::IntList: {
        std::string body = trim(raw);
        if (!body.empty() && body.front() == '[') {
          if (body.back() != ']') bad("a list of integers");
          body = body.substr(1, body.size() - 2);
        }
        std::vector<int64_t> out;
        std::stringstream ss(body);
        std::string item;
        while (std::getline(ss, item, ',')) {
          item = trim(item);
          if (item.empty()) {
            if (trim(body).empty()) break;
            bad("a list of integers");
          }
          out.push_back(parse_int(item, f.key));
        }
        *static_cast<std::vector<int64_t>*>(f.ptr) = out;
        break;
      }
    }
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    if (msg.rfind("config key", 0) == 0) throw;
    bad(f.kind == Kind::Double ? "a number" : f.kind == Kind::Int ? "an integer" : "a list of integers");
  }
}

const Field& find_field(const std::vector<Field>& table, const std::string& key, const std::string& where) {
  for (auto& f : table)
    if (f.key == key) return f;
  // Suggest keys sharing the first characters, to catch typos.
  std::string hint;
  for (auto& f : table)
    if (!key.empty() && f.key.compare(0, 3, key, 0, 3) == 0) hint += (hint.empty() ? "" : ", ") + f.key;
  GZ_THROW(InvalidArgument, "unknown config key '", key, "' (", where, ")",
           hint.empty() ? std::string() : "; did you mean: " + hint);
}

void apply_yaml(const YAML::Node& node, const std::string& prefix, const std::vector<Field>& table,
                const std::string& origin) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Mark mark = it->first.Mark();
    std::string where = origin + ", line " + std::to_string(mark.line + 1);
    // "? [a, b] : 1" or a map as key: as<std::string>() would throw YAML::BadConversion, which
    // nothing here expects (it used to terminate the process).
    if (!it->first.IsScalar())
      GZ_THROW(InvalidArgument, "config ", where, ", column ", mark.column + 1, ": keys must be plain names, got a ",
               it->first.IsSequence() ? "list" : it->first.IsMap() ? "mapping" : "null", " as a key");
    std::string key = prefix + it->first.Scalar();
    const YAML::Node value = it->second;  // a copy: the iterator's pair is a temporary
    if (value.IsMap()) {
      // A block nests when the table has keys under it ("straggler" for straggler.every, ...);
      // any other map is an unknown key.
      const bool block = std::any_of(table.begin(), table.end(),
                                     [&](const Field& f) { return f.key.rfind(key + ".", 0) == 0; });
      if (!block) find_field(table, key, where);
      apply_yaml(value, key + ".", table, origin);
      continue;
    }
    const Field& f = find_field(table, key, where);
    if (value.IsSequence()) {
      if (f.kind != Kind::IntList)
        GZ_THROW(InvalidArgument, "config key '", key, "' (", where, "): expected a single value, got a list");
      std::string joined;
      for (const auto& item : value) {
        if (!item.IsScalar())
          GZ_THROW(InvalidArgument, "config key '", key, "' (", where, "): list items must be integers");
        joined += (joined.empty() ? "" : ",") + item.Scalar();
      }
      assign(f, joined, where);
    } else if (value.IsNull()) {
      if (f.kind == Kind::String || f.kind == Kind::IntList) assign(f, "", where);
      else GZ_THROW(InvalidArgument, "config key '", key, "' (", where, "): missing value");
    } else {
      assign(f, value.Scalar(), where);
    }
  }
}

void apply_flags(const std::vector<std::string>& flags, const std::vector<Field>& table) {
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& arg = flags[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2)
      GZ_THROW(InvalidArgument, "unexpected argument '", arg, "': flags look like --key value or --key=value");
    std::string key = arg.substr(2), value;
    auto eq = key.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    std::replace(key.begin(), key.end(), '-', '_');
    std::string where = "flag --" + key;
    const Field& f = find_field(table, key, where);
    if (!has_value) {
      // A bare boolean flag (--augment) means true unless a value follows.
      bool next_is_value = i + 1 < flags.size() && flags[i + 1].rfind("--", 0) != 0;
      if (!next_is_value) {
        if (f.kind != Kind::Bool) GZ_THROW(InvalidArgument, "config key '", key, "' (", where, "): missing value");
        value = "true";
      } else {
        value = flags[++i];
      }
    }
    assign(f, value, where);
  }
}

// The compression: and averaging: blocks against the mode and each other.
void check_comm_algorithms(const TrainConfig& c, const std::string& origin) {
  const bool compress = c.compression.method != "none", average = c.averaging.method != "none";
  if (compress && c.mode != "ddp" && c.mode != "horovod")
    GZ_THROW(InvalidArgument, "config key 'compression.method' (", origin, " + flags): '", c.compression.method,
             "' needs mode ddp or horovod, got mode '", c.mode, "'");
  if (average && c.mode != "ddp")
    GZ_THROW(InvalidArgument, "config key 'averaging.method' (", origin, " + flags): '", c.averaging.method,
             "' needs mode ddp, got mode '", c.mode, "'");
  if (compress && average)
    GZ_THROW(InvalidArgument, "config keys 'compression.method' and 'averaging.method' (", origin,
             " + flags): choose one (compression '", c.compression.method, "', averaging '", c.averaging.method, "')");
  // ZeRO reduce-scatters the buckets with its own hook and steps only this rank's shard; stage 3
  // casts its reduce-scatters to fp16/bf16 (FullyShardOptions::reduce_dtype) from the first step.
  const bool cast =
      (c.compression.method == "fp16" || c.compression.method == "bf16") && c.compression.start_step == 0;
  if (c.zero_stage > 0 && (average || (compress && !(c.zero_stage == 3 && cast))))
    GZ_THROW(InvalidArgument, "config key 'zero_stage' (", origin, " + flags): ", c.zero_stage,
             " does not combine with compression or averaging (got compression '", c.compression.method,
             "' from step ", c.compression.start_step, ", averaging '", c.averaging.method,
             "'); use zero_stage: 0, or zero_stage 3 with compression fp16 or bf16 from step 0");
  // Stage 3 frees the parameters' storage between steps; pruning masks them in place after a step.
  if (c.zero_stage == 3 && c.prune_sparsity > 0)
    GZ_THROW(InvalidArgument, "config key 'prune_sparsity' (", origin, " + flags): ", c.prune_sparsity,
             " does not combine with zero_stage 3 (its parameters hold no memory between steps); use zero_stage 2");
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::vector<std::string>& flags,
                         const std::string& origin) {
  TrainConfig config;
  auto table = fields(config);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    GZ_THROW(InvalidArgument, "cannot parse config ", origin, ": ", e.what());
  }
  if (root.IsDefined() && !root.IsNull()) {
    if (!root.IsMap()) GZ_THROW(InvalidArgument, "config ", origin, ": top level must be a mapping of key: value");
    try {
      apply_yaml(root, "", table, origin);
    } catch (const YAML::Exception& e) {
      // Any other yaml-cpp surprise becomes a config error too (e.mark says where).
      GZ_THROW(InvalidArgument, "config ", origin,
               e.mark.is_null() ? std::string() : ", line " + std::to_string(e.mark.line + 1), ": ", e.msg);
    }
  }
  apply_flags(flags, table);
  for (auto& f : table) {
    std::string err = f.check();
    if (!err.empty()) GZ_THROW(InvalidArgument, "config key '", f.key, "' (", origin, " + flags): ", err);
  }
  if (config.mode == "dp" && config.gradient_accumulation_steps < 1)
    GZ_THROW(InvalidArgument, "config key 'gradient_accumulation_steps': must be >= 1");
  check_comm_algorithms(config, origin);
  if (config.mixed_precision == "fp16" && config.device != "cuda")
    GZ_THROW(InvalidArgument, "config key 'mixed_precision' (", origin,
             " + flags): fp16 needs device: cuda (the GradScaler path); use bf16 on CPU");
  return config;
}

TrainConfig load_config(const std::string& yaml_path, const std::vector<std::string>& flags) {
  std::string text;
  if (!yaml_path.empty()) {
    if (!std::filesystem::exists(yaml_path))
      GZ_THROW(InvalidArgument, "config file '", yaml_path, "' does not exist");
    text = read_file(yaml_path);
  }
  return parse_config(text, flags, yaml_path.empty() ? "<defaults>" : yaml_path);
}

std::string config_to_yaml(const TrainConfig& config) {
  TrainConfig copy = config;
  auto table = fields(copy);
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string block;  // the nested block open now ("scheduler", "compression", ...), or ""
  for (auto& f : table) {
    const auto dot = f.key.find('.');
    const std::string fb = dot == std::string::npos ? std::string() : f.key.substr(0, dot);
    if (fb != block) {
      if (!block.empty()) out << YAML::EndMap;
      if (!fb.empty()) out << YAML::Key << fb << YAML::Value << YAML::BeginMap;
      block = fb;
    }
    out << YAML::Key << (fb.empty() ? f.key : f.key.substr(dot + 1)) << YAML::Value;
    switch (f.kind) {
      case Kind::Int: out << *static_cast<int64_t*>(f.ptr); break;
      case Kind::Double: {
        std::ostringstream os;
        os.precision(17);
        os << *static_cast<double*>(f.ptr);
        out << os.str();
        break;
      }
      case Kind::Bool: out << (*static_cast<bool*>(f.ptr) ? "true" : "false"); break;
      case Kind::String: out << YAML::DoubleQuoted << *static_cast<std::string*>(f.ptr); break;
      case Kind::IntList: {
        out << YAML::Flow << YAML::BeginSeq;
        for (auto v : *static_cast<std::vector<int64_t>*>(f.ptr)) out << v;
        out << YAML::EndSeq;
        break;
      }
    }
  }
  if (!block.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

void save_config(const TrainConfig& config, const std::string& path) {
  write_file_atomic(path, config_to_yaml(config));
}

std::vector<std::string> config_keys() {
  TrainConfig c;
  std::vector<std::string> keys;
  for (auto& f : fields(c)) keys.push_back(f.key);
  return keys;
}

bool sharded_checkpoints(const TrainConfig& config) {
  const std::string err = checkpoint_format_error(config);
  if (!err.empty()) GZ_THROW(InvalidArgument, "config key 'checkpoint_format': ", err);
  if (config.checkpoint_format == "sharded") return true;
  return config.checkpoint_format == "auto" && config.zero_stage >= 1;
}

}  // namespace gz::train
