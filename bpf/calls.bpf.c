/* calls: host-side duration of library calls, one uprobe/uretprobe pair per symbol.
 *
 * Loaded by the `cuda` probe (libcuda driver API: launch, h2d, d2h, sync, alloc) and the `nccl` probe
 * (collective); the user side attaches enter_<stage> to each configured symbol and call_return to its
 * return. Async calls are timed until they return (enqueue time). Only PT_REGS_* are read.
 * Timed calls nested in a timed call on the same thread (one API entry point calling another) count once,
 * as the outermost call. Entries and returns are paired by the stack pointer, not by counting them: one
 * image's library attached in N containers traps each entry and return N times, and the probes of one copy
 * can go while a call is in flight (a count of entries then never came back to 0, and the thread was not
 * timed again for CALL_STALE_NS). An entry above the current call's (its return was missed) or older than
 * CALL_STALE_NS replaces it.
 */
#include <uapi/linux/ptrace.h>

#include "stage.h"
#include "calls.h"
#include "stage_record.c"

/* The calling thread's slot: task-local storage where the kernel has it (5.11+: no hash, freed with the
 * thread), else an LRU hash keyed by thread id. */
#ifdef HAVE_TASK_STORAGE
BPF_TASK_STORAGE(call_start, struct call_start);

static __always_inline struct call_start *call_slot(int create)
{
	return call_start.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
					   create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}
#else
BPF_TABLE("lru_hash", u32, struct call_start, call_start, MAX_THREADS);

static __always_inline struct call_start *call_slot(int create)
{
	u32 tid = bpf_get_current_pid_tgid();
	struct call_start idle = {}, *slot = call_start.lookup(&tid);

	if (!slot && create) {
		call_start.update(&tid, &idle);
		slot = call_start.lookup(&tid);
	}
	return slot;
}
#endif

static __always_inline int call_enter(struct pt_regs *ctx, u32 stage)
{
	u32 workload = workload_of(bpf_get_current_pid_tgid() >> 32);
	struct call_start *slot;
	u64 now, sp = PT_REGS_SP(ctx);

	if (!workload)
		return 0;
	slot = call_slot(1);
	if (!slot)
		return 0;
	now = bpf_ktime_get_ns();
	/* nested in the current call (below its entry's stack pointer), or another trap of its own entry (the same
	 * stack pointer within CALL_TRAP_NS: a later call from the same frame, its predecessor's return missed,
	 * starts afresh) */
	if (slot->workload && now - slot->ts < CALL_STALE_NS &&
	    (sp < slot->sp || (sp == slot->sp && now - slot->ts < CALL_TRAP_NS)))
		return 0;
	slot->ts = now;
	slot->sp = sp;
	slot->stage = stage;
	slot->workload = workload;
	return 0;
}

int call_return(struct pt_regs *ctx)
{
	struct call_start *slot = call_slot(0);

	/* below the entry's stack pointer: a nested call's return (the outermost one's is at its entry's, arm64,
	 * or above it, x86-64 popping the return address; a nested call's frame is below the caller's own frame);
	 * none in a call: a second trap of a return already counted */
	if (!slot || !slot->workload || PT_REGS_SP(ctx) < slot->sp)
		return 0;
	stage_record(slot->stage, slot->workload, bpf_ktime_get_ns() - slot->ts);
	slot->workload = 0;
	return 0;
}

int enter_launch(struct pt_regs *ctx) { return call_enter(ctx, STAGE_LAUNCH); }
int enter_h2d(struct pt_regs *ctx) { return call_enter(ctx, STAGE_H2D); }
int enter_d2h(struct pt_regs *ctx) { return call_enter(ctx, STAGE_D2H); }
int enter_sync(struct pt_regs *ctx) { return call_enter(ctx, STAGE_SYNC); }
int enter_alloc(struct pt_regs *ctx) { return call_enter(ctx, STAGE_ALLOC); }
int enter_collective(struct pt_regs *ctx) { return call_enter(ctx, STAGE_COLLECTIVE); }

#ifdef CALLS_SELFTEST
/* Test hook: record PT_REGS_PARM1 ns for stage PT_REGS_PARM2 (tests/probes check the bucket maths). */
int record_arg(struct pt_regs *ctx)
{
	u32 wid = workload_of(bpf_get_current_pid_tgid() >> 32);

	if (wid)
		stage_record(PT_REGS_PARM2(ctx), wid, PT_REGS_PARM1(ctx));
	return 0;
}
#endif
