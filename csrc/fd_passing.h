/* One fd sent with one tag byte over a unix socket (SCM_RIGHTS): how the egress listener (made in the
 * command's network namespace) reaches the service and the unix guard's notification fd reaches the
 * supervisor. No stdio, no malloc: usable between fork and exec.
 */
#ifndef SMITH_FAST_FD_PASSING_H
#define SMITH_FAST_FD_PASSING_H

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Send fd (and the byte tag) over channel: 0 when sent, -1 with errno set (EIO: nothing sent). */
static int send_fd(int channel, int fd, char tag) {
    struct iovec iov = {&tag, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ssize_t n;
    while ((n = sendmsg(channel, &msg, MSG_NOSIGNAL)) < 0 && errno == EINTR) {}
    if (n == 1)
        return 0;
    if (n >= 0)
        errno = EIO;
    return -1;
}

#endif
