/* calls: host-side duration of library calls, one uprobe/uretprobe pair per symbol.
 *
 * Loaded by the `cuda` probe (libcuda driver API: launch, h2d, d2h, sync, alloc) and the `nccl` probe
 * (collective); the user side attaches enter_<stage> to each configured symbol and call_return to its
 * return. Async calls are timed until they return (enqueue time). Only PT_REGS_* are read.
 * Timed calls nested in a timed call on the same thread (one API entry point calling another) count once,
 * as the outermost call; an entry older than CALL_STALE_NS (a missed return) is replaced.
 */
#include <uapi/linux/ptrace.h>

#include "stage.h"
#include "calls.h"

BPF_TABLE("lru_hash", u32, struct call_start, call_start, MAX_THREADS);

static __always_inline u32 workload_of(u32 tgid)
{
	u32 *wid = workloads.lookup(&tgid);

	return wid ? *wid : 0;
}

static __always_inline void stage_record(u32 stage, u32 workload, u64 delta_ns)
{
	u32 bucket = hist_bucket(delta_ns), idx = 0;
	struct stage_key key = stage_key_of(stage, workload, bucket);
	struct stage_block empty = {}, *block = stage_latency.lookup_or_try_init(&key, &empty);
	u64 *dropped;

	if (stage_add(block, bucket, delta_ns))
		return;
	dropped = stage_dropped.lookup(&idx);
	if (dropped)
		(*dropped)++;
}

static __always_inline int call_enter(u32 stage)
{
	u64 id = bpf_get_current_pid_tgid(), now;
	struct call_start start = {.stage = stage}, *cur;
	u32 tid = id;

	if (!workload_of(id >> 32))
		return 0;
	now = bpf_ktime_get_ns();
	cur = call_start.lookup(&tid);
	if (cur && now - cur->ts < CALL_STALE_NS) {
		cur->depth++;
		return 0;
	}
	start.ts = now;
	call_start.update(&tid, &start);
	return 0;
}

int call_return(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = id;
	struct call_start *cur = call_start.lookup(&tid);

	if (!cur)
		return 0;
	if (cur->depth) {
		cur->depth--;
		return 0;
	}
	stage_record(cur->stage, workload_of(id >> 32), bpf_ktime_get_ns() - cur->ts);
	call_start.delete(&tid);
	return 0;
}

int enter_launch(struct pt_regs *ctx) { return call_enter(STAGE_LAUNCH); }
int enter_h2d(struct pt_regs *ctx) { return call_enter(STAGE_H2D); }
int enter_d2h(struct pt_regs *ctx) { return call_enter(STAGE_D2H); }
int enter_sync(struct pt_regs *ctx) { return call_enter(STAGE_SYNC); }
int enter_alloc(struct pt_regs *ctx) { return call_enter(STAGE_ALLOC); }
int enter_collective(struct pt_regs *ctx) { return call_enter(STAGE_COLLECTIVE); }

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
