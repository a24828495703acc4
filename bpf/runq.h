/* runq: structs shared with the user side. */
#ifndef SITS_RUNQ_H
#define SITS_RUNQ_H

/* A thread of a tracked workload became runnable at ts (bpf_ktime_get_ns). */
struct runq_start {
	u64 ts;
	u32 workload;
	u32 pad;
};

#endif /* SITS_RUNQ_H */
