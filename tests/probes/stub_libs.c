/* Stub libcuda.so.1 / libnccl.so.2 for the probe tests: the real exported names, each call sleeping the
 * number of microseconds it is given. Built by the tests with gcc:
 *   gcc -shared -fPIC -O1 -DSTUB_CUDA -o libcuda.so.1 stub_libs.c   (or -DSTUB_NCCL, -DSTUB_SELFTEST)
 * Deliberately missing from the CUDA stub: cuMemAllocAsync (a configured symbol the tests expect to be
 * reported as not found). cuMemAlloc_v2 calls cuLaunchKernel (a timed call nested in a timed call).
 */
#include <time.h>

static int stub_sleep(unsigned long us)
{
	struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};

	while (nanosleep(&ts, &ts))
		;
	return 0;
}

#define STUB(name) int __attribute__((noinline)) name(unsigned long us) { return stub_sleep(us); }

#ifdef STUB_CUDA
STUB(cuLaunchKernel)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemcpyHtoDAsync_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuStreamSynchronize)
STUB(cuCtxSynchronize)

/* One timed entry point calling another, as a driver may: the nested launch must not be counted. */
int __attribute__((noinline)) cuMemAlloc_v2(unsigned long us)
{
	int r = cuLaunchKernel(us);

	stub_sleep(0); /* not a tail call: the launch runs on a stack frame below the allocation's */
	return r;
}
#endif

#ifdef STUB_NCCL
STUB(ncclAllReduce)
STUB(ncclAllGather)
#endif

#ifdef STUB_SELFTEST
/* The calls.bpf.c CALLS_SELFTEST hook records its first argument as a latency (ns) for stage `stage`. */
void __attribute__((noinline)) sits_selftest_record(unsigned long long ns, unsigned int stage)
{
	__asm__ volatile("" ::: "memory");
}
#endif
