/* Fds sent and received over a unix socket (SCM_RIGHTS): how the egress listener (made in the
 * command's network namespace) reaches the service, the unix guard's notification fd reaches the
 * supervisor, and a zygote's requests and replies carry a command's stdio, cells and pidfd. No
 * stdio, no malloc: usable between fork and exec.
 */
#ifndef SMITH_FAST_FD_PASSING_H
#define SMITH_FAST_FD_PASSING_H

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define FD_PASSING_MAX 16 /* fds in one message (a zygote's request: stdio, usage files, cells) */

/* Send data[0:n] with fds[0:nfds] (SCM_RIGHTS, at most FD_PASSING_MAX) over channel: the bytes
 * sent, or -1 with errno set (EINTR retried). */
static ssize_t send_with_fds(int channel, const void *data, size_t n, const int *fds, int nfds, int flags) {
    struct iovec iov = {(void *)data, n};
    union {
        char buf[CMSG_SPACE(FD_PASSING_MAX * sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds > FD_PASSING_MAX) {
        errno = EINVAL;
        return -1;
    }
    if (nfds > 0) {
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    ssize_t sent;
    while ((sent = sendmsg(channel, &msg, flags | MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
    return sent;
}

/* Receive one message from channel into buf[0:cap], and the fds it carries (close-on-exec) into
 * fds[0:max]: *nfds of them, any beyond max closed. The bytes, or -1 with errno set (EINTR
 * retried); *cut is set when the message or its fds did not fit. */
static ssize_t recv_with_fds(int channel, void *buf, size_t cap, int *fds, int max, int *nfds, int *cut) {
    struct iovec iov = {buf, cap};
    union {
        char buf[CMSG_SPACE(FD_PASSING_MAX * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    ssize_t n;
    do {
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        n = recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    *nfds = 0;
    *cut = n >= 0 && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int k = 0; k < got; k++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
            if (*nfds < max)
                fds[(*nfds)++] = fd;
            else {
                close(fd);
                *cut = 1;
            }
        }
    }
    return n;
}

/* Send fd (and the byte tag) over channel: 0 when sent, -1 with errno set (EIO: nothing sent). */
static int send_fd(int channel, int fd, char tag) {
    ssize_t n = send_with_fds(channel, &tag, 1, &fd, 1, 0);
    if (n == 1)
        return 0;
    if (n >= 0)
        errno = EIO;
    return -1;
}

#endif
