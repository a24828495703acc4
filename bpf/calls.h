/* calls: structs shared with the user side. */
#ifndef SITS_CALLS_H
#define SITS_CALLS_H

/* The outermost timed library call a thread is in (workload 0: none), and the stack pointer at its entry:
 * a return above it ends that call, one at or below it ends a call nested in it (or is a second trap of the
 * same return, the library attached once per container). */
struct call_start {
	u64 ts;
	u64 sp;
	u32 stage;
	u32 workload;
};

#endif /* SITS_CALLS_H */
