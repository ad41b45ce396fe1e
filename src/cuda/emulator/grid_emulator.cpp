#include "cuda/emulator/grid_emulator.hpp"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KA_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KA_ASAN_FIBERS 1
#endif
#endif
#if defined(KA_ASAN_FIBERS)
#include <sanitizer/common_interface_defs.h>
#endif

namespace kernel_align::cuda::emulation {
namespace {

// Kernel bodies keep a few arrays of a row's values: far below this even under ASan.
constexpr std::size_t kStackBytes = std::size_t{256} << 10;

// An execution context (a fiber's or the scheduler's) and the switch between two. On
// x86-64 a switch saves the callee-saved registers, MXCSR and the x87 control word on the
// old stack and restores them from the new one: a few nanoseconds, where swapcontext
// also saves the signal mask with a system call each time (it dominated the emulated
// tests' time). Elsewhere, ucontext.
#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};

extern "C" void ka_emulator_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl ka_emulator_switch
  .type ka_emulator_switch, @function
ka_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ka_emulator_switch, .-ka_emulator_switch
)");

void switch_context(Context& from, Context& to) {
  ka_emulator_switch(&from.sp, to.sp);
}

// A context that starts `entry` on the stack [stack, stack + size), with the caller's
// floating-point control state. The frame ka_emulator_switch pops: the control words,
// six zeroed registers, then `entry` as the return address (16-byte aligned, so that
// entry starts with the stack the ABI gives a called function).
void make_context(Context& c, unsigned char* stack, std::size_t size, void (*entry)()) {
  unsigned char* top = stack + size;
  top -= reinterpret_cast<std::uintptr_t>(top) % 16;
  auto* return_slot = reinterpret_cast<std::uint64_t*>(top - 16);
  return_slot[1] = 0;  // entry never returns
  return_slot[0] = reinterpret_cast<std::uint64_t>(entry);
  std::uint64_t* frame = return_slot - 7;
  for (int i = 1; i < 7; ++i) frame[i] = 0;
  std::uint32_t mxcsr = 0;
  std::uint16_t control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(control));
  frame[0] = mxcsr | (std::uint64_t{control} << 32);
  c.sp = frame;
}
#else
struct Context {
  ucontext_t context{};
};

void switch_context(Context& from, Context& to) {
  swapcontext(&from.context, &to.context);
}

void make_context(Context& c, unsigned char* stack, std::size_t size, void (*entry)()) {
  getcontext(&c.context);
  c.context.uc_stack.ss_sp = stack;
  c.context.uc_stack.ss_size = size;
  c.context.uc_link = nullptr;  // fibers end by switching to the scheduler themselves
  makecontext(&c.context, entry, 0);
}
#endif

struct Barrier {
  unsigned arrived = 0;
  std::uint64_t generation = 0;
};

struct Fiber {
  Context context;
  unsigned char* stack = nullptr;
  bool done = false;
};

// One block being run: its fibers, barriers and shuffle slots.
struct BlockRun {
  unsigned block_x = 0, block_y = 0, block_z = 0, threads = 0;
  Dim3 grid;
  void* shared = nullptr;
  unsigned char* dynamic_shared = nullptr;
  const std::function<void(void*)>* body = nullptr;
  std::vector<Fiber> fibers;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<float> slots;  // one per thread: the value it offers to a shuffle
  Context scheduler;
  unsigned running = 0;  // the fiber being run
  unsigned finished = 0;
  bool progress = false;
  std::uint64_t switches = 0;
  std::exception_ptr error;
#if defined(KA_ASAN_FIBERS)
  const void* scheduler_stack = nullptr;
  std::size_t scheduler_stack_size = 0;
#endif
};

thread_local BlockRun* current = nullptr;

// Fiber stacks, kept across blocks and launches (untouched pages cost nothing).
std::vector<std::unique_ptr<unsigned char[]>>& stack_pool() {
  thread_local std::vector<std::unique_ptr<unsigned char[]>> pool;
  return pool;
}

// From a fiber back to the scheduler; `dying` when the fiber will never resume.
void to_scheduler(BlockRun& run, bool dying) {
  ++run.switches;
#if defined(KA_ASAN_FIBERS)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(dying ? nullptr : &fake_stack, run.scheduler_stack,
                                 run.scheduler_stack_size);
  switch_context(run.fibers[run.running].context, run.scheduler);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  (void)dying;
  switch_context(run.fibers[run.running].context, run.scheduler);
#endif
}

// From the scheduler into fiber `f`.
void to_fiber(BlockRun& run, unsigned f) {
  run.running = f;
  ++run.switches;
#if defined(KA_ASAN_FIBERS)
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, run.fibers[f].stack, kStackBytes);
  switch_context(run.scheduler, run.fibers[f].context);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
  switch_context(run.scheduler, run.fibers[f].context);
#endif
}

void fiber_entry() {
  BlockRun& run = *current;
#if defined(KA_ASAN_FIBERS)
  __sanitizer_finish_switch_fiber(nullptr, &run.scheduler_stack, &run.scheduler_stack_size);
#endif
  try {
    (*run.body)(run.shared);
  } catch (...) {
    if (!run.error) run.error = std::current_exception();
  }
  Fiber& self = run.fibers[run.running];
  self.done = true;
  ++run.finished;
  run.progress = true;
  if (!run.error && run.block_barrier.arrived > 0) {
    run.error = std::make_exception_ptr(
        std::logic_error("emulated CUDA: thread " + std::to_string(run.running) +
                         " returned while other threads of its block wait at __syncthreads"));
  }
  to_scheduler(run, true);
}

// Arrives at `b` (of `count` threads) and waits until the last one has arrived.
void arrive_and_wait(BlockRun& run, Barrier& b, unsigned count) {
  const std::uint64_t generation = b.generation;
  run.progress = true;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  while (b.generation == generation) to_scheduler(run, false);
}

BlockRun& running() {
  if (current == nullptr) {
    throw std::logic_error("emulated CUDA: a grid function called outside an emulated launch");
  }
  return *current;
}

std::string stuck_threads(const BlockRun& run) {
  std::string text = "emulated CUDA: deadlock in block (" + std::to_string(run.block_x) + ", " +
                     std::to_string(run.block_y) + "): " + std::to_string(run.finished) + " of " +
                     std::to_string(run.threads) + " threads returned, " +
                     std::to_string(run.block_barrier.arrived) + " wait at __syncthreads";
  for (std::size_t w = 0; w < run.warp_barriers.size(); ++w) {
    if (run.warp_barriers[w].arrived > 0) {
      text += ", " + std::to_string(run.warp_barriers[w].arrived) + " lanes of warp " +
              std::to_string(w) + " wait at a shuffle";
    }
  }
  return text + " (a barrier that not every thread reaches)";
}

void run_block(BlockRun& run) {
  auto& pool = stack_pool();
  while (pool.size() < run.threads) pool.emplace_back(new unsigned char[kStackBytes]);
  run.fibers.assign(run.threads, Fiber{});
  for (unsigned t = 0; t < run.threads; ++t) {
    Fiber& f = run.fibers[t];
    f.stack = pool[t].get();
    make_context(f.context, f.stack, kStackBytes, fiber_entry);
  }
  while (run.finished < run.threads) {
    run.progress = false;
    for (unsigned t = 0; t < run.threads; ++t) {
      if (run.fibers[t].done) continue;
      to_fiber(run, t);
      if (run.error) std::rethrow_exception(run.error);
    }
    if (!run.progress) throw std::logic_error(stuck_threads(run));
  }
}

}  // namespace

unsigned EmulatedGrid::thread() {
  return running().running;
}
unsigned EmulatedGrid::threads() {
  return running().threads;
}
unsigned EmulatedGrid::block() {
  return running().block_x;
}
unsigned EmulatedGrid::block_y() {
  return running().block_y;
}
unsigned EmulatedGrid::block_z() {
  return running().block_z;
}
unsigned EmulatedGrid::blocks() {
  return running().grid.x;
}
unsigned EmulatedGrid::blocks_y() {
  return running().grid.y;
}
unsigned EmulatedGrid::blocks_z() {
  return running().grid.z;
}
unsigned char* EmulatedGrid::dynamic_shared() {
  return running().dynamic_shared;
}

void EmulatedGrid::sync() {
  BlockRun& run = running();
  arrive_and_wait(run, run.block_barrier, run.threads);
}

float EmulatedGrid::shfl_xor(float value, unsigned lane_mask) {
  BlockRun& run = running();
  if (lane_mask >= kWarpSize) {
    throw std::logic_error("emulated CUDA: shuffle lane mask " + std::to_string(lane_mask) +
                           " leaves the warp");
  }
  const unsigned self = run.running;
  Barrier& warp = run.warp_barriers[self / kWarpSize];
  // Lockstep: every lane offers its value, then every lane reads its partner's, and no
  // lane offers the next value before all have read.
  run.slots[self] = value;
  arrive_and_wait(run, warp, kWarpSize);
  const float partner = run.slots[self ^ lane_mask];
  arrive_and_wait(run, warp, kWarpSize);
  return partner;
}

LaunchStats run_grid(Dim3 grid, Dim3 block, std::size_t shared_bytes,
                     std::size_t dynamic_shared_bytes, const std::function<void(void*)>& body) {
  if (block.y != 1 || block.z != 1) throw std::logic_error("emulated CUDA: blocks are 1-D here");
  if (block.x == 0 || block.x % kWarpSize != 0 || block.x > 1024) {
    throw std::logic_error("emulated CUDA: block size " + std::to_string(block.x) +
                           " (expected a multiple of 32 up to 1024)");
  }
  if (current != nullptr) throw std::logic_error("emulated CUDA: a launch inside a launch");
  LaunchStats stats;
  std::vector<unsigned char> shared(shared_bytes == 0 ? 1 : shared_bytes);
  // 16-byte aligned, as a device's dynamic shared memory is.
  std::vector<float> dynamic_shared((dynamic_shared_bytes + 15) / 16 * 4);
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        BlockRun run;
        run.block_x = bx;
        run.block_y = by;
        run.block_z = bz;
        run.threads = block.x;
        run.grid = grid;
        // Uninitialised shared memory: NaNs.
        std::memset(shared.data(), 0xFF, shared.size());
        if (!dynamic_shared.empty()) {  // (an empty vector's data() may be null)
          std::memset(dynamic_shared.data(), 0xFF, dynamic_shared.size() * sizeof(float));
        }
        run.shared = shared.data();
        run.dynamic_shared = dynamic_shared_bytes == 0
                                 ? nullptr
                                 : reinterpret_cast<unsigned char*>(dynamic_shared.data());
        run.body = &body;
        run.warp_barriers.assign(block.x / kWarpSize, Barrier{});
        run.slots.assign(block.x, 0.0f);
        current = &run;
        try {
          run_block(run);
        } catch (...) {
          current = nullptr;
          throw;
        }
        current = nullptr;
        ++stats.blocks;
        stats.fiber_switches += run.switches;
      }
    }
  }
  return stats;
}

}  // namespace kernel_align::cuda::emulation
