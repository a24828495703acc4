/* Per-stage latency maps shared by every program; the user side drains them each tick.
 *
 *   workloads          tgid -> workload id (1..N in config order), kept by the user side's /proc scan
 *   stage_latency      per-CPU count per (stage, workload, bucket): sits_stage_latency_seconds buckets
 *   stage_latency_sum  per-CPU exact sum (ns) and count per (stage, workload)
 *   stage_dropped      per-CPU count of events lost because a map was full
 * Stage ids are the indexes in sits_observe/frame.py STAGES, passed as -DSTAGE_<NAME>=i. Counters only
 * grow; the user side turns them into per-tick deltas.
 *
 * bcc rewrites map calls (.lookup, .update, ...) only in the file it compiles, never in headers, so the
 * two accessors that touch these maps (workload_of, stage_record) are spelled in each program; all the
 * arithmetic lives here.
 */
#ifndef SITS_STAGE_H
#define SITS_STAGE_H

#include "hist.h"

struct stage_key {
	u16 stage;
	u16 workload;
	u32 bucket;
};

struct series_key {
	u16 stage;
	u16 workload;
};

struct stage_total {
	u64 sum_ns;
	u64 count;
};

BPF_HASH(workloads, u32, u32, MAX_PROCESSES);
BPF_PERCPU_HASH(stage_latency, struct stage_key, u64, HIST_ENTRIES);
BPF_PERCPU_HASH(stage_latency_sum, struct series_key, struct stage_total, SERIES_ENTRIES);
BPF_PERCPU_ARRAY(stage_dropped, u64, 1);

static __always_inline struct stage_key stage_key_of(u32 stage, u32 workload, u64 delta_ns)
{
	struct stage_key key = {.stage = stage, .workload = workload, .bucket = hist_bucket(delta_ns)};

	return key;
}

/* Add one event; count/total are this CPU's slots (NULL when the map was full). Returns 0 if dropped. */
static __always_inline int stage_add(u64 *count, struct stage_total *total, u64 delta_ns)
{
	if (!count || !total)
		return 0;
	(*count)++;
	total->sum_ns += delta_ns;
	total->count++;
	return 1;
}

#endif /* SITS_STAGE_H */
