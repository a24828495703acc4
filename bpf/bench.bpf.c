/* bench: baselines for `sits-observe bench probes`; the daemon never loads this file.
 *
 *   BENCH_EMPTY_CALLS  empty uprobe/uretprobe programs: the cost of the trap alone
 *   BENCH_EMPTY_WRITE  empty programs on the write() syscall tracepoints (with USE_RAW_TP: on the raw
 *                      raw_syscalls sys_enter/sys_exit, as the syscalls probe attaches there): dispatch alone
 *   BENCH_PERF_CALLS   naive uprobe pair: every call duration goes to user space through a perf buffer
 *   BENCH_PERF_WRITE   naive write() timing on syscall tracepoints, every event to the perf buffer
 * The naive variants filter on one tgid (BENCH_TGID) and pair calls per thread like the real programs.
 */
#include "bench.h"

#if defined(BENCH_EMPTY_CALLS)
int empty_enter(struct pt_regs *ctx) { return 0; }
int empty_return(struct pt_regs *ctx) { return 0; }
#elif defined(BENCH_EMPTY_WRITE) && defined(USE_RAW_TP)
RAW_TRACEPOINT_PROBE(sys_enter) { return 0; }
RAW_TRACEPOINT_PROBE(sys_exit) { return 0; }
#elif defined(BENCH_EMPTY_WRITE)
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return 0; }
#else
BPF_HASH(bench_start, u32, u64, 1024);
BPF_PERF_OUTPUT(bench_events);

static __always_inline int bench_enter(void)
{
	u64 id = bpf_get_current_pid_tgid(), now;
	u32 tid = id;

	if (id >> 32 != BENCH_TGID)
		return 0;
	now = bpf_ktime_get_ns();
	bench_start.update(&tid, &now);
	return 0;
}

static __always_inline int bench_exit(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = id;
	u64 *start = bench_start.lookup(&tid);
	struct bench_event event = {.stage = BENCH_STAGE, .tgid = id >> 32};

	if (!start)
		return 0;
	event.delta_ns = bpf_ktime_get_ns() - *start;
	bench_start.delete(&tid);
	bench_events.perf_submit(ctx, &event, sizeof(event));
	return 0;
}

#ifdef BENCH_PERF_CALLS
int perf_enter(struct pt_regs *ctx) { return bench_enter(); }
int perf_return(struct pt_regs *ctx) { return bench_exit(ctx); }
#endif

#ifdef BENCH_PERF_WRITE
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return bench_enter(); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return bench_exit(args); }
#endif
#endif
