/* block_io: block request latency, issue to the device -> completion.
 *
 * Tracepoints: block:block_rq_issue, block:block_rq_complete, and where the kernel has them block:block_rq_insert
 * and block:block_rq_requeue (args dev, sector, nr_sector only). A request is charged to the workload of the task
 * that submitted it: the task current at its insert into the device's queue (the submitter's own context: its plug
 * flushed as it finishes or sleeps), or, issued without an insert (directly, by its submitter), at its issue. A
 * request seen again (inserted again, issued again after a busy driver put it back), often from a kworker or
 * another task's context, keeps its submitter: the task current at the issue alone charged 0.1 % of one reader's
 * requests to another reader or to none on a busy disk. An entry not seen for RQ_STALE_NS is another request's at
 * the same place (one merged away, or whose completion the kernel skipped), not this one's; so is one issued and
 * not put back since (block_rq_requeue): its completion was skipped, and the request inserted or issued at its
 * place now is a new one (it was charged to the workload of the skipped one).
 * Requests submitted by no workload (kernel threads, writeback) go to workload id 0 when BLOCK_UNATTRIBUTED is
 * 1 and are not timed when it is 0 (held, untimed, until they complete). Requests without sectors (flushes) are
 * not timed: they share sector 0.
 */
#include "stage.h"
#include "block_io.h"
#include "stage_record.c"

#define RQ_STALE_NS 10000000000ULL

BPF_TABLE("lru_hash", struct rq_key, struct rq_start, rq_start, MAX_REQUESTS);

/* The request held at ``key`` when it was seen lately and is not issued (NULL: none, or another request's entry:
 * gone stale, or, where put-backs are seen, issued and never completed). */
static __always_inline struct rq_start *held_at(struct rq_key *key, u64 now)
{
	struct rq_start *held = rq_start.lookup(key);

	if (!held || now - held->seen >= RQ_STALE_NS)
		return NULL;
#ifdef HAVE_BLOCK_RQ_REQUEUE
	if (held->issued)
		return NULL;
#endif
	return held;
}

#ifdef HAVE_BLOCK_RQ_REQUEUE
TRACEPOINT_PROBE(block, block_rq_requeue)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start *held = rq_start.lookup(&key);

	if (held) {  /* put back by the driver: it is inserted or issued again, with its submitter */
		held->issued = 0;
		held->seen = bpf_ktime_get_ns();
	}
	return 0;
}
#endif

#ifdef HAVE_BLOCK_RQ_INSERT
TRACEPOINT_PROBE(block, block_rq_insert)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start start = {};

	if (!args->nr_sector)
		return 0;
	start.seen = bpf_ktime_get_ns();
	if (held_at(&key, start.seen))
		return 0;  /* inserted again: as it was (issued or not), with its submitter */
	start.workload = workload_of(bpf_get_current_pid_tgid() >> 32);
	rq_start.update(&key, &start);
	return 0;
}
#endif

TRACEPOINT_PROBE(block, block_rq_issue)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start start = {}, *held;

	if (!args->nr_sector)
		return 0;
	start.seen = bpf_ktime_get_ns();
	held = held_at(&key, start.seen);
	start.workload = held ? held->workload : workload_of(bpf_get_current_pid_tgid() >> 32);
	if (start.workload || BLOCK_UNATTRIBUTED)
		start.ts = start.seen;
	start.issued = 1;
	rq_start.update(&key, &start);
	return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
	struct rq_key key = {.dev = args->dev, .sector = args->sector};
	struct rq_start *start = rq_start.lookup(&key);

	if (!start)
		return 0;
	if (start->ts)
		stage_record(STAGE_BLOCK_IO, start->workload, bpf_ktime_get_ns() - start->ts);
	rq_start.delete(&key);
	return 0;
}
