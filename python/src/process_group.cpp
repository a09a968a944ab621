#include "process_group.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <numeric>

#include "gz/comm/factory.h"
#include "gz/core/error.h"
#include "store_adapter.h"
#include "tensor_span.h"

namespace gz::python {

using ::c10d::OpType;
using gz::comm::Communicator;
using gz::comm::OpOptions;
using WorkRef = c10::intrusive_ptr<::c10d::Work>;

namespace {

/// Data-movement ops move any dtype as bytes.
constexpr gz::DType kBytes = gz::DType::u8;

/// Tensor whose memory the op may use directly: t itself when contiguous, else a copy.
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

/// After an op wrote into `buf` (from dense(t)): copy back when buf is a copy.
void write_back(at::Tensor& t, const at::Tensor& buf) {
  if (!buf.is_same(t)) t.copy_(buf);
}

void check_one(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(ts.size() == 1, "gz backend: ", op, " takes exactly one tensor per process (got ", ts.size(), ")");
  check_cpu(ts[0], op);
}

/// Byte-level all-to-all on the calling (progress) thread: rank r sends send_bytes[d] bytes of
/// `send` (in order of d) to every d and receives recv_bytes[s] from every s into `recv`.
/// Implemented over allgather(v): simple and deadlock-free, at the cost of every rank receiving
/// every block (fine for small worlds; not an optimal all-to-all).
void alltoall_bytes(Communicator* c, const OpOptions& o, const uint8_t* send, const std::vector<int64_t>& send_bytes,
                    uint8_t* recv, const std::vector<int64_t>& recv_bytes) {
  const int w = c->size(), r = c->rank();
  // Everyone's send sizes: S[src * w + dst].
  std::vector<int64_t> S(static_cast<size_t>(w) * w);
  c->allgather(send_bytes.data(), S.data(), w, gz::DType::i64, o);
  std::vector<size_t> totals(w);
  for (int s = 0; s < w; ++s) {
    int64_t tot = 0;
    for (int d = 0; d < w; ++d) tot += S[s * w + d];
    totals[s] = static_cast<size_t>(tot);
  }
  for (int s = 0; s < w; ++s)
    if (S[s * w + r] != recv_bytes[s])
      GZ_THROW(gz::InvalidArgument, "alltoall: rank ", r, " expects ", recv_bytes[s], " bytes from rank ", s,
               " which sends ", S[s * w + r]);
  std::vector<uint8_t> all(std::accumulate(totals.begin(), totals.end(), size_t{0}));
  c->allgatherv(send, all.data(), totals, kBytes, o);
  size_t chunk = 0, out = 0;
  for (int s = 0; s < w; ++s) {
    size_t off = chunk;
    for (int d = 0; d < r; ++d) off += static_cast<size_t>(S[s * w + d]);
    std::memcpy(recv + out, all.data() + off, static_cast<size_t>(S[s * w + r]));
    out += static_cast<size_t>(S[s * w + r]);
    chunk += totals[s];
  }
}

/// Equal split sizes when none are given; checks they cover dim 0.
std::vector<int64_t> splits_or_equal(const std::vector<int64_t>& splits, const at::Tensor& t, int w, const char* what) {
  TORCH_CHECK(t.dim() >= 1, "gz backend: alltoall_base: ", what, " needs at least one dimension");
  if (splits.empty()) {
    TORCH_CHECK(t.size(0) % w == 0, "gz backend: alltoall_base: ", what, " dim 0 (", t.size(0),
                ") is not divisible by the world size ", w);
    return std::vector<int64_t>(w, t.size(0) / w);
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == w, "gz backend: alltoall_base: ", what, " has ", splits.size(),
              " split sizes for a world of ", w);
  TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == t.size(0), "gz backend: alltoall_base: ",
              what, " split sizes do not add up to dim 0 (", t.size(0), ")");
  return splits;
}

}  // namespace

// ---- GzWork ----

GzWork::GzWork(int rank, OpType type, std::vector<at::Tensor> outputs)
    : ::c10d::Work(rank, type), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool GzWork::isCompleted() { return work_ ? work_->is_completed() : future_->completed(); }

bool GzWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr GzWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

bool GzWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0)
    work_->wait(Deadline::after(std::chrono::duration_cast<Duration>(timeout)));
  else
    work_->wait();
  return true;
}

void GzWork::abort() {
  TORCH_CHECK(false, "gz backend: Work.abort() is not supported; the op ends at its own deadline "
                     "(abort the whole group with guozhuang.abort(group) instead)");
}

int GzWork::sourceRank() const {
  TORCH_CHECK(source_rank_ >= 0, "gz backend: sourceRank() is only defined for recv");
  return source_rank_;
}

// ---- ProcessGroupGz ----

ProcessGroupGz::ProcessGroupGz(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                               GzGroupOptions options)
    : GzBackendBase(rank, size), options_(std::move(options)) {
  gz::comm::CommOptions co;
  co.backend = options_.backend;
  co.rank = rank;
  co.size = size;
  co.timeout = std::chrono::duration_cast<Duration>(options_.timeout);
  co.store = std::make_shared<C10dStoreAdapter>(store);
  co.store->set_timeout(co.timeout);
  comm_ = gz::comm::create_communicator(co);
}

ProcessGroupGz::~ProcessGroupGz() {
  // Destroying the communicator aborts what is still pending and waits until it has returned;
  // after that no queued op can run, so their futures are failed here.
  comm_.reset();
  fail_pending("gz process group destroyed with the op still queued");
}

void ProcessGroupGz::fail_pending(const std::string& why) {
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending.swap(pending_);
  }
  for (auto& p : pending)
    if (!p.done->exchange(true))
      p.future->setErrorIfNeeded(std::make_exception_ptr(gz::Aborted("gz backend: " + why)));
}

OpOptions ProcessGroupGz::issue(std::chrono::milliseconds timeout, int tag) const {
  OpOptions o;
  o.deadline = Deadline::after(timeout.count() > 0 ? std::chrono::duration_cast<Duration>(timeout)
                                                   : comm_->timeout());
  o.tag = tag;
  return o;
}

c10::intrusive_ptr<GzWork> ProcessGroupGz::enqueue(OpType type, std::vector<at::Tensor> outputs, const OpOptions& o,
                                                   std::function<void()> fn) {
  auto work = c10::make_intrusive<GzWork>(getRank(), type, outputs);
  auto fut = work->future_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    // Forget completed ops now and then (the list only matters for ops that never run).
    if (pending_.size() >= 64)
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.done->load(); }),
                     pending_.end());
    pending_.push_back({fut, done});
  }
  // The future completes on the progress thread; DDP's reducer chains its bucket work on it.
  work->work_ = comm_->submit(
      [fn = std::move(fn), fut, done, outputs = std::move(outputs)] {
        try {
          fn();
        } catch (...) {
          if (!done->exchange(true)) fut->setError(std::current_exception());
          throw;
        }
        if (!done->exchange(true)) fut->markCompleted(c10::IValue(outputs));
      },
      o);
  return work;
}

WorkRef ProcessGroupGz::broadcast(std::vector<at::Tensor>& tensors, const ::c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "gz backend: broadcast root ", opts.rootRank,
              " out of range");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor t = tensors[0];
  int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, tensors, o, [c, o, t, root]() mutable {
    at::Tensor buf = dense(t);
    c->broadcast(buf.data_ptr(), nbytes(buf), kBytes, root, o);
    write_back(t, buf);
  });
}

WorkRef ProcessGroupGz::allreduce(std::vector<at::Tensor>& tensors, const ::c10d::AllreduceOptions& opts) {
  check_one(tensors, "allreduce");
  const auto dt = reduce_dtype(tensors[0], "allreduce");
  const auto op = reduce_op(opts.reduceOp, "allreduce");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor t = tensors[0];
  return enqueue(OpType::ALLREDUCE, tensors, o, [c, o, t, dt, op]() mutable {
    at::Tensor buf = dense(t);
    c->allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dt, op, o);
    write_back(t, buf);
  });
}

WorkRef ProcessGroupGz::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                            const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "gz backend: allreduce_coalesced needs at least one tensor");
  std::vector<gz::DType> dts;
  for (auto& t : tensors) {
    check_cpu(t, "allreduce_coalesced");
    dts.push_back(reduce_dtype(t, "allreduce_coalesced"));
  }
  const auto op = reduce_op(opts.reduceOp, "allreduce_coalesced");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  std::vector<at::Tensor> ts = tensors;
  return enqueue(OpType::ALLREDUCE_COALESCED, tensors, o, [c, o, ts, dts, op]() mutable {
    // One flat buffer per run of equal dtypes would save calls; tensors here are few.
    for (size_t i = 0; i < ts.size(); ++i) {
      at::Tensor buf = dense(ts[i]);
      c->allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dts[i], op, o);
      write_back(ts[i], buf);
    }
  });
}

WorkRef ProcessGroupGz::reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "gz backend: reduce root ", opts.rootRank,
              " out of range");
  const auto dt = reduce_dtype(tensors[0], "reduce");
  const auto op = reduce_op(opts.reduceOp, "reduce");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor t = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  return enqueue(OpType::REDUCE, tensors, o, [c, o, t, dt, op, root, is_root]() mutable {
    // Our reduce leaves non-root buffers unspecified; torch users expect their input kept.
    at::Tensor buf = is_root ? dense(t) : t.contiguous().clone();
    c->reduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), dt, op, root, o);
    if (is_root) write_back(t, buf);
  });
}

WorkRef ProcessGroupGz::allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                  const ::c10d::AllgatherOptions& opts) {
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
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  std::vector<at::Tensor> outs = outputs[0];
  return enqueue(OpType::ALLGATHER, outs, o, [c, o, in, outs, counts, equal]() mutable {
    at::Tensor src = dense(in);
    const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
    at::Tensor flat = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
    if (equal)
      c->allgather(src.data_ptr(), flat.data_ptr(), counts[0], kBytes, o);
    else
      c->allgatherv(src.data_ptr(), flat.data_ptr(), counts, kBytes, o);
    size_t off = 0;
    for (size_t r = 0; r < outs.size(); ++r) {
      at::Tensor piece = flat.narrow(0, static_cast<int64_t>(off), static_cast<int64_t>(counts[r]));
      if (counts[r] > 0) outs[r].copy_(piece.view(outs[r].scalar_type()).view(outs[r].sizes()));
      off += counts[r];
    }
  });
}

WorkRef ProcessGroupGz::_allgather_base(at::Tensor& output, at::Tensor& input, const ::c10d::AllgatherOptions& opts) {
  check_cpu(input, "_allgather_base");
  check_cpu(output, "_allgather_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: _allgather_base: dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * getSize(), "gz backend: _allgather_base: output has ",
              output.numel(), " elements, expected world size x ", input.numel());
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor in = input, out = output;
  return enqueue(OpType::_ALLGATHER_BASE, {output}, o, [c, o, in, out]() mutable {
    at::Tensor src = dense(in), dst = dense(out);
    c->allgather(src.data_ptr(), dst.data_ptr(), nbytes(src), kBytes, o);
    write_back(out, dst);
  });
}

WorkRef ProcessGroupGz::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                            std::vector<at::Tensor>& inputs, const ::c10d::AllgatherOptions& opts) {
  // outputs[i][r] receives rank r's inputs[i]... torch 1.13 documents outputs as one list per
  // input; each is an ordinary all-gather, run back to back.
  TORCH_CHECK(outputs.size() == inputs.size(), "gz backend: allgather_coalesced: ", outputs.size(),
              " output lists for ", inputs.size(), " inputs");
  c10::intrusive_ptr<::c10d::Work> last;
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<std::vector<at::Tensor>> out{outputs[i]};
    std::vector<at::Tensor> in{inputs[i]};
    last = allgather(out, in, opts);
  }
  TORCH_CHECK(last, "gz backend: allgather_coalesced needs at least one tensor");
  return last;  // ops complete in order: the last one done means all are done
}

WorkRef ProcessGroupGz::gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                               const ::c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "gz backend: gather root ", root, " out of range");
  const bool is_root = root == getRank();
  std::vector<at::Tensor> outs;
  if (is_root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "gz backend: gather: the root needs one list of ", getSize(), " output tensors");
    check_same(outputs[0], inputs[0], "gather", "output");
    outs = outputs[0];
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "gz backend: gather: only the root passes output tensors");
  }
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  const at::Tensor in = inputs[0];
  const int w = getSize();
  // Over allgather (every rank receives every block): simple and correct, not bandwidth-optimal.
  return enqueue(OpType::GATHER, outs, o, [c, o, in, outs, w]() mutable {
    at::Tensor src = dense(in);
    at::Tensor flat = at::empty({static_cast<int64_t>(w) * in.numel()}, in.options());
    c->allgather(src.data_ptr(), flat.data_ptr(), nbytes(src), kBytes, o);
    for (int r = 0; r < static_cast<int>(outs.size()); ++r)
      outs[r].copy_(flat.narrow(0, r * in.numel(), in.numel()).view(outs[r].sizes()));
  });
}

WorkRef ProcessGroupGz::scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                const ::c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "gz backend: scatter root ", root, " out of range");
  const bool is_root = root == getRank();
  std::vector<at::Tensor> ins;
  if (is_root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "gz backend: scatter: the root needs one list of ", getSize(), " input tensors");
    check_same(inputs[0], outputs[0], "scatter", "input");
    ins = inputs[0];
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "gz backend: scatter: only the root passes input tensors");
  }
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor out = outputs[0];
  const int w = getSize(), r = getRank();
  // Over broadcast of the concatenation: simple and correct, not bandwidth-optimal.
  return enqueue(OpType::SCATTER, outputs, o, [c, o, ins, out, w, r, root]() mutable {
    const int64_t n = out.numel();
    at::Tensor flat = ins.empty() ? at::empty({w * n}, out.options())
                                  : at::cat([&] {
                                      std::vector<at::Tensor> v;
                                      for (auto& t : ins) v.push_back(t.reshape({-1}));
                                      return v;
                                    }());
    c->broadcast(flat.data_ptr(), nbytes(flat), kBytes, root, o);
    out.copy_(flat.narrow(0, r * n, n).view(out.sizes()));
  });
}

WorkRef ProcessGroupGz::reduce_scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                       const ::c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "gz backend: reduce_scatter needs one list of ", getSize(), " input tensors");
  check_same(inputs[0], outputs[0], "reduce_scatter", "input");
  const auto dt = reduce_dtype(outputs[0], "reduce_scatter");
  const auto op = reduce_op(opts.reduceOp, "reduce_scatter");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins = inputs[0];
  return enqueue(OpType::REDUCE_SCATTER, outputs, o, [c, o, ins, out, dt, op]() mutable {
    std::vector<at::Tensor> flat;
    for (auto& t : ins) flat.push_back(t.reshape({-1}));
    at::Tensor send = at::cat(flat);
    at::Tensor dst = dense(out);
    c->reduce_scatter(send.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()), dt, op, o);
    write_back(out, dst);
  });
}

WorkRef ProcessGroupGz::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                             const ::c10d::ReduceScatterOptions& opts) {
  check_cpu(input, "_reduce_scatter_base");
  check_cpu(output, "_reduce_scatter_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: _reduce_scatter_base: dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * getSize(), "gz backend: _reduce_scatter_base: input has ",
              input.numel(), " elements, expected world size x ", output.numel());
  const auto dt = reduce_dtype(output, "_reduce_scatter_base");
  const auto op = reduce_op(opts.reduceOp, "_reduce_scatter_base");
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor in = input, out = output;
  return enqueue(OpType::_REDUCE_SCATTER_BASE, {output}, o, [c, o, in, out, dt, op]() mutable {
    at::Tensor src = dense(in), dst = dense(out);
    c->reduce_scatter(src.data_ptr(), dst.data_ptr(), static_cast<size_t>(dst.numel()), dt, op, o);
    write_back(out, dst);
  });
}

WorkRef ProcessGroupGz::alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
                                      std::vector<int64_t>& inputSplitSizes, const ::c10d::AllToAllOptions& opts) {
  check_cpu(input, "alltoall_base");
  check_cpu(output, "alltoall_base");
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "gz backend: alltoall_base: dtypes differ");
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
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  at::Tensor in = input, out = output;
  return enqueue(OpType::ALLTOALL_BASE, {output}, o, [c, o, in, out, send_bytes, recv_bytes]() mutable {
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
              "gz backend: alltoall needs ", w, " input and ", w, " output tensors");
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
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  return enqueue(OpType::ALLTOALL, outputs, o, [c, o, ins, outs, send_bytes, recv_bytes]() mutable {
    std::vector<at::Tensor> flat;
    for (auto& t : ins) flat.push_back(t.reshape({-1}));
    at::Tensor send = at::cat(flat);
    int64_t total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
    at::Tensor recv = at::empty({total}, at::TensorOptions().dtype(at::kByte));
    alltoall_bytes(c, o, static_cast<const uint8_t*>(send.data_ptr()), send_bytes,
                   static_cast<uint8_t*>(recv.data_ptr()), recv_bytes);
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      if (recv_bytes[i] > 0)
        outs[i].copy_(recv.narrow(0, off, recv_bytes[i]).view(outs[i].scalar_type()).view(outs[i].sizes()));
      off += recv_bytes[i];
    }
  });
}

WorkRef ProcessGroupGz::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  check_one(tensors, "send");
  TORCH_CHECK(dstRank >= 0 && dstRank < getSize() && dstRank != getRank(), "gz backend: send to invalid rank ",
              dstRank);
  auto o = issue(std::chrono::milliseconds(0), tag);
  Communicator* c = comm_.get();
  at::Tensor t = tensors[0];
  return enqueue(OpType::SEND, tensors, o, [c, o, t, dstRank]() {
    at::Tensor buf = dense(t);
    c->send(buf.data_ptr(), nbytes(buf), kBytes, dstRank, o);
  });
}

WorkRef ProcessGroupGz::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  check_one(tensors, "recv");
  TORCH_CHECK(srcRank >= 0 && srcRank < getSize() && srcRank != getRank(), "gz backend: recv from invalid rank ",
              srcRank);
  auto o = issue(std::chrono::milliseconds(0), tag);
  Communicator* c = comm_.get();
  at::Tensor t = tensors[0];
  auto work = enqueue(OpType::RECV, tensors, o, [c, o, t, srcRank]() mutable {
    at::Tensor buf = dense(t);
    c->recv(buf.data_ptr(), nbytes(buf), kBytes, srcRank, o);
    write_back(t, buf);
  });
  work->source_rank_ = srcRank;
  return work;
}

WorkRef ProcessGroupGz::barrier(const ::c10d::BarrierOptions& opts) {
  auto o = issue(opts.timeout);
  Communicator* c = comm_.get();
  return enqueue(OpType::BARRIER, {}, o, [c, o]() { c->barrier(o); });
}

}  // namespace gz::python
