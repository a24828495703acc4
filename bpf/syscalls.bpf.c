/* syscalls: request ingress and egress on the tracked workloads' server sockets.
 *
 *   ingress  accept/accept4 return -> return of the first read/recvfrom/recvmsg with data on that fd
 *   egress   duration of each write/sendto/sendmsg on an accepted fd that returns >= 0
 * Attached to the raw tracepoints raw_syscalls:sys_enter/sys_exit (USE_RAW_TP, where the loader finds
 * them), else to the syscalls:* tracepoints (args->fd, args->ret); each syscall is compiled in
 * (HAVE_<NAME>) where its syscalls:* tracepoints exist.
 * Connections live in an LRU map, forgotten on close(); calls are paired per thread (sock_call_slot).
 */
#include <uapi/linux/ptrace.h>
#include <asm/unistd.h>

#include "stage.h"
#include "syscalls.h"
#include "stage_record.c"

BPF_TABLE("lru_hash", struct conn_key, struct conn, conns, MAX_CONNS);

/* The calling thread's socket-call slot: task-local storage where the kernel has it (5.11+: no hash,
 * freed with the thread), else an LRU hash keyed by thread id. A slot is idle while kind == 0. */
#ifdef HAVE_TASK_STORAGE
BPF_TASK_STORAGE(sock_calls, struct sock_call);

static __always_inline struct sock_call *sock_call_slot(int create)
{
	return sock_calls.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
					   create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}
#else
BPF_TABLE("lru_hash", u32, struct sock_call, sock_calls, MAX_THREADS);

static __always_inline struct sock_call *sock_call_slot(int create)
{
	u32 tid = bpf_get_current_pid_tgid();
	struct sock_call idle = {}, *call = sock_calls.lookup(&tid);

	if (!call && create) {
		sock_calls.update(&tid, &idle);
		call = sock_calls.lookup(&tid);
	}
	return call;
}
#endif

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
	struct conn_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = fd};
	struct conn *conn = conns.lookup(&key);
	struct sock_call *call;

	if (!conn || (kind == SOCK_READ && conn->request_read))
		return 0;
	call = sock_call_slot(1);
	if (!call)
		return 0;
	call->ts = bpf_ktime_get_ns();
	call->accepted_ns = conn->accepted_ns;
	call->fd = fd;
	call->kind = kind;
	call->workload = conn->workload;
	return 0;
}

static __always_inline int on_sock_exit(long ret)
{
	struct sock_call *call = sock_call_slot(0);
	struct conn_key key = {};
	struct conn *conn;
	u32 kind;

	if (!call || !call->kind)
		return 0;
	kind = call->kind;
	call->kind = 0;
	if (kind == SOCK_ACCEPT)
		return on_accept_exit(ret);
	if (ret < 0)
		return 0;
	if (kind == SOCK_WRITE) {
		stage_record(STAGE_EGRESS, call->workload, bpf_ktime_get_ns() - call->ts);
		return 0;
	}
	if (ret == 0)
		return 0;
	key.tgid = bpf_get_current_pid_tgid() >> 32;
	key.fd = call->fd;
	conn = conns.lookup(&key);
	if (conn && !conn->request_read) {
		conn->request_read = 1;
		stage_record(STAGE_INGRESS, call->workload, bpf_ktime_get_ns() - call->accepted_ns);
	}
	return 0;
}

static __always_inline int on_accept_enter(void)
{
	struct sock_call *call = sock_call_slot(1);

	if (call)
		call->kind = SOCK_ACCEPT;
	return 0;
}

static __always_inline int on_close(u64 fd)
{
	struct conn_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .fd = fd};

	conns.delete(&key);
	return 0;
}

#ifdef USE_RAW_TP
/* Raw tracepoints raw_syscalls:sys_enter/sys_exit: one program each for every syscall on the host, no
 * perf record built per call. The syscall number (args[1] at enter, uapi __NR_*) picks the call; the fd
 * is the first syscall argument in the saved user registers (PT_REGS_PARM1, the syscall ABI). The exit
 * program only looks at the thread's slot, which the enter program fills for tracked calls alone. */
static __always_inline int tracked_tgid(u32 tgid)
{
	u32 *wid = workloads.lookup(&tgid);

	return wid && *wid;
}

RAW_TRACEPOINT_PROBE(sys_enter)
{
	struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
	u64 fd = 0;
	u32 kind;

	switch (ctx->args[1]) {
#ifdef HAVE_ACCEPT
	case __NR_accept:
#endif
#ifdef HAVE_ACCEPT4
	case __NR_accept4:
#endif
		kind = SOCK_ACCEPT;
		break;
#ifdef HAVE_READ
	case __NR_read:
#endif
#ifdef HAVE_RECVFROM
	case __NR_recvfrom:
#endif
#ifdef HAVE_RECVMSG
	case __NR_recvmsg:
#endif
		kind = SOCK_READ;
		break;
#ifdef HAVE_WRITE
	case __NR_write:
#endif
#ifdef HAVE_SENDTO
	case __NR_sendto:
#endif
#ifdef HAVE_SENDMSG
	case __NR_sendmsg:
#endif
		kind = SOCK_WRITE;
		break;
#ifdef HAVE_CLOSE
	case __NR_close:
		kind = SOCK_CLOSE;
		break;
#endif
	default:
		return 0;
	}
	/* reads and writes: the connection look-up is the filter (it is keyed by tgid) */
	if (kind == SOCK_READ || kind == SOCK_WRITE) {
		bpf_probe_read_kernel(&fd, sizeof(fd), &PT_REGS_PARM1(regs));
		return on_sock_enter(fd, kind);
	}
	if (!tracked_tgid(bpf_get_current_pid_tgid() >> 32))
		return 0;
	if (kind == SOCK_ACCEPT)
		return on_accept_enter();
	bpf_probe_read_kernel(&fd, sizeof(fd), &PT_REGS_PARM1(regs));
	return on_close(fd);
}

RAW_TRACEPOINT_PROBE(sys_exit) { return on_sock_exit(ctx->args[1]); }
#else /* syscall tracepoints */
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
TRACEPOINT_PROBE(syscalls, sys_enter_close) { return on_close(args->fd); }
#endif
#endif
