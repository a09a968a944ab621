// Reading flight-recorder dumps and gzrun's node reports into a Picture. Bad input never stops
// the reading: a corrupt line, a file cut short, a dump of another job or schema version, a rank
// without a dump each become one note in Picture::notes, and the rest is used.
#pragma once

#include <string>

#include "dump_model.h"

namespace gz::doctor {

/// @brief The schema this reader understands (what src/comm/flight writes).
constexpr const char* kSchema = "gz-flight-recorder";
constexpr int kVersion = 1;

/// @brief Add one file's text: one or more dumps, node reports ("gzrun") and a job line ("job"),
/// in any order. `source` names it in notes.
void read_text(Picture& pic, const std::string& text, const std::string& source);
/// @brief Read every "*.jsonl" file of `dir` (dumps and node reports). A missing or unreadable
/// directory is a note.
void read_dir(Picture& pic, const std::string& dir);
/// @brief After reading: keep the dumps of one job (the job line's, else the most common one),
/// one dump per rank (the latest), and note every rank of the world without a dump.
void settle(Picture& pic);

/// @brief Global rank of `d`'s member in `c` (-1 when unknown).
int global_rank(const RankDump& d, const CommDump& c);

}  // namespace gz::doctor
