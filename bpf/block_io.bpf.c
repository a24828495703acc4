/* block_io: block request latency, issue to the device -> completion.
 *
 * Tracepoints: block:block_rq_issue, block:block_rq_complete (args dev, sector, nr_sector only).
 * A request is charged to the workload of the task that issues it; requests issued from other tasks
 * (kernel threads, writeback) go to workload id 0 when BLOCK_UNATTRIBUTED is 1 and are not timed when
 * it is 0. Requests without sectors (flushes) are not timed: they share sector 0.
 */
#include "stage.h"
#include "block_io.h"
#include "stage_record.c"

BPF_TABLE("lru_hash", struct rq_key, struct rq_start, rq_start, MAX_REQUESTS);

TRACEPOINT_PROBE(block, block_rq_issue)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start start = {};

	if (!args->nr_sector)
		return 0;
	start.workload = workload_of(bpf_get_current_pid_tgid() >> 32);
	if (!start.workload && !BLOCK_UNATTRIBUTED)
		return 0;
	start.ts = bpf_ktime_get_ns();
	rq_start.update(&key, &start);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start *start = rq_start.lookup(&key);

	if (!start)
		return 0;
	stage_record(STAGE_BLOCK_IO, start->workload, bpf_ktime_get_ns() - start->ts);
	rq_start.delete(&key);
	return 0;
}
