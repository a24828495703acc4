/* Tight loops for `sits-observe bench probes`, built with gcc when the bench runs.
 *   sits_bench_call        the uprobe target: an empty exported function
 *   sits_bench_loop_call   n calls of it, returns the elapsed ns
 *   sits_bench_loop_write  n zero-byte write(2)s on fd (the syscall tracepoints' target), elapsed ns
 *   sits_bench_loop_getppid  n getppid(2)s, a syscall the syscalls probe does not time, elapsed ns
 */
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

__attribute__((noinline)) int sits_bench_call(uint64_t i)
{
	__asm__ volatile("" ::: "memory");
	return (int)(i & 1);
}

uint64_t sits_bench_loop_call(uint64_t n)
{
	uint64_t t0 = now_ns();

	for (uint64_t i = 0; i < n; i++)
		sits_bench_call(i);
	return now_ns() - t0;
}

uint64_t sits_bench_loop_write(int fd, uint64_t n)
{
	char byte = 0;
	uint64_t t0 = now_ns();

	for (uint64_t i = 0; i < n; i++)
		if (write(fd, &byte, 0) < 0)
			return 0;
	return now_ns() - t0;
}

uint64_t sits_bench_loop_getppid(uint64_t n)
{
	uint64_t t0 = now_ns();

	for (uint64_t i = 0; i < n; i++)
		syscall(SYS_getppid);
	return now_ns() - t0;
}
