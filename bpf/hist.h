/* Log-linear latency buckets, the same maths as sits_observe/histogram.py (kernel_bucket).
 *
 * HIST_SUB_BITS and HIST_MAX_EXP come from the loader as -D flags (histogram.SUB_BITS, MAX_EXP), so
 * Python stays the one source of truth. Buckets are right-closed: with u = v - 1 (v = 0 -> u = 0),
 * u < SUB is bucket u; else e = floor(log2 u), bucket (e - SUB_BITS + 1) * SUB + the SUB_BITS bits
 * below the top bit; e > MAX_EXP is the overflow bucket HIST_NUM_BUCKETS - 1.
 * Plain C (no BPF helpers) so the tests compile it with gcc and compare against Python.
 */
#ifndef SITS_HIST_H
#define SITS_HIST_H

#if !defined(HIST_SUB_BITS) || !defined(HIST_MAX_EXP)
#error "define HIST_SUB_BITS and HIST_MAX_EXP (the loader passes them from sits_observe/histogram.py)"
#endif

#define HIST_SUB (1ULL << HIST_SUB_BITS)
#define HIST_NUM_BUCKETS ((HIST_MAX_EXP - HIST_SUB_BITS + 2) * HIST_SUB + 1)

/* floor(log2(v)) for v > 0, branch-free steps the verifier accepts. */
static __always_inline u32 hist_log2(u64 v)
{
	u32 r = 0, s;

	s = (v > 0xFFFFFFFFULL) << 5; v >>= s; r |= s;
	s = (v > 0xFFFFULL) << 4;     v >>= s; r |= s;
	s = (v > 0xFFULL) << 3;       v >>= s; r |= s;
	s = (v > 0xFULL) << 2;        v >>= s; r |= s;
	s = (v > 0x3ULL) << 1;        v >>= s; r |= s;
	return r | (u32)(v >> 1);
}

static __always_inline u32 hist_bucket(u64 v)
{
	u64 u = v ? v - 1 : 0;
	u32 e;

	if (u < HIST_SUB)
		return (u32)u;
	e = hist_log2(u);
	if (e > HIST_MAX_EXP)
		return HIST_NUM_BUCKETS - 1;
	return (e - HIST_SUB_BITS + 1) * HIST_SUB + (u32)((u >> (e - HIST_SUB_BITS)) & (HIST_SUB - 1));
}

#endif /* SITS_HIST_H */
