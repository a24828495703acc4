/* Per-stage latency maps shared by every program; the user side drains them each tick.
 *
 *   workloads      tgid -> workload id (1..N in config order), kept by the user side's /proc scan
 *   stage_latency  per-CPU histogram blocks per (stage, workload, block): a block is one power of two,
 *                  HIST_SUB sub-bucket counts (bucket = block * HIST_SUB + index) and the exact sum (ns)
 *                  of its events, so one map update per event and HIST_SUB times fewer entries to drain
 *                  than one key per bucket
 *   stage_dropped  per-CPU count of events lost because stage_latency was full
 * Stage ids are the indexes in sits_observe/frame.py STAGES, passed as -DSTAGE_<NAME>=i. Counters only
 * grow; the user side turns them into per-tick deltas (exact counts and sums per stage and workload).
 *
 * bcc rewrites map calls (.lookup, .update, ...) only in the text it compiles, never in headers, so the
 * two accessors that touch these maps (workload_of, stage_record) live in stage_record.c, which the
 * loader pastes into each program; all the arithmetic lives here.
 */
#ifndef SITS_STAGE_H
#define SITS_STAGE_H

#include "hist.h"

struct stage_key {
	u16 stage;
	u16 workload;
	u32 block;
};

struct stage_block {
	u64 count[HIST_SUB];
	u64 sum_ns;
};

BPF_HASH(workloads, u32, u32, MAX_PROCESSES);
BPF_PERCPU_HASH(stage_latency, struct stage_key, struct stage_block, HIST_ENTRIES);
BPF_PERCPU_ARRAY(stage_dropped, u64, 1);

static __always_inline struct stage_key stage_key_of(u32 stage, u32 workload, u32 bucket)
{
	struct stage_key key = {.stage = stage, .workload = workload, .block = bucket >> HIST_SUB_BITS};

	return key;
}

/* Add one event to this CPU's block (NULL when the map was full). Returns 0 if dropped. */
static __always_inline int stage_add(struct stage_block *block, u32 bucket, u64 delta_ns)
{
	if (!block)
		return 0;
	block->count[bucket & (HIST_SUB - 1)]++;
	block->sum_ns += delta_ns;
	return 1;
}

#endif /* SITS_STAGE_H */
