/*
 * liburoce-no-rdma-netlink.so: an LD_PRELOAD library for programs that use uroce
 * devices through `eval "$(uroce env)"` instead of `uroce run`.
 *
 * libibverbs looks for devices over RDMA netlink first and reads SYSFS_PATH (the
 * uroce registry) only when socket(AF_NETLINK, ..., NETLINK_RDMA) fails. On a
 * kernel with ib_core that call succeeds, so uroce devices stay invisible.
 * This socket() wrapper makes exactly that call fail with EPROTONOSUPPORT, as
 * on a kernel without RDMA, and passes every other call on unchanged. It only
 * sees calls that go through the dynamic symbol `socket` (libibverbs' does,
 * through libnl); `uroce run` uses a seccomp filter instead, which sees all.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/netlink.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*socket_fn)(int, int, int);

/* The next definition of socket() (libc's, or another preload's), looked up once. */
static socket_fn next_socket(void) {
    static _Atomic(socket_fn) cached;
    socket_fn fn = atomic_load_explicit(&cached, memory_order_acquire);
    if (fn == NULL) {
        /* ISO C has no object-to-function pointer conversion; POSIX guarantees it works. */
        union {
            void* object;
            socket_fn function;
        } symbol = {.object = dlsym(RTLD_NEXT, "socket")};
        fn = symbol.function;
        if (fn != NULL) atomic_store_explicit(&cached, fn, memory_order_release);
    }
    return fn;
}

__attribute__((visibility("default"))) int socket(int domain, int type, int protocol) {
    if (domain == AF_NETLINK && protocol == NETLINK_RDMA) {
        errno = EPROTONOSUPPORT;
        return -1;
    }
    socket_fn fn = next_socket();
    if (fn == NULL) return (int)syscall(SYS_socket, domain, type, protocol);
    return fn(domain, type, protocol);
}
