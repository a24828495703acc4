/* Reads latencies (ns, one per line) on stdin and prints bpf/hist.h's bucket for each: the tests compare
 * them with sits_observe.histogram.kernel_bucket. Built with -DHIST_SUB_BITS/-DHIST_MAX_EXP from Python. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t u64;
typedef uint32_t u32;
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#include "hist.h"

int main(void)
{
	u64 v;

	printf("%d\n", HIST_NUM_BUCKETS);
	while (scanf("%" SCNu64, &v) == 1)
		printf("%u\n", hist_bucket(v));
	return 0;
}
