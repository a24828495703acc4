/* calls: structs shared with the user side. */
#ifndef SITS_CALLS_H
#define SITS_CALLS_H

/* The outermost timed library call a thread is in (workload 0: none); depth counts timed calls nested
 * inside it. */
struct call_start {
	u64 ts;
	u32 stage;
	u32 depth;
	u32 workload;
	u32 pad;
};

#endif /* SITS_CALLS_H */
