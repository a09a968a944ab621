// The "gz" process group's gather-like ops: all-gather (list, base, coalesced), gather, scatter,
// reduce-scatter (list, base) and all-to-all (list, base).
#include <numeric>

#include "gz/core/error.h"
#include "process_group.h"
#include "process_group_util.h"

namespace gz::python {

using ::c10d::OpType;
using gz::comm::Communicator;
using gz::comm::OpOptions;
using WorkRef = c10::intrusive_ptr<::c10d::Work>;

namespace {

at::Tensor flat_cat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Bytes [off, off + n) of the byte tensor `flat` copied into `dst` (any dtype, any layout).
void unpack(const at::Tensor& flat, int64_t off, at::Tensor& dst) {
  const int64_t n = static_cast<int64_t>(nbytes(dst));
  if (n > 0) dst.copy_(flat.narrow(0, off, n).view(dst.scalar_type()).view(dst.sizes()));
}

// Byte-level all-to-all on the calling (progress) thread: this rank sends send_bytes[d] bytes of
// `send` (blocks in order of d) to every d and receives recv_bytes[s] from every s into `recv`.
// Over allgather(v): deadlock-free and simple; every rank receives every block, which is fine for
// the few ranks of one machine but not an optimal all-to-all.
void alltoall_bytes(Communicator& c, const OpOptions& o, const uint8_t* send,
                    const std::vector<int64_t>& send_bytes, uint8_t* recv,
                    const std::vector<int64_t>& recv_bytes) {
  const int w = c.size(), r = c.rank();
  // Everyone's send sizes: S[src * w + dst].
  std::vector<int64_t> S(static_cast<size_t>(w) * w);
  c.allgather(send_bytes.data(), S.data(), w, gz::DType::i64, o);
  std::vector<size_t> totals(w);
  for (int s = 0; s < w; ++s)
    totals[s] = static_cast<size_t>(std::accumulate(S.begin() + s * w, S.begin() + (s + 1) * w, int64_t{0}));
  for (int s = 0; s < w; ++s)
    if (S[s * w + r] != recv_bytes[s])
      GZ_THROW(gz::InvalidArgument, "gz backend: alltoall: rank ", r, " expects ", recv_bytes[s],
               " bytes from rank ", s, ", which sends it ", S[s * w + r]);
  std::vector<uint8_t> all(std::accumulate(totals.begin(), totals.end(), size_t{0}));
  c.allgatherv(send, all.data(), totals, kBytes, o);
  size_t chunk = 0, out = 0;
  for (int s = 0; s < w; ++s) {
    size_t off = chunk;
    for (int d = 0; d < r; ++d) off += static_cast<size_t>(S[s * w + d]);
    if (S[s * w + r] > 0) std::memcpy(recv + out, all.data() + off, static_cast<size_t>(S[s * w + r]));
    out += static_cast<size_t>(S[s * w + r]);
    chunk += totals[s];
  }
}

// Equal split sizes when none are given; checks that they cover dim 0.
std::vector<int64_t> splits_or_equal(const std::vector<int64_t>& splits, const at::Tensor& t, int w,
                                     const char* what) {
  TORCH_CHECK(t.dim() >= 1, "gz backend: alltoall_base: ", what, " needs at least one dimension");
  if (splits.empty()) {
    TORCH_CHECK(t.size(0) % w == 0, "gz backend: alltoall_base: ", what, " dim 0 (", t.size(0),
                ") is not divisible by the world size ", w);
    return std::vector<int64_t>(w, t.size(0) / w);
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == w, "gz backend: alltoall_base: ", what, " has ",
              splits.size(), " split sizes for a world of ", w);
  TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == t.size(0),
              "gz backend: alltoall_base: ", what, " split sizes do not add up to dim 0 (", t.size(0), ")");
  return splits;
}

}  // namespace

WorkRef ProcessGroupGz::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                  std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) {
  check_one(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1, "gz backend: allgather takes one output list per process");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "gz backend: allgather needs ", getSize(),
              " output tensors, got ", outputs[0].size());
  const at::Tensor in = inputs[0];
  std::vector<size_t> counts;
  for (const auto& t : outputs[0]) {
    check_cpu(t, "allgather");
    TORCH_CHECK(t.scalar_type() == in.scalar_type(), "gz backend: allgather: output dtype ", t.scalar_type(),
                " differs from the input's ", in.scalar_type());
    counts.push_back(nbytes(t));
  }
  TORCH_CHECK(counts[getRank()] == nbytes(in), "gz backend: allgather: output ", getRank(), " has ",
              outputs[0][getRank()].numel(), " elements, the input ", in.numel());
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(OpType::ALLGATHER, "gz:all_gather", outs, issue(opts.timeout),
                 [in, outs, counts, equal](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor src = dense(in);
                   const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
                   at::Tensor flat =
                       at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
                   if (equal)
                     c.allgather(src.data_ptr(), flat.data_ptr(), counts[0], kBytes, o);
                   else
                     c.allgatherv(src.data_ptr(), flat.data_ptr(), counts, kBytes, o);
                   int64_t off = 0;
                   for (size_t r = 0; r < outs.size(); ++r) {
                     unpack(flat, off, outs[r]);
                     off += static_cast<int64_t>(counts[r]);
                   }
                 });
}

WorkRef ProcessGroupGz::_allgather_base(at::Tensor& output, at::Tensor& input,
                                        const ::c10d::AllgatherOptions& opts) {
  check_cpu(input, "_allgather_base");
  check_cpu(output, "_allgather_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: _allgather_base: output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "gz backend: _allgather_base: output has ",
              output.numel(), " elements, expected world size x ", input.numel());
  at::Tensor in = input, out = output;
  return enqueue(OpType::_ALLGATHER_BASE, "gz:_allgather_base", {output}, issue(opts.timeout),
                 [in, out](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor src = dense(in), dst = dense(out);
                   c.allgather(src.data_ptr(), dst.data_ptr(), nbytes(src), kBytes, o);
                   write_back(out, dst);
                 });
}

WorkRef ProcessGroupGz::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives rank r's inputs[i] (every rank passes tensors of the same sizes).
  const int w = getSize();
  TORCH_CHECK(!inputs.empty(), "gz backend: allgather_coalesced needs at least one input tensor");
  TORCH_CHECK(static_cast<int>(outputs.size()) == w,
              "gz backend: allgather_coalesced needs one output list per rank (", w, "), got ",
              outputs.size());
  check_same_dtype(inputs, "allgather_coalesced");
  for (auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "gz backend: allgather_coalesced: an output list has ",
                list.size(), " tensors for ", inputs.size(), " inputs");
    check_same(list, inputs[0], "allgather_coalesced", "output", /*same_numel=*/false);
    for (size_t i = 0; i < list.size(); ++i)
      TORCH_CHECK(list[i].numel() == inputs[i].numel(), "gz backend: allgather_coalesced: output tensor ", i,
                  " has ", list[i].numel(), " elements, its input ", inputs[i].numel());
  }
  std::vector<at::Tensor> ins = inputs, all_outs;
  for (auto& list : outputs) all_outs.insert(all_outs.end(), list.begin(), list.end());
  return enqueue(OpType::ALLGATHER_COALESCED, "gz:all_gather_coalesced", all_outs, issue(opts.timeout),
                 [ins, all_outs, w](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor send = flat_cat(ins);
                   at::Tensor flat = at::empty({w * send.numel()}, send.options());
                   c.allgather(send.data_ptr(), flat.data_ptr(), nbytes(send), kBytes, o);
                   int64_t off = 0;
                   for (auto& t : all_outs) {
                     t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
                     off += t.numel();
                   }
                 });
}

WorkRef ProcessGroupGz::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                               const ::c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "gz backend: gather root ", root, " out of range [0, ",
              getSize(), ")");
  std::vector<at::Tensor> outs;
  if (root == getRank()) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "gz backend: gather: the root needs one list of ", getSize(), " output tensors");
    check_same(outputs[0], inputs[0], "gather", "output");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "gz backend: gather: only the root passes output tensors");
  }
  const at::Tensor in = inputs[0];
  const int w = getSize();
  // Over all-gather (every rank receives every block): simple, not bandwidth-optimal.
  return enqueue(OpType::GATHER, "gz:gather", outs, issue(opts.timeout),
                 [in, outs, w](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor src = dense(in);
                   at::Tensor flat = at::empty({static_cast<int64_t>(w) * in.numel()}, in.options());
                   c.allgather(src.data_ptr(), flat.data_ptr(), nbytes(src), kBytes, o);
                   for (int r = 0; r < static_cast<int>(outs.size()); ++r)
                     outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
                 });
}

WorkRef ProcessGroupGz::scatter(std::vector<at::Tensor>& outputs,
                                std::vector<std::vector<at::Tensor>>& inputs,
                                const ::c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "gz backend: scatter root ", root, " out of range [0, ",
              getSize(), ")");
  std::vector<at::Tensor> ins;
  if (root == getRank()) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "gz backend: scatter: the root needs one list of ", getSize(), " input tensors");
    check_same(inputs[0], outputs[0], "scatter", "input");
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "gz backend: scatter: only the root passes input tensors");
  }
  at::Tensor out = outputs[0];
  const int w = getSize(), r = getRank();
  // Over a broadcast of the concatenation: simple, not bandwidth-optimal.
  return enqueue(OpType::SCATTER, "gz:scatter", outputs, issue(opts.timeout),
                 [ins, out, w, r, root](Communicator& c, const OpOptions& o) mutable {
                   const int64_t n = out.numel();
                   at::Tensor flat = ins.empty() ? at::empty({w * n}, out.options()) : flat_cat(ins);
                   c.broadcast(flat.data_ptr(), nbytes(flat), kBytes, root, o);
                   out.copy_(flat.narrow(0, r * n, n).view(out.sizes()));
                 });
}

WorkRef ProcessGroupGz::reduce_scatter(std::vector<at::Tensor>& outputs,
                                       std::vector<std::vector<at::Tensor>>& inputs,
                                       const ::c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "gz backend: reduce_scatter needs one list of ", getSize(), " input tensors");
  check_same(inputs[0], outputs[0], "reduce_scatter", "input");
  const ReducePlan plan = plan_reduction(outputs[0], opts.reduceOp, "reduce_scatter");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue(OpType::REDUCE_SCATTER, "gz:reduce_scatter", outputs, issue(opts.timeout),
                 [ins, out, plan](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor dst = dense(out);
                   reduce_scatter_planned(c, flat_cat(ins), dst, plan, o);
                   write_back(out, dst);
                 });
}

WorkRef ProcessGroupGz::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                             const ::c10d::ReduceScatterOptions& opts) {
  check_cpu(input, "_reduce_scatter_base");
  check_cpu(output, "_reduce_scatter_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: _reduce_scatter_base: output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "gz backend: _reduce_scatter_base: input has ",
              input.numel(), " elements, expected world size x ", output.numel());
  const ReducePlan plan = plan_reduction(output, opts.reduceOp, "_reduce_scatter_base");
  at::Tensor in = input, out = output;
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "gz:_reduce_scatter_base", {output}, issue(opts.timeout),
                 [in, out, plan](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor dst = dense(out);
                   reduce_scatter_planned(c, dense(in), dst, plan, o);
                   write_back(out, dst);
                 });
}

WorkRef ProcessGroupGz::alltoall_base(at::Tensor& output, at::Tensor& input,
                                      std::vector<int64_t>& outputSplitSizes,
                                      std::vector<int64_t>& inputSplitSizes,
                                      const ::c10d::AllToAllOptions& opts) {
  check_cpu(input, "alltoall_base");
  check_cpu(output, "alltoall_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: alltoall_base: output dtype ",
              output.scalar_type(), " differs from the input's ", input.scalar_type());
  const int w = getSize();
  auto in_rows = splits_or_equal(inputSplitSizes, input, w, "input");
  auto out_rows = splits_or_equal(outputSplitSizes, output, w, "output");
  const int64_t in_row = input.size(0) ? static_cast<int64_t>(nbytes(input)) / input.size(0) : 0;
  const int64_t out_row = output.size(0) ? static_cast<int64_t>(nbytes(output)) / output.size(0) : 0;
  std::vector<int64_t> send_bytes(w), recv_bytes(w);
  for (int i = 0; i < w; ++i) {
    send_bytes[i] = in_rows[i] * in_row;
    recv_bytes[i] = out_rows[i] * out_row;
  }
  at::Tensor in = input, out = output;
  return enqueue(OpType::ALLTOALL_BASE, "gz:all_to_all", {output}, issue(opts.timeout),
                 [in, out, send_bytes, recv_bytes](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor src = dense(in), dst = dense(out);
                   alltoall_bytes(c, o, static_cast<const uint8_t*>(src.data_ptr()), send_bytes,
                                  static_cast<uint8_t*>(dst.data_ptr()), recv_bytes);
                   write_back(out, dst);
                 });
}

WorkRef ProcessGroupGz::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                 const ::c10d::AllToAllOptions& opts) {
  const int w = getSize();
  TORCH_CHECK(static_cast<int>(outputs.size()) == w && static_cast<int>(inputs.size()) == w,
              "gz backend: alltoall needs ", w, " input and ", w, " output tensors, got ", inputs.size(),
              " and ", outputs.size());
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int i = 0; i < w; ++i) {
    check_cpu(inputs[i], "alltoall");
    check_cpu(outputs[i], "alltoall");
    TORCH_CHECK(inputs[i].scalar_type() == inputs[0].scalar_type() &&
                    outputs[i].scalar_type() == inputs[0].scalar_type(),
                "gz backend: alltoall: all tensors must have one dtype");
    send_bytes.push_back(static_cast<int64_t>(nbytes(inputs[i])));
    recv_bytes.push_back(static_cast<int64_t>(nbytes(outputs[i])));
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::ALLTOALL, "gz:all_to_all", outputs, issue(opts.timeout),
                 [ins, outs, send_bytes, recv_bytes](Communicator& c, const OpOptions& o) mutable {
                   at::Tensor send = flat_cat(ins);
                   const int64_t total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
                   at::Tensor recv = at::empty({total}, at::TensorOptions().dtype(at::kByte));
                   alltoall_bytes(c, o, static_cast<const uint8_t*>(send.data_ptr()), send_bytes,
                                  static_cast<uint8_t*>(recv.data_ptr()), recv_bytes);
                   int64_t off = 0;
                   for (size_t i = 0; i < outs.size(); ++i) {
                     unpack(recv, off, outs[i]);
                     off += recv_bytes[i];
                   }
                 });
}

}  // namespace gz::python
