/* syscalls: request ingress and egress on the tracked workloads' server sockets.
 *
 *   ingress  accept/accept4 return -> return of the first read/recvfrom/recvmsg with data on that fd
 *   egress   duration of each write/sendto/sendmsg on an accepted fd that returns >= 0
 * Syscall tracepoints only (args->fd, args->ret); each syscall is compiled in (HAVE_<NAME>) where its
 * tracepoints exist.
 * Connections live in an LRU map, forgotten on close(); calls are paired per thread.
 */
#include "stage.h"
#include "syscalls.h"

BPF_TABLE("lru_hash", struct conn_key, struct conn, conns, MAX_CONNS);
BPF_TABLE("lru_hash", u32, struct sock_call, sock_calls, MAX_THREADS);

static __always_inline u32 workload_of(u32 tgid)
{
	u32 *wid = workloads.lookup(&tgid);

	return wid ? *wid : 0;
}

static __always_inline void stage_record(u32 stage, u32 workload, u64 delta_ns)
{
	struct stage_key key = stage_key_of(stage, workload, delta_ns);
	struct series_key series = {.stage = stage, .workload = workload};
	struct stage_total no_total = {};
	u64 zero = 0, *count, *dropped;
	u32 idx = 0;

	count = stage_latency.lookup_or_try_init(&key, &zero);
	if (stage_add(count, count ? stage_latency_sum.lookup_or_try_init(&series, &no_total) : 0, delta_ns))
		return;
	dropped = stage_dropped.lookup(&idx);
	if (dropped)
		(*dropped)++;
}

static __always_inline int on_accept_exit(long ret)
{
	struct conn_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = ret};
	struct conn conn = {};

	if (ret < 0)
		return 0;
	conn.workload = workload_of(key.tgid);
	if (!conn.workload)
		return 0;
	conn.accepted_ns = bpf_ktime_get_ns();
	conns.update(&key, &conn);
	return 0;
}

static __always_inline int on_sock_enter(u64 fd, u32 kind)
{
	u64 id = bpf_get_current_pid_tgid();
	struct conn_key key = {.tgid = id >> 32, .fd = fd};
	struct sock_call call = {.fd = fd, .kind = kind};
	struct conn *conn = conns.lookup(&key);
	u32 tid = id;

	if (!conn || (kind == SOCK_READ && conn->request_read))
		return 0;
	call.ts = bpf_ktime_get_ns();
	sock_calls.update(&tid, &call);
	return 0;
}

static __always_inline int on_sock_exit(long ret)
{
	u64 id = bpf_get_current_pid_tgid(), now;
	u32 tid = id;
	struct sock_call *call = sock_calls.lookup(&tid);
	struct conn_key key = {.tgid = id >> 32};
	struct conn *conn;

	if (!call)
		return 0;
	now = bpf_ktime_get_ns();
	key.fd = call->fd;
	conn = conns.lookup(&key);
	if (conn && ret >= 0) {
		if (call->kind == SOCK_WRITE) {
			stage_record(STAGE_EGRESS, conn->workload, now - call->ts);
		} else if (ret > 0 && !conn->request_read) {
			conn->request_read = 1;
			stage_record(STAGE_INGRESS, conn->workload, now - conn->accepted_ns);
		}
	}
	sock_calls.delete(&tid);
	return 0;
}

#ifdef HAVE_ACCEPT
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { return on_accept_exit(args->ret); }
#endif
#ifdef HAVE_ACCEPT4
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { return on_accept_exit(args->ret); }
#endif
#ifdef HAVE_READ
TRACEPOINT_PROBE(syscalls, sys_enter_read) { return on_sock_enter(args->fd, SOCK_READ); }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_RECVFROM
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { return on_sock_enter(args->fd, SOCK_READ); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_RECVMSG
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { return on_sock_enter(args->fd, SOCK_READ); }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_WRITE
TRACEPOINT_PROBE(syscalls, sys_enter_write) { return on_sock_enter(args->fd, SOCK_WRITE); }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_SENDTO
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { return on_sock_enter(args->fd, SOCK_WRITE); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_SENDMSG
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { return on_sock_enter(args->fd, SOCK_WRITE); }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { return on_sock_exit(args->ret); }
#endif
#ifdef HAVE_CLOSE
TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
	struct conn_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = args->fd};

	conns.delete(&key);
	return 0;
}
#endif
