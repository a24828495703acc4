/* bench: structs shared with the user side. */
#ifndef SITS_BENCH_H
#define SITS_BENCH_H

/* One timed call sent to user space by the naive perf-buffer variants. */
struct bench_event {
	u64 delta_ns;
	u32 stage;
	u32 tgid;
};

#endif /* SITS_BENCH_H */
