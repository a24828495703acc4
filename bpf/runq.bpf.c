/* runq: run-queue latency (runnable -> on CPU) of the tracked workloads' threads.
 *
 * Tracepoints: sched:sched_wakeup, sched:sched_switch, and where present sched:sched_wakeup_new
 * (HAVE_SCHED_WAKEUP_NEW), sched:sched_process_exit (HAVE_SCHED_PROCESS_EXIT) and sched:sched_process_free
 * (HAVE_SCHED_PROCESS_FREE). Fields come only from
 * the tracepoint args. A wakeup names a thread id; its tgid is learnt when the thread is switched out
 * (it is then `current`, so bpf_get_current_pid_tgid() names it) and kept in `threads`.
 * A task switched out still runnable (prev_state & RUNQ_STATE_MASK == 0: preempted or yielded) is queued
 * again at once; RUNQ_STATE_MASK is TASK_REPORT_MAX - 1 as printed in the sched_switch format.
 */
#include "stage.h"
#include "runq.h"
#include "stage_record.c"

BPF_TABLE("lru_hash", u32, u32, threads, MAX_THREADS);
#ifdef HAVE_SCHED_PROCESS_EXIT
/* an entry ends when its thread gets the CPU or exits: a plain hash is bounded and cheaper than LRU */
BPF_HASH(runq_start, u32, struct runq_start, MAX_THREADS);
#else
BPF_TABLE("lru_hash", u32, struct runq_start, runq_start, MAX_THREADS);
#endif

static __always_inline void runq_enqueue(u32 tid, u32 tgid)
{
	struct runq_start start = {};

	start.workload = workload_of(tgid);
	if (!start.workload)
		return;
	start.ts = bpf_ktime_get_ns();
	runq_start.update(&tid, &start);
}

static __always_inline void runq_wakeup(u32 tid)
{
	u32 *tgid = threads.lookup(&tid);

	if (tgid)
		runq_enqueue(tid, *tgid);
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
	runq_wakeup(args->pid);
	return 0;
}

#ifdef HAVE_SCHED_WAKEUP_NEW
TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
	runq_wakeup(args->pid);
	return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_switch)
{
	u32 prev = args->prev_pid, next = args->next_pid, tgid = bpf_get_current_pid_tgid() >> 32;
	struct runq_start *start;

	if (prev && workload_of(tgid)) {
		u32 *known = threads.lookup(&prev);

		if (!known || *known != tgid) /* a thread id reused by another tracked process */
			threads.update(&prev, &tgid);
		if ((args->prev_state & RUNQ_STATE_MASK) == 0)
			runq_enqueue(prev, tgid);
	}
	start = runq_start.lookup(&next);
	if (!start)
		return 0;
	stage_record(STAGE_RUNQ, start->workload, bpf_ktime_get_ns() - start->ts);
	runq_start.delete(&next);
	return 0;
}

#ifdef HAVE_SCHED_PROCESS_EXIT
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u32 tid = bpf_get_current_pid_tgid();

	threads.delete(&tid);
	runq_start.delete(&tid);
	return 0;
}
#endif

#ifdef HAVE_SCHED_PROCESS_FREE
/* The task is freed after its last switch, which (after sched_process_exit) learnt its tgid again: without
 * this its thread id would stay mapped to the workload, and a thread that reuses the id be charged to it. */
TRACEPOINT_PROBE(sched, sched_process_free)
{
	u32 tid = args->pid;

	threads.delete(&tid);
	runq_start.delete(&tid);
	return 0;
}
#endif
