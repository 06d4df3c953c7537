/* The shared memory of a ProcessPool, described once.  Both sides include
 * this header: the pool's compiled module (pyfunc_bridge/_pool*.so, built
 * from src/pool/ without TensorFlow), which the parent loads too to lay out
 * and read the segments, and the kernel library for native dispatch.  Plain C
 * that also compiles as C++.
 *
 * Each process maps the segments at its own address, so nothing here holds a
 * pointer: blocks travel as offsets into an arena, records sit at indices of
 * a ring.
 *
 * What runs on it: the arenas' allocator (arena.h) and the result arena's
 * NumPy handler; every pool worker maps its control segment and serves its
 * request ring (pyfunc_bridge/worker/ring_server.py, RingServer: LOAD, CALL,
 * RESULTS_BACK, FORGET, answered by DONE and INPUTS_BACK), one call
 * at a time.  The parent's ProcessPool (pyfunc_bridge/pool/) lays the
 * segments out; every call goes on the rings through the native dispatcher
 * (dispatch.h), posted by kernels (src/kernel/pool_route.h) or by Python
 * (src/pool/route.pxi).  The worker's socket carries control and what does
 * not fit an arena or a ring (docs/pool.md).

 * THE SEGMENTS (each a memfd: anonymous, so no exit path leaves a name in
 * /dev/shm; freed when the last process that maps it goes)
 *
 *   input arena     one per pool, of its arena_bytes.  The parent allocates
 *                   blocks in it (its allocator, src/pool/arena.h, lives in
 *                   the parent's private memory) and writes the call's
 *                   inputs; the worker reads them (and the function may
 *                   write the blocks it holds under PFB_POOL_CALL_WRITABLE
 *                   or PFB_POOL_CALL_TORCH).
 *   result arena    one per worker, as large.  The worker allocates
 *                   (its allocator, and NumPy's data-memory handler while a
 *                   function runs: a fresh result is written there by the
 *                   function itself); the parent only reads.
 *   control         one per worker: PfbPoolControl, then the request ring's
 *                   slots, then the reply ring's slots
 *                   (pfb_pool_control_bytes).  The parent lays it out
 *                   before the worker starts.
 *
 * Allocators keep their bookkeeping in their own process, never in shared
 * memory: a peer that crashes or scribbles cannot corrupt the other side's
 * allocator, and a hand-back the allocator does not recognise (a block it
 * never handed out, or one handed back twice) is detected and refused.
 *
 * WHO OWNS A BLOCK, AND WHEN
 *
 * A block is exactly one side's at any time: its allocator's side, in flight,
 * or the receiver's.  The receiver hands it back by its offset (the block's
 * index, offset / PFB_POOL_ALIGN, in units of the alignment), exactly once,
 * in a hand-back message; only the allocating side frees it.
 *
 *   input block     PARENT (allocated, inputs written) -> in flight (posted
 *                   in a CALL, or a LOAD's pickled function) -> WORKER (its
 *                   argument arrays view it) -> handed back in INPUTS_BACK
 *                   when the worker's last view of it dies, which may be long
 *                   after the call if the function kept its input -> PARENT
 *                   frees it.  A caller that stops waiting (timeout, Ctrl-C,
 *                   cancellation) changes nothing: the block is still the
 *                   worker's.  A worker that died holds nothing any more: the
 *                   parent frees its blocks once it has reaped it.
 *   result block    WORKER (allocated by the function through NumPy's
 *                   handler, or by the worker to copy a result that it may
 *                   not share) -> in flight (posted in a DONE) -> PARENT (an
 *                   output tensor's buffer holds it) -> handed back in
 *                   RESULTS_BACK when that buffer is released -> WORKER frees
 *                   it, once its own arrays over it are gone too.  The
 *                   parent's completion path takes the blocks of a DONE whose
 *                   caller stopped waiting and hands them back at once, so an
 *                   abandoned call's blocks go back only when its worker has
 *                   finished with them.  A dead worker's result arena is never
 *                   reused: its replacement gets a fresh one, and the old one
 *                   stays mapped while an output holds a block of it.
 *
 * A result the worker could still change after the call (a global, a cached
 * array, a view of a kept input: anything whose memory did not come from the
 * result arena during this call, or that something else in the worker still
 * references) is copied into a fresh result block, never shared.
 *
 * THE RINGS
 *
 * Each worker has two bounded rings of PFB_POOL_SLOT_BYTES slots in its
 * control segment, each with one producer and one consumer:
 *
 *   requests   parent -> worker: LOAD, CALL, RESULTS_BACK, FORGET.  The
 *              parent's threads take a lock of the parent's own (never one
 *              in shared memory, which a dead peer could leave held) to be
 *              the one producer.
 *   replies    worker -> parent: DONE, INPUTS_BACK.
 *
 * `head` and `tail` count slots since the start and never wrap (2^64); a
 * slot's index is position & (slots - 1), slots a power of two.  A message is
 * one PfbPoolMessage slot followed by `slots - 1` slots of its own (tensor
 * records and their dimensions, or offsets and tokens), consecutive modulo
 * the ring size; it wraps around the end like any slot.  The producer writes
 * the slots, then publishes them by storing `tail` (release); the consumer
 * reads `tail` (acquire), reads the slots, then stores `head` (release),
 * which gives the slots back.
 *
 * Wake-ups (futexes on 32-bit words, FUTEX_WAIT without FUTEX_PRIVATE: the
 * waiter is in another process; except the request ring's consumer, the
 * worker, which waits on its socket too and so polls an eventfd, its
 * "doorbell", that the parent owns and passes to it: the parent's
 * pfb_ring_notify writes the eventfd instead of FUTEX_WAKE, under the same
 * flag protocol, and an eventfd keeps a ring that came before the poll).
 * Nobody spins for long: a consumer looks at the ring a bounded while (the
 * worker for SPIN_NS, yielding its core between looks, RingServer.run; the
 * flag stays clear meanwhile, so a producer rings no one), then sets
 * `consumer_sleeping`, re-checks, and sleeps on `items_wake` with the value
 * it read before setting the flag.  A producer publishes any number of
 * messages, then, once per batch, reads
 * `consumer_sleeping`: only when it is set does it bump `items_wake` and call
 * FUTEX_WAKE (a store of `tail` and a load of the flag on one side, a store
 * of the flag and a load of `tail` on the other, all sequentially consistent:
 * at least one side sees the other's store, so no wake-up is lost).  A
 * producer that finds no room first wakes the consumer as above, if it
 * sleeps (the messages of a batch not notified yet would otherwise never be
 * read, and the room never come), then sleeps the same way on `space_wake`,
 * flagged by `producer_sleeping`, and the consumer wakes it after consuming.
 * `closed` (set by either side when it ends the ring, then both words are
 * bumped and woken) ends every wait.
 *
 * The consumer side is one process, but on the reply ring more than one of
 * its threads may be the consumer, one at a time (the parent's reader role,
 * dispatch_reply.c): the reply thread, or a caller waiting for a call of that
 * worker, which then reads the worker's DONE itself (one wake-up per call,
 * not two).  So `consumer_sleeping` holds a bit per kind of sleeper
 * (PFB_POOL_SLEEPER_*), each set and cleared atomically by its sleeper, and
 * each sleeper waits with FUTEX_WAIT_BITSET and its bit.  A producer that
 * finds PFB_POOL_SLEEPER_CALLER set wakes only that sleeper (it holds the
 * role and reads everything before it sleeps again or gives the role up),
 * otherwise the PFB_POOL_SLEEPER_READER.  The parent's threads may bump
 * `items_wake` too, to wake a caller asleep there whose call moved away.
 */
#ifndef PYFUNC_BRIDGE_POOL_SHM_LAYOUT_H_
#define PYFUNC_BRIDGE_POOL_SHM_LAYOUT_H_

#include <assert.h> /* static_assert, in C11 as in C++ */
#include <stddef.h>
#include <stdint.h>

#define PFB_POOL_MAGIC 0x314c4f4f50424650ULL /* "PFBPOOL1", little-endian */
/* 3: CALL flags name array_function's framework and ask for copy facts,
 * which a DONE's tensor records carry (PFB_POOL_TENSOR_ALIASED ..).
 * 4: a CALL's input, and a LOAD's function, may be pulled over the socket
 * (PFB_POOL_TENSOR_SOCKET, PFB_POOL_LOAD_SOCKET); PFB_POOL_CALL_CUPY.
 * 5: no socket calls (socket_calls_started is gone); PFB_POOL_CALL_PACKED.
 * 6: consumer_sleeping holds PFB_POOL_SLEEPER_* bits, woken by bitset.
 * 7: PFB_POOL_TENSOR_SCALAR.
 * 8: no fields that nobody read (arena sizes, pids, index, worker_ready). */
#define PFB_POOL_LAYOUT_VERSION 8

/* PfbPoolRingWords.consumer_sleeping: who of the consumer's threads sleeps
 * on `items_wake` (its FUTEX_WAIT_BITSET bitset). */
enum {
  /* The ring's own consumer: the worker on its request ring (whose
   * doorbell replaces the futex), the parent's reply thread on a reply ring. */
  PFB_POOL_SLEEPER_READER = 1,
  /* A parent's caller that holds the reply ring's reader role while it
   * waits for its call: woken instead of the reply thread. */
  PFB_POOL_SLEEPER_CALLER = 2
};

/* Every block starts at a multiple of this and is a multiple of it long:
 * PFB_TENSOR_ALIGNMENT (bridge_abi.h), which TensorFlow needs to use memory
 * without a copy.  (Restated rather than included: the worker's module does
 * not see bridge_abi.h; tests/pool/test_pool_arena.py checks that the two agree.) */
#define PFB_POOL_ALIGN 64
#define PFB_POOL_SLOT_BYTES 64
#define PFB_POOL_MAX_NDIM 64
/* The dimensions a tensor record holds itself; the rest follow in
 * PfbPoolDims slots, PFB_POOL_DIMS_PER_SLOT to a slot. */
#define PFB_POOL_INLINE_DIMS 4
#define PFB_POOL_DIMS_PER_SLOT 8
#define PFB_POOL_WORDS_PER_SLOT 8

/* PfbPoolMessage.kind.  Parent -> worker (the request ring): */
enum {
  /* A function: `token`; in the input block (block_offset, block_size),
   * the pickle of (sys.path or None, the function's cloudpickle bytes): the
   * parent's sys.path as it was when the function was registered (ProcessPool
   * always sends it; None leaves the worker's path as it is).  Handed back
   * in INPUTS_BACK once read.  Posted before the first CALL of that token
   * to this worker, in the same ring: it arrives first. */
  PFB_POOL_MSG_LOAD = 1,
  /* A call: `call_id`, `token`, `count` inputs as PfbPoolTensor records in
   * the input arena; flags PFB_POOL_CALL_*; `stamp` the parent's
   * CLOCK_REALTIME ns (time.time_ns(), TF's profiler's clock, one for every
   * process) when it was posted (time queued). */
  PFB_POOL_MSG_CALL = 2,
  /* `count` result-block offsets the parent no longer holds (PfbPoolWords). */
  PFB_POOL_MSG_RESULTS_BACK = 3,
  /* `count` function tokens the parent dropped (PfbPoolWords). */
  PFB_POOL_MSG_FORGET = 4,
  /* (5 is retired: a ProcessPool ends a worker by shutting its socket.) */
  /* Worker -> parent (the reply ring): */
  /* A call finished: `call_id`; status 0: `count` outputs as PfbPoolTensor
   * records in the result arena, flags PFB_POOL_DONE_* say how they were
   * returned; status PFB_POOL_STATUS_ERROR: the exception, pickled, in the
   * result block (block_offset, block_size).  `stamp` and `ended`: the
   * worker's CLOCK_REALTIME ns when it started and finished the call. */
  PFB_POOL_MSG_DONE = 16,
  /* `count` input-block offsets whose last view in the worker died. */
  PFB_POOL_MSG_INPUTS_BACK = 17,
  /* Tests and probes: `count` words (PfbPoolWords), no meaning. */
  PFB_POOL_MSG_WORDS = 31
};

/* PfbPoolMessage.flags of a CALL. */
enum {
  /* copy=True or None: the worker may write its inputs (they are the call's
   * own copies); under copy=False they are read-only, as in-process. */
  PFB_POOL_CALL_WRITABLE = 1,
  /* 0-d inputs reach the function as NumPy scalars (numpy_function's and
   * py_func's graph calls), not as 0-d arrays. */
  PFB_POOL_CALL_SCALARS = 2,
  /* array_function's framework (at most one of the two): the worker hands
   * the function torch tensors or JAX arrays made from the input blocks, and
   * takes its results back as NumPy arrays (pyfunc_bridge/worker/values.py,
   * wrap_input and as_numpy).  Under torch the
   * inputs are writable (torch has no read-only tensors) and a write to one
   * fails the call unless PFB_POOL_CALL_WRITABLE, as in-process. */
  PFB_POOL_CALL_TORCH = 4,
  PFB_POOL_CALL_JAX = 8,
  /* CuPy: the worker hands the function NumPy arrays over the blocks and
   * takes DLPack results back as NumPy arrays (a worker has no GPU context
   * of TensorFlow's to make CuPy arrays over). */
  PFB_POOL_CALL_CUPY = 32,
  PFB_POOL_CALL_FRAMEWORKS = 4 | 8 | 32,
  /* copy=False: the worker sets each result record's copy facts
   * (PFB_POOL_TENSOR_ALIASED ..), which the parent's copy decision judges;
   * without it they are zero (computing them costs the worker time that
   * only copy=False uses). */
  PFB_POOL_CALL_FACTS = 16,
  /* A call whose input records would not fit its ring (more inputs than
   * its slots: pfb_pool_message_fits, records.h): its one record is a
   * PFB_POOL_TENSOR_SOCKET input whose payload is the pickled list of all
   * its inputs, each as a pulled input (input_records.h, PFB_SEND_PACKED), which
   * the function gets as its arguments. */
  PFB_POOL_CALL_PACKED = 64
};

/* PfbPoolMessage.flags of a LOAD. */
enum {
  /* The input arena had no room for the pickle (block 0, 0): the worker
   * pulls it over its socket as it pulls an input (PFB_POOL_TENSOR_SOCKET),
   * by the id ("load", token). */
  PFB_POOL_LOAD_SOCKET = 1
};

/* PfbPoolMessage.flags of a DONE: how the function returned its outputs. */
enum {
  PFB_POOL_DONE_ONE = 0,    /* one value */
  PFB_POOL_DONE_TUPLE = 1,  /* a tuple of `count` */
  PFB_POOL_DONE_LIST = 2    /* a list of `count` */
};

/* PfbPoolMessage.status of a DONE. */
enum {
  PFB_POOL_STATUS_OK = 0,
  PFB_POOL_STATUS_ERROR = 1,  /* the function raised: see PFB_POOL_MSG_DONE */
  /* The answer (results or error) did not fit the result arena, or its
   * records the reply ring (pfb_pool_message_fits, records.h): it went
   * pickled on the worker's socket, as ("ring", call_id, ok, payload, facts),
   * before this DONE (count 0, no block). */
  PFB_POOL_STATUS_SOCKET = 2
};

/* PfbPoolTensor.flags. */
enum {
  /* A string tensor: the block holds its elements in row-major order, each a
   * uint64 little-endian byte count followed by that many bytes, packed (no
   * padding between elements). */
  PFB_POOL_TENSOR_STRINGS = 1,
  /* Not an array: a Python value, pickled, in the block (a result the
   * parent's checks convert or refuse, as for an in-process result). */
  PFB_POOL_TENSOR_PICKLED = 2,
  /* The worker shared the function's own result memory (no copy): for the
   * parent's statistics ("copies saved"). */
  PFB_POOL_TENSOR_SHARED = 4,
  /* The copy facts of a result as the function returned it, before the
   * worker shared or copied it (only under PFB_POOL_CALL_FACTS; the worker's
   * WorkerMemory, pyfunc_bridge/worker/memory.py, computes them for both of
   * its paths, with copy_facts.h's rule).  Each set bit is a reason copy=False refuses the result (the
   * conversion layer's _copy_reason says which and raises); none set: it
   * refuses nothing.
   * ALIASED: memory something else in the worker could still write (a
   * global, a cache, a view of a kept input); STRIDED: not row-major
   * without gaps; UNALIGNED: not at a multiple of PFB_POOL_ALIGN; LAZY: a
   * framework's lazy view (torch's conjugate or negative bit), resolved by
   * a copy. */
  PFB_POOL_TENSOR_ALIASED = 8,
  PFB_POOL_TENSOR_STRIDED = 16,
  PFB_POOL_TENSOR_UNALIGNED = 32,
  PFB_POOL_TENSOR_LAZY = 64,
  PFB_POOL_TENSOR_REFUSED_MASK = 8 | 16 | 32 | 64,
  /* A CALL's input with no block (the input arena had no room for it, or
   * the records cannot describe it): `offset` is a payload id, `size` 0,
   * ndim 0 (the value carries its own dtype and shape).  The worker asks
   * the parent for it on its socket, ("need", id), and reads its socket
   * until ("payload", id, the pickled input or None) comes; None (the caller
   * stopped waiting) fails the call.  Pulled, not pushed, so that any worker
   * may run the call, a resent one included.  Writability, scalars and the
   * framework apply to it as to a block's input. */
  PFB_POOL_TENSOR_SOCKET = 128,
  /* A DONE's result the function returned as a NumPy scalar (np.generic),
   * not as an array: the record holds its 0-d bytes.  The parent's Python
   * path takes it back as a NumPy scalar (pyfunc_bridge/pool/answers.py),
   * so that its checks see, and word, what they see in-process. */
  PFB_POOL_TENSOR_SCALAR = 256
};

/* The first slot of every message. */
typedef struct PfbPoolMessage {
  uint16_t kind;          /* PFB_POOL_MSG_* */
  uint16_t slots;         /* the message's slots, this one included (>= 1) */
  uint32_t count;         /* inputs, outputs, offsets or tokens that follow */
  uint64_t call_id;       /* CALL, DONE: the parent's number of the call */
  uint64_t token;         /* LOAD, CALL: the function */
  uint32_t flags;         /* PFB_POOL_CALL_* or PFB_POOL_DONE_* */
  uint32_t status;        /* DONE: PFB_POOL_STATUS_* */
  uint64_t block_offset;  /* LOAD: the pickle; DONE with an error: the error */
  uint64_t block_size;    /*   (bytes used, not the block's rounded size) */
  uint64_t stamp;         /* CALL: ns posted; DONE: ns the call started */
  uint64_t ended;         /* DONE: ns the call ended; otherwise zero */
} PfbPoolMessage;

/* One input or output: a slot after a CALL or DONE. */
typedef struct PfbPoolTensor {
  uint8_t code;       /* DLPack's code and bits, a row of the dtype     */
  uint8_t bits;       /*   table (src/dtype_table.h); strings:          */
  uint16_t lanes;     /*   PFB_POOL_TENSOR_STRINGS; lanes 1             */
  int32_t ndim;       /* 0 (a 0-d value) .. PFB_POOL_MAX_NDIM */
  uint32_t flags;     /* PFB_POOL_TENSOR_* */
  uint32_t reserved;  /* zero */
  uint64_t offset;    /* the block, in the sender's arena (meaningless when */
  uint64_t size;      /*   size is 0: an empty tensor has no block) */
  int64_t dims[PFB_POOL_INLINE_DIMS];  /* the first dimensions */
} PfbPoolTensor;

/* Dimensions PFB_POOL_INLINE_DIMS.. of the tensor record before it. */
typedef struct PfbPoolDims {
  int64_t dims[PFB_POOL_DIMS_PER_SLOT];
} PfbPoolDims;

/* Offsets or tokens of a RESULTS_BACK, INPUTS_BACK or FORGET. */
typedef struct PfbPoolWords {
  uint64_t words[PFB_POOL_WORDS_PER_SLOT];
} PfbPoolWords;

typedef union PfbPoolSlot {
  PfbPoolMessage message;
  PfbPoolTensor tensor;
  PfbPoolDims dims;
  PfbPoolWords words;
  unsigned char bytes[PFB_POOL_SLOT_BYTES];
} PfbPoolSlot;

/* The words of one ring, each cache line written by one side only (a line
 * that both sides write would bounce between the cores on every message).
 * Read and written with atomic operations only. */
typedef struct PfbPoolRingWords {
  /* Written by the producer. */
  uint64_t tail;               /* slots published */
  uint32_t items_wake;         /* futex: bumped to wake the consumer (and by
                                * the consumer's own threads, see above) */
  uint32_t producer_sleeping;  /* 1 while the producer waits for room */
  unsigned char producer_pad[PFB_POOL_SLOT_BYTES - 16];
  /* Written by the consumer. */
  uint64_t head;               /* slots consumed (their slots are free again) */
  uint32_t space_wake;         /* futex: bumped to wake the producer */
  uint32_t consumer_sleeping;  /* PFB_POOL_SLEEPER_* bits of the consumer's
                                * threads that wait for messages */
  unsigned char consumer_pad[PFB_POOL_SLOT_BYTES - 16];
  /* Written once, by whichever side ends the ring. */
  uint32_t closed;
  unsigned char closed_pad[PFB_POOL_SLOT_BYTES - 4];
} PfbPoolRingWords;

/* The start of a worker's control segment. */
typedef struct PfbPoolControl {
  /* Written by the parent before the worker starts; constant after. */
  uint64_t magic;               /* PFB_POOL_MAGIC */
  uint32_t version;             /* PFB_POOL_LAYOUT_VERSION */
  uint32_t ring_slots;          /* slots per ring, a power of two */
  unsigned char constant_pad[PFB_POOL_SLOT_BYTES - 16];
  /* Written by the worker. */
  /* The call it runs now (a CALL's id), 0 between calls.  The one record
   * the parent reads for scheduling (dispatch_queue.c, pfb_disp_choose) and a pool's
   * timeout (pyfunc_bridge/pool/timeouts.py, Deadlines). */
  uint64_t running_call;
  /* CLOCK_MONOTONIC ns its timeout counts from: when it started, but a
   * grace later while its function loads (timeouts.py, LOAD_GRACE_SECONDS). */
  uint64_t running_since;
  /* The CALLs it started (each counted before it runs).  It runs them in
   * the order they were posted, so when it dies, the parent tells the calls
   * it never started (the later ones) from those it did, and sends them to
   * another worker. */
  uint64_t ring_calls_started;
  unsigned char worker_pad[PFB_POOL_SLOT_BYTES - 24];
  PfbPoolRingWords requests;
  PfbPoolRingWords replies;
  /* Then: PfbPoolSlot request_slots[ring_slots];
   *       PfbPoolSlot reply_slots[ring_slots]; */
} PfbPoolControl;

static_assert(sizeof(PfbPoolMessage) == PFB_POOL_SLOT_BYTES, "one slot");
static_assert(sizeof(PfbPoolTensor) == PFB_POOL_SLOT_BYTES, "one slot");
static_assert(sizeof(PfbPoolDims) == PFB_POOL_SLOT_BYTES, "one slot");
static_assert(sizeof(PfbPoolSlot) == PFB_POOL_SLOT_BYTES, "one slot");
static_assert(sizeof(PfbPoolRingWords) == 3 * PFB_POOL_SLOT_BYTES, "one cache line per writer");
static_assert(sizeof(PfbPoolControl) == 8 * PFB_POOL_SLOT_BYTES,
              "the slots start on a cache line");
static_assert(PFB_POOL_ALIGN % 8 == 0, "offsets of aligned blocks");

/* The slots a tensor record of `ndim` dimensions takes, itself included. */
static inline uint32_t pfb_pool_tensor_slots(int32_t ndim) {
  return ndim <= PFB_POOL_INLINE_DIMS
             ? 1u
             : 1u + (uint32_t)(ndim - PFB_POOL_INLINE_DIMS + PFB_POOL_DIMS_PER_SLOT - 1) /
                        PFB_POOL_DIMS_PER_SLOT;
}

/* The bytes of a control segment with `ring_slots` slots per ring. */
static inline uint64_t pfb_pool_control_bytes(uint32_t ring_slots) {
  return sizeof(PfbPoolControl) + 2 * (uint64_t)ring_slots * PFB_POOL_SLOT_BYTES;
}

/* The request and reply slots of a mapped control segment. */
static inline PfbPoolSlot* pfb_pool_request_slots(PfbPoolControl* control) {
  return (PfbPoolSlot*)(control + 1);
}
static inline PfbPoolSlot* pfb_pool_reply_slots(PfbPoolControl* control) {
  return pfb_pool_request_slots(control) + control->ring_slots;
}

#endif /* PYFUNC_BRIDGE_POOL_SHM_LAYOUT_H_ */
