/* block_io: structs shared with the user side. */
#ifndef SITS_BLOCK_IO_H
#define SITS_BLOCK_IO_H

/* A request in flight on a device, named by (dev, first sector) as the tracepoints print them. */
struct rq_key {
	u32 dev;
	u32 pad;
	u64 sector;
};

/* A request from its insert (or issue) until it completes: its submitter's workload, its issue time (0 before the
 * issue, and for a request not timed), when it was last inserted, issued or put back, and whether it is issued
 * (1 from its issue until the driver puts it back). */
struct rq_start {
	u64 ts;
	u64 seen;
	u32 workload;
	u32 issued;
};

#endif /* SITS_BLOCK_IO_H */
