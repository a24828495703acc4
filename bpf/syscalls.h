/* syscalls: structs shared with the user side. */
#ifndef SITS_SYSCALLS_H
#define SITS_SYSCALLS_H

/* sock_call.kind; ACCEPT and CLOSE only on the raw tracepoint path */
#define SOCK_READ 1
#define SOCK_WRITE 2
#define SOCK_ACCEPT 3
#define SOCK_CLOSE 4

/* A connection a tracked workload accepted: (tgid, fd) -> when, whose, first request read yet. */
struct conn_key {
	u32 tgid;
	u32 fd;
};

struct conn {
	u64 accepted_ns;
	u32 workload;
	u32 request_read;
};

/* The socket syscall a thread is in (kind 0: none), with what its exit needs from the connection. */
struct sock_call {
	u64 ts;
	u64 accepted_ns;
	u32 fd;
	u32 kind;
	u32 workload;
	u32 pad;
};

#endif /* SITS_SYSCALLS_H */
