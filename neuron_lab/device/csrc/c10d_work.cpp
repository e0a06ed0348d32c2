// A c10d Work over a future that raises the collective's error from wait(), for the neuron
// collective backend (neuron_lab/distributed/collectives.py).
//
// PyTorch's Work for Python backends (`_create_work_from_future`, FutureWrappingWork) waits for
// the future and returns true even when it completed with an error, so a failed asynchronous
// collective (a timeout, a dead peer) was silently "done" for `work.wait()`. gloo's and NCCL's
// own works raise there; this one does too. The future is the one the backend builds (its value
// is the neuron tensors, which DDP's reducer reads); completion, success and the exception are
// the future's.
//
// Exposed as the op `neuron_lab_c10d::work_from_future(Future(Tensor[]) fut) -> Work` so that
// the dispatcher converts the Python future and the Work (a TorchScript class) both ways.
#include <ATen/core/ivalue.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

namespace neuron_lab {
namespace {

class RaisingFutureWork : public c10d::Work {
 public:
  explicit RaisingFutureWork(c10::intrusive_ptr<c10::ivalue::Future> fut) : fut_(std::move(fut)) {}

  bool isCompleted() override { return fut_->completed(); }
  bool isSuccess() const override { return fut_->completed() && !fut_->hasError(); }
  std::exception_ptr exception() const override { return fut_->exception_ptr(); }
  bool wait(std::chrono::milliseconds /*timeout: the group's, enforced by the transport*/) override {
    fut_->wait();
    if (fut_->hasError()) {
      std::rethrow_exception(fut_->exception_ptr());
    }
    return true;
  }
  std::vector<at::Tensor> result() override { return fut_->value().toTensorVector(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }
  void synchronize() override {}

 private:
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

// boxed: a Future argument has no unboxed C++ signature the dispatcher can infer
void work_from_future(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto fut = torch::jit::pop(*stack).toFuture();
  torch::jit::push(*stack, c10::IValue(c10::intrusive_ptr<c10d::Work>(
                               c10::make_intrusive<RaisingFutureWork>(std::move(fut)))));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(neuron_lab_c10d, m) {
  m.def("work_from_future(Future(Tensor[]) fut) -> __torch__.torch.classes.c10d.Work",
        torch::CppFunction::makeFromBoxedFunction<&work_from_future>());
}

void init_c10d_work(pybind11::module_&) {}  // the op above registers when the module loads

}  // namespace neuron_lab
