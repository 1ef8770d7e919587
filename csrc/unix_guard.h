/* The unix-socket guard of `--network allow`: a command may connect to a pathname unix socket only
 * when the socket file lies beneath one of its writable directories (the workspace, its home, its
 * private /tmp and /dev/shm).
 *
 * Why a guard at all: a network namespace cuts the routes out and hides the host's abstract unix
 * sockets, but a pathname socket is found through the file system, and a read-only mount does not
 * stop connect() on a socket file (docker.sock and the like). Landlock gains no right for it before
 * its ABI 8 (this code queries nothing: it is the mechanism whatever the ABI); a plain seccomp
 * filter cannot read the address a pointer points to.
 *
 * How: a seccomp filter in the command (inherited by everything it starts) sends every connect()
 * to a supervisor, the sandbox's init, as a user notification. The supervisor never lets the
 * command's own call go on (SECCOMP_USER_NOTIF_FLAG_CONTINUE would let another thread change the
 * address after the check): it copies the address out of the command's memory, takes a duplicate of
 * the command's socket (pidfd_getfd) and connects that itself, then answers with the result. A
 * pathname is resolved by the supervisor (the command's root and working directory, the same mount
 * view), the socket file opened with O_PATH, its real location checked against the allowed
 * directories, and the connection made to that very file through /proc/self/fd: a symlink or a
 * rename race leads nowhere else. Other families (TCP to the egress listener, abstract sockets of
 * the sandbox's own namespace) are connected as asked.
 *
 * The same filter refuses what would reach a socket file without connect(): unix datagram sockets
 * (sendto() names its destination, even on a connected pair: socket() and socketpair() of
 * SOCK_DGRAM or SOCK_RAW, which is a datagram socket for AF_UNIX; stream and seqpacket ones ignore
 * or refuse an address), io_uring (its connect bypasses seccomp) and system calls of a foreign ABI
 * (x32, 32-bit compat), where the numbers differ.
 *
 * What remains: the peer of a connection the supervisor made sees the init's credentials
 * (SO_PEERCRED), not the command's; a blocking connect() to a stalled listener in the workspace
 * holds the supervisor (signal forwarding waits) until it is accepted or fails.
 */
#ifndef SMITH_FAST_UNIX_GUARD_H
#define SMITH_FAST_UNIX_GUARD_H

#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "fd_passing.h"

#if defined(__x86_64__)
#define UG_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define UG_ARCH AUDIT_ARCH_AARCH64
#else
#error "unix_guard.h: add this architecture's AUDIT_ARCH"
#endif
#define UG_X32_BIT 0x40000000U
#define SYS_pidfd_open_ 434
#define SYS_pidfd_getfd_ 438
#define PIDFD_THREAD_ O_EXCL /* Linux 6.9: a pidfd of a thread, not only of a thread group's leader */
#define SYS_io_uring_setup_ 425
#define SYS_io_uring_enter_ 426
#define SYS_io_uring_register_ 427

#define UG_NR offsetof(struct seccomp_data, nr)
#define UG_ARCH_AT offsetof(struct seccomp_data, arch)
#define UG_ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i)) /* little endian: the low half first */

/* In the command's process, after no_new_privs: install the filter, send its notification fd over
 * channel (to the supervisor) and close both. */
static int unix_guard_install(int channel, const char **step) {
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, UG_ARCH_AT),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, UG_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM), /* a foreign ABI */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, UG_NR),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, UG_X32_BIT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_connect, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_setup_, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_enter_, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_io_uring_register_, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        /* socket() and socketpair(): no unix datagram socket (SOCK_RAW is one too, for AF_UNIX) */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socketpair, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, UG_ARG_LO(0)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, UG_ARG_LO(1)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf), /* the type, without SOCK_CLOEXEC/SOCK_NONBLOCK */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOCK_DGRAM, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SOCK_RAW, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EACCES),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof code / sizeof *code), code};
    int notify = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (notify < 0) {
        *step = "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER)";
        close(channel);
        return -1;
    }
    int sent = send_fd(channel, notify, 'G');
    int saved = errno;
    close(notify);
    close(channel);
    errno = saved;
    if (sent != 0) {
        *step = "sending the unix guard's notification fd";
        return -1;
    }
    return 0;
}

/* In the supervisor: the notification fd the command sent, -1 when it sent none (it failed before). */
static int unix_guard_receive(int channel) {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    ssize_t n;
    while ((n = recvmsg(channel, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
    close(channel);
    struct cmsghdr *c = n == 1 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static int ug_under(const char *path, const char *top) {
    size_t n = strlen(top);
    if (n == 1 && top[0] == '/') return 1;
    return strncmp(path, top, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* connect() a pathname socket as pid asked, on sock (its socket's duplicate): 0 or -errno. */
static int ug_connect_path(int sock, pid_t pid, const char *path, const char *const *allowed, int nallowed) {
    char where[4096], link[64];
    int dir = AT_FDCWD;
    if (path[0] != '/') {
        snprintf(link, sizeof link, "/proc/%d/cwd", (int)pid);
        dir = open(link, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) return -EACCES;
    }
    int target = openat(dir, path, O_PATH | O_CLOEXEC);
    int err = errno;
    if (dir >= 0) close(dir);
    if (target < 0) return -err;
    struct stat st;
    ssize_t n;
    int rc = -EACCES;
    snprintf(link, sizeof link, "/proc/self/fd/%d", target);
    if (fstat(target, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        rc = -ECONNREFUSED; /* what connect() says of a file that is no socket */
    } else if ((n = readlink(link, where, sizeof where - 1)) > 0) {
        where[n] = '\0';
        for (int a = 0; a < nallowed; a++) {
            if (!ug_under(where, allowed[a])) continue;
            struct sockaddr_un to;
            memset(&to, 0, sizeof to);
            to.sun_family = AF_UNIX;
            memcpy(to.sun_path, link, strlen(link));
            rc = connect(sock, (struct sockaddr *)&to, sizeof to) == 0 ? 0 : -errno;
            break;
        }
    }
    close(target);
    return rc;
}

/* Answer one notification (there is one to read: poll said so). allowed: the directories beneath
 * which a command may connect to a socket file. */
static void unix_guard_serve(int notify, const char *const *allowed, int nallowed) {
    static struct seccomp_notif_sizes sizes;
    static char req_buf[1024], resp_buf[256];
    if (sizes.seccomp_notif == 0 && syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) return;
    if (sizes.seccomp_notif > sizeof req_buf || sizes.seccomp_notif_resp > sizeof resp_buf) return;
    struct seccomp_notif *req = (struct seccomp_notif *)req_buf;
    struct seccomp_notif_resp *resp = (struct seccomp_notif_resp *)resp_buf;
    memset(req_buf, 0, sizeof req_buf);
    if (ioctl(notify, SECCOMP_IOCTL_NOTIF_RECV, req) != 0) return; /* the caller went away meanwhile */
    memset(resp_buf, 0, sizeof resp_buf);
    resp->id = req->id;
    int rc = -EACCES;
    struct sockaddr_storage addr;
    size_t len = (size_t)req->data.args[2];
    int fd = (int)req->data.args[0];
    int pidfd = -1, sock = -1;
    if (len > sizeof addr || len < sizeof(sa_family_t)) {
        rc = -EINVAL;
        goto answer;
    }
    memset(&addr, 0, sizeof addr);
    struct iovec local = {&addr, len}, remote = {(void *)(uintptr_t)req->data.args[1], len};
    if (process_vm_readv(req->pid, &local, 1, &remote, 1, 0) != (ssize_t)len) {
        rc = -EFAULT;
        goto answer;
    }
    /* req->pid is the calling thread's id: a connect() from a thread other than the leader needs a
       thread pidfd (6.9); before that only a leader's call can be served (the others get EACCES). */
    pidfd = (int)syscall(SYS_pidfd_open_, req->pid, PIDFD_THREAD_);
    if (pidfd < 0 && errno == EINVAL) pidfd = (int)syscall(SYS_pidfd_open_, req->pid, 0);
    /* The pid could have been reused before pidfd_open: the notification still pending proves it was not. */
    if (pidfd < 0 || ioctl(notify, SECCOMP_IOCTL_NOTIF_ID_VALID, &req->id) != 0) goto answer;
    sock = (int)syscall(SYS_pidfd_getfd_, pidfd, fd, 0);
    if (sock < 0) {
        rc = errno == EBADF ? -EBADF : -EACCES;
        goto answer;
    }
    struct sockaddr_un *un = (struct sockaddr_un *)&addr;
    size_t path_len = len - offsetof(struct sockaddr_un, sun_path);
    if (addr.ss_family == AF_UNIX && len > offsetof(struct sockaddr_un, sun_path) && un->sun_path[0] != '\0') {
        char path[sizeof un->sun_path + 1];
        memcpy(path, un->sun_path, path_len);
        path[path_len] = '\0';
        rc = ug_connect_path(sock, req->pid, path, allowed, nallowed);
    } else {
        /* Network families reach only the namespace's loopback; abstract names only this namespace's. */
        rc = connect(sock, (struct sockaddr *)&addr, (socklen_t)len) == 0 ? 0 : -errno;
    }
answer:
    if (sock >= 0) close(sock);
    if (pidfd >= 0) close(pidfd);
    resp->error = rc;
    resp->val = 0;
    resp->flags = 0;
    ioctl(notify, SECCOMP_IOCTL_NOTIF_SEND, resp); /* ENOENT: the call was interrupted meanwhile */
}

#endif
