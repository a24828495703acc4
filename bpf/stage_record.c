/* The two accessors of the maps in stage.h, pasted into each program by the loader where it says
 * #include "stage_record.c" (sits_observe/probes/specs.py main_text): bcc rewrites map calls
 * (.lookup, .insert, ...) only in the text it compiles, never in an included file.
 */

static __always_inline u32 workload_of(u32 tgid)
{
	u32 *wid = workloads.lookup(&tgid);

	return wid ? *wid : 0;
}

static __always_inline void stage_record(u32 stage, u32 workload, u64 delta_ns)
{
	u32 bucket = hist_bucket(delta_ns), idx = 0;
	struct stage_key key = stage_key_of(stage, workload, bucket);
	struct stage_block *block = stage_latency.lookup(&key);
	u64 *dropped;

	if (!block) {
		struct stage_block empty = {};

		stage_latency.insert(&key, &empty);
		block = stage_latency.lookup(&key);
	}
	if (stage_add(block, bucket, delta_ns))
		return;
	dropped = stage_dropped.lookup(&idx);
	if (dropped)
		(*dropped)++;
}
